"""Exact nearest-point search on the Leech ball Λ24(M): the readable reference.

Implements docs/lattice.md §6 in numpy (no torch). Everything works in the integer embedding L
= √8·Λ24 (a point of shell m has squared norm 16·m).

- :func:`search` returns the exact angular argmax ``argmax_{v ∈ Λ24(M) \\ {0}} ⟨x,v⟩/√(16m)`` and
  its score; the all-zero block gives the origin with score 0.
- :func:`shell_maxima` returns the per-shell maxima ``d_m(x) = max_{v ∈ Shell(m)} ⟨x,v⟩`` that the
  spherical-shaping variant needs (docs/lattice.md §6).

How (docs/lattice.md §6). A class (``lattice.classes``) fixes a coset and a magnitude multiset. With
the Golay codeword c fixed as well, the class maximum has a closed form:

- odd class: with ``y_i = x_i`` on c and ``−x_i`` off c, and ``α(a) = +a`` (a ≡ 3 mod 4) or ``−a``
  (a ≡ 1 mod 4), the score is ``Σ α·y``, maximised by pairing the α multiset ascending with y
  ascending;
- even class: word values (descending) go on the support |x| (descending), free values and zeros on
  the off-support |x| (descending), signs follow x; if the number of negative word values then has
  the wrong parity, the smallest word value (already on the smallest support |x|) is flipped,
  costing ``2·w_min·min_support|x|`` (the single-flip repair).

Classes are visited by decreasing support-blind upper bound (class magnitudes paired with the global
|x|, both descending) and the scan stops when no remaining class can reach the incumbent.

Ties (docs/lattice.md §6.3, normative for leechq). The winner is, among the points of maximal score,
the one with the smallest v1 index, scores being ``fl(Σ_{i ascending} fl(x_i·v_i)) / sqrt(16m)`` in
float64 (x widened exactly). The index orders points by class, then codeword rank, then the local
digits (docs/lattice.md §4). So the search keeps every (class, codeword) pair whose closed-form
maximum is within a small tolerance of the best, builds each pair's smallest-index maximiser
(:func:`class_maximizer`: among equal |x| (or equal y) larger magnitudes go to lower coordinates;
zero coordinates take positive signs; a parity repair goes where it lowers the sign digit most),
scores those points with the formula above and keeps the largest score, ties to the smallest (class,
codeword). Equal-score maximisers inside one (class, codeword) pair are compared in exact
arithmetic, which coincides with the float rule whenever the products and partial sums are exact
(always for float32 inputs of moderate range).

Scale. x is first multiplied by an exact power of two so that max|x_i| ∈ [1, 2); reported scores are
scaled back. This is the identity on every score unless the unscaled float64 formula would overflow
or fall into subnormals (only possible for float64 inputs beyond about 1e±290).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np

from leechq.errors import InvalidInput
from leechq.lattice.classes import LatticeClass, class_table
from leechq.lattice.golay import codeword_bits, golay_code

DIM = 24

TIE_TOLERANCE = 2.0**-36
"""Closed-form maxima within ``TIE_TOLERANCE·‖x‖₁`` (after scaling) of the best are re-scored."""


# --------------------------------------------------------------------------------------------------
# Per-class constants
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClassSearchData:
    """What the search needs to know about one class.

    Attributes:
        cls: the class.
        codewords: flat ranks (canonical Golay order) of the admissible codewords: all 4096 for odd
            classes, the γ(w) words of weight w for even classes.
        norm: sqrt(16·m), the Euclidean norm of every point of the class.
        magnitudes: float64 [24], the class magnitudes sorted descending (for the upper bound).
        alpha: odd classes: float64 [24], the signed values α(a) sorted ascending.
        word_values: even classes: float64 [w], word values sorted descending.
        free_values: even classes: float64 [24 − w], free values descending, then zeros.
    """

    cls: LatticeClass
    codewords: np.ndarray
    norm: float
    magnitudes: np.ndarray
    alpha: np.ndarray
    word_values: np.ndarray
    free_values: np.ndarray


def _alpha(a: int) -> int:
    """Signed value of odd magnitude a on a codeword position (docs/lattice.md §3): +a if a ≡ 3 mod
    4, else −a."""
    return a if a % 4 == 3 else -a


def _expand(kinds: tuple[tuple[int, int], ...]) -> list[int]:
    out: list[int] = []
    for value, count in kinds:
        out.extend([value] * count)
    return out


@cache
def search_data(max_shell: int) -> tuple[ClassSearchData, ...]:
    """Per-class search constants of Λ24(max_shell), in layout order (cached)."""
    code = golay_code()
    flat = np.arange(4096)
    out = []
    for cls in class_table(max_shell):
        if cls.odd:
            codewords = flat
            alpha = np.sort(np.array([_alpha(a) for a in _expand(cls.odd_kinds)], dtype=np.float64))
            word_values = free_values = np.zeros(0)
        else:
            codewords = flat[code.weights == cls.weight]
            alpha = np.zeros(0)
            word_values = np.array(_expand(cls.word_kinds), dtype=np.float64)
            free = _expand(cls.free_kinds) + [0] * cls.n_zero
            free_values = np.array(free, dtype=np.float64)
        out.append(
            ClassSearchData(
                cls=cls,
                codewords=codewords,
                norm=math.sqrt(16 * cls.shell),
                magnitudes=np.array(cls.magnitudes(), dtype=np.float64),
                alpha=alpha,
                word_values=word_values,
                free_values=free_values,
            )
        )
    return tuple(out)


@cache
def _codeword_bits() -> np.ndarray:
    """bool [4096, 24]: bit i of every codeword, canonical order."""
    return codeword_bits(golay_code().words).astype(bool)


# --------------------------------------------------------------------------------------------------
# Input handling
# --------------------------------------------------------------------------------------------------


def as_block(x: np.ndarray | list[float], what: str = "x") -> np.ndarray:
    """Validate one block and widen it to float64 [24] (exact for float16/32/64 and small ints)."""
    arr = np.asarray(x)
    if arr.shape != (DIM,):
        raise InvalidInput(f"{what} must have shape (24,), got {arr.shape}")
    if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise InvalidInput(f"{what} must be real numbers, got dtype {arr.dtype}")
    out = arr.astype(np.float64)
    if not np.all(np.isfinite(out)):
        raise InvalidInput(f"{what} contains non-finite values: {arr.tolist()}")
    return out


def power_of_two_exponent(x: np.ndarray) -> int:
    """e such that max|x_i|·2^-e ∈ [1, 2) (x non-zero)."""
    _, e = math.frexp(float(np.max(np.abs(x))))  # max = f·2^e with f ∈ [0.5, 1)
    return e - 1


def reference_score(x: np.ndarray, point: np.ndarray) -> float:
    """The tie-rule score ``fl(Σ_{i ascending} fl(x_i·v_i)) / sqrt(16m)`` (float64,
    docs/lattice.md §6.3).

    Args:
        x: float64 [24].
        point: int [24], a non-zero lattice point.
    """
    total = 0.0
    norm2 = 0
    for xi, vi in zip(x.tolist(), point.tolist(), strict=True):
        total += xi * float(vi)
        norm2 += int(vi) * int(vi)
    return total / math.sqrt(float(norm2))


# --------------------------------------------------------------------------------------------------
# Closed-form maxima per (class, codeword)
# --------------------------------------------------------------------------------------------------


class _Query:
    """Per-query sorted views shared by all classes (computed lazily, once per query)."""

    def __init__(self, x: np.ndarray) -> None:
        self.x = x
        self.ax = np.abs(x)
        self._odd: np.ndarray | None = None
        self._even: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def odd_sorted(self) -> np.ndarray:
        """float64 [4096, 24]: y = ±x (plus on the codeword) sorted ascending, per codeword."""
        if self._odd is None:
            bits = _codeword_bits()
            self._odd = np.sort(np.where(bits, self.x, -self.x), axis=1)
        return self._odd

    def even_sorted(self, weight: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For the codewords of one weight: support |x| descending [γ, w], off-support |x|
        descending [γ, 24 − w], and the parity of negative x on the support [γ]."""
        if weight not in self._even:
            bits = _codeword_bits()[golay_code().weights == weight]
            # Sorting −1 fill values last isolates one side of the partition per codeword.
            support = -np.sort(-np.where(bits, self.ax, -1.0), axis=1)[:, :weight]
            off = -np.sort(-np.where(bits, -1.0, self.ax), axis=1)[:, : DIM - weight]
            parity = (bits & (self.x < 0)).sum(axis=1) % 2
            self._even[weight] = (support, off, parity)
        return self._even[weight]


def _class_maxima(query: _Query, data: ClassSearchData) -> np.ndarray:
    """float64 [#codewords]: max ⟨x, v⟩ over the class with each admissible codeword fixed."""
    cls = data.cls
    if cls.odd:
        return query.odd_sorted() @ data.alpha
    support, off, parity = query.even_sorted(cls.weight)
    score = off @ data.free_values
    if cls.weight:
        score = score + support @ data.word_values
        repair = 2.0 * data.word_values[-1] * support[:, -1]
        score = score - np.where(parity != cls.p_req, repair, 0.0)
    return score


def class_codeword_maxima(x: np.ndarray, cls: LatticeClass) -> np.ndarray:
    """Closed-form ``max ⟨x, v⟩`` over one class for each of its codewords (docs/lattice.md §6).

    Args:
        x: float [24].
        cls: a class of Λ24(13) (its shell decides nothing here).

    Returns:
        float64 [γ]: one maximum per admissible codeword, codewords in canonical order (all 4096 for
        an odd class; the words of weight w for an even class).
    """
    data = search_data(13)[cls.number] if cls.shell <= 13 else None
    if data is None or data.cls != cls:
        raise InvalidInput(f"class {cls} is not a class of Λ24(13)")
    return _class_maxima(_Query(as_block(x)), data)


def shell_maxima(x: np.ndarray, max_shell: int = 13) -> np.ndarray:
    """Per-shell maxima ``d_m(x) = max_{v ∈ Shell(m)} ⟨x, v⟩`` for m = 2..max_shell (
    docs/lattice.md §6).

    Args:
        x: float [24] (any scale; the zero vector gives zeros).
        max_shell: M, 2..14.

    Returns:
        float64 [M − 1]; entry k is d_{k+2}(x), in integer-embedding units (‖v‖² = 16m).
    """
    xb = as_block(x)
    query = _Query(xb)
    out = np.full(max_shell - 1, -np.inf)
    for data in search_data(max_shell):
        k = data.cls.shell - 2
        out[k] = max(out[k], float(_class_maxima(query, data).max()))
    return out


def spherical_error(x: np.ndarray, beta: float, max_shell: int = 13) -> float:
    """Squared error of the spherical-shaping code β·(Λ24(M) ∪ {0}) (docs/lattice.md §6), from the
    shell maxima.

    Args:
        x: float [24].
        beta: the global scale β > 0; the reconstruction of a point v (integer embedding) is β·v.
        max_shell: M.

    Returns:
        ``min(‖x‖², min_m ‖x‖² + 16mβ² − 2β·d_m(x))``.
    """
    xb = as_block(x)
    norm2 = float(xb @ xb)
    d = shell_maxima(xb, max_shell)
    shells = np.arange(2, max_shell + 1, dtype=np.float64)
    return float(min(norm2, np.min(norm2 + 16.0 * shells * beta * beta - 2.0 * beta * d)))


# --------------------------------------------------------------------------------------------------
# The smallest-index maximiser of one (class, codeword) pair
# --------------------------------------------------------------------------------------------------


def class_maximizer(x: np.ndarray, cls: LatticeClass, codeword_rank: int) -> np.ndarray:
    """The point of smallest v1 index among the maximisers of ⟨x, v⟩ in one (class, codeword) pair.

    Args:
        x: float [24].
        cls: the class.
        codeword_rank: flat rank (canonical order) of the codeword; for an even class it must have
            the class's Golay weight.

    Returns:
        int32 [24], a point of the class (natural coordinate order, integer embedding).
    """
    xb = as_block(x)
    word = int(golay_code().words[codeword_rank])
    on = [(word >> i) & 1 == 1 for i in range(DIM)]
    point = np.zeros(DIM, dtype=np.int64)
    if cls.odd:
        _place_odd(xb, cls, on, point)
    else:
        if sum(on) != cls.weight:
            raise InvalidInput(
                f"codeword rank {codeword_rank} has weight {sum(on)}, class needs {cls.weight}"
            )
        _place_even(xb, cls, on, point)
    return point.astype(np.int32)


def _place_odd(x: np.ndarray, cls: LatticeClass, on: list[bool], point: np.ndarray) -> None:
    y = [x[i] if on[i] else -x[i] for i in range(DIM)]
    order = sorted(range(DIM), key=lambda i: (y[i], i))  # y ascending, ties by coordinate
    alphas = sorted(_alpha(a) for a in _expand(cls.odd_kinds))  # paired with y ascending
    # Equal y values may share their α values freely; the smallest index puts the larger magnitudes
    # on the lower coordinates (kinds are ranked by descending magnitude, docs/lattice.md §4).
    start = 0
    while start < DIM:
        stop = start
        while stop < DIM and y[order[stop]] == y[order[start]]:
            stop += 1
        group = sorted(alphas[start:stop], key=lambda a: -abs(a))
        for slot, alpha in zip(order[start:stop], group, strict=True):
            point[slot] = alpha if on[slot] else -alpha  # v_i = ε_i·α, ε = +1 on the codeword
        start = stop


def _place_even(x: np.ndarray, cls: LatticeClass, on: list[bool], point: np.ndarray) -> None:
    ax = np.abs(x)
    order = sorted(range(DIM), key=lambda i: (-ax[i], i))  # |x| descending, ties by coordinate
    support = [i for i in order if on[i]]
    off = [i for i in order if not on[i]]
    words = _expand(cls.word_kinds)
    frees = _expand(cls.free_kinds) + [0] * cls.n_zero
    for i, value in zip(support, words, strict=True):
        point[i] = -value if x[i] < 0 else value  # a zero coordinate takes the positive sign
    for i, value in zip(off, frees, strict=True):
        point[i] = -value if x[i] < 0 else value
    if not support:
        return
    negatives = sum(1 for i in support if point[i] < 0)
    if negatives % 2 == cls.p_req:
        return
    point[_repair_position(x, point, sorted(support))] *= -1


def _repair_position(x: np.ndarray, point: np.ndarray, support: list[int]) -> int:
    """The support position whose sign flip fixes the parity at least cost and smallest sign digit.

    ``support`` is ascending. The sign digit r_sw stores bit j = (j-th support position negative)
    for all but the last position, so flipping a negative non-last position lowers it by 2^j,
    flipping the last leaves it unchanged and flipping a positive one raises it by 2^j.
    """
    zeros = [i for i in support if x[i] == 0.0]
    if zeros:  # flipping a value at x_i = 0 is free
        return support[-1] if support[-1] in zeros else zeros[0]
    costs = {i: abs(int(point[i])) * abs(float(x[i])) for i in support}
    least = min(costs.values())
    cheapest = [i for i in support if costs[i] == least]
    negative = [i for i in cheapest if x[i] < 0 and i != support[-1]]
    if negative:
        return negative[-1]
    if support[-1] in cheapest:
        return support[-1]
    return cheapest[0]


# --------------------------------------------------------------------------------------------------
# The search
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SearchResult:
    """Winner of :func:`search_detailed`.

    Attributes:
        point: int32 [24], the winning lattice point (zeros for a zero block).
        score: float64, its tie-rule score ⟨x, v⟩/‖v‖ (0 for a zero block).
        class_number: layout number of its class (−1 for a zero block).
        codeword_rank: flat rank of its Golay codeword (−1 for a zero block).
        candidates: number of (class, codeword) pairs that were re-scored (1 unless near-ties).
        classes_evaluated: number of classes whose closed forms were evaluated (pruning statistic).
    """

    point: np.ndarray
    score: float
    class_number: int
    codeword_rank: int
    candidates: int
    classes_evaluated: int


def _check_max_shell(max_shell: int) -> None:
    if not 2 <= max_shell <= 13:
        raise InvalidInput(f"max_shell must be in [2, 13], got {max_shell}")


def search_detailed(x: np.ndarray, max_shell: int = 12) -> SearchResult:
    """Exact angular search with its diagnostics; see :func:`search`."""
    _check_max_shell(max_shell)
    xb = as_block(x)
    if not np.any(xb):
        return SearchResult(np.zeros(DIM, dtype=np.int32), 0.0, -1, -1, 0, 0)
    exponent = power_of_two_exponent(xb)
    xs = np.ldexp(xb, -exponent)
    tolerance = TIE_TOLERANCE * float(np.abs(xs).sum())
    query = _Query(xs)
    table = search_data(max_shell)
    ax_desc = np.sort(np.abs(xs))[::-1]
    bounds = np.array([d.magnitudes @ ax_desc / d.norm for d in table])

    best = -np.inf
    kept: list[tuple[int, np.ndarray, np.ndarray]] = []  # (class, codeword ranks, scores)
    evaluated = 0
    for k in np.argsort(-bounds, kind="stable"):
        if bounds[k] < best - tolerance:
            break  # no remaining class can reach the incumbent
        data = table[k]
        scores = _class_maxima(query, data) / data.norm
        evaluated += 1
        best = max(best, float(scores.max()))
        near = scores >= best - tolerance
        if near.any():
            kept.append((int(k), data.codewords[near], scores[near]))

    candidates: list[tuple[float, int, int, np.ndarray]] = []
    for k, ranks, scores in kept:
        for rank in ranks[scores >= best - tolerance]:
            point = class_maximizer(xs, table[k].cls, int(rank))
            candidates.append((reference_score(xs, point), k, int(rank), point))
    # Largest float score; ties to the smallest index = smallest (class, codeword rank).
    score, k, rank, point = min(candidates, key=lambda c: (-c[0], c[1], c[2]))
    return SearchResult(
        point=point,
        score=float(np.ldexp(score, exponent)),
        class_number=k,
        codeword_rank=rank,
        candidates=len(candidates),
        classes_evaluated=evaluated,
    )


def search(x: np.ndarray, max_shell: int = 12) -> tuple[np.ndarray, float]:
    """Exact angular nearest point of one block on the ball Λ24(max_shell) (docs/lattice.md
    §6, ties §6.3).

    Args:
        x: float [24] (any real dtype, any scale; finite).
        max_shell: M, 2..13 (12 for the shipped 47-bit code, 13 for the 48-bit ball).

    Returns:
        (point, score): the int32 [24] point of Λ24(M) \\ {0} maximising ⟨x,v⟩/‖v‖ under the tie
        rule of the module docstring, and that float64 score. A zero block gives (zeros, 0.0).

    Raises:
        InvalidInput: wrong shape, non-real dtype or non-finite values; max_shell outside [2, 13].
    """
    result = search_detailed(x, max_shell)
    return result.point, result.score
