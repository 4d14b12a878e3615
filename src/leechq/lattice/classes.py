"""Permutation classes of the Leech-lattice ball Λ24(M) and their layout (index format v1).

Implements docs/lattice.md §3: a class is a (coset, magnitude multiset) pair of the integer
embedding √8·Λ24. The enumeration loops, the per-shell layout order (shells ascending; even classes of a
shell before its odd classes, each in emission order) and the cardinality formulas are all part of the
file format: the offsets below define the bijective 47/48-bit index (``lattice.indexing``).

Λ24(12) has 301 classes and Λ24(13) 383; because shells ascend, the first 301 classes of the M = 13
table are exactly the M = 12 table with the same offsets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

from leechq.lattice.golay import WEIGHT_COUNTS

MAX_SHELL = 14
"""Largest shell the class enumeration supports (shell sizes are tabulated up to 14)."""


@dataclass(frozen=True)
class LatticeClass:
    """One permutation class of √8·Λ24.

    Attributes:
        number: position in layout order (0-based).
        shell: m, with squared norm 16·m in the integer embedding.
        odd: True for the odd coset (all coordinates odd).
        word_kinds: even classes: ((value, count), ...) of the magnitudes ≡ 2 mod 4, descending value.
        free_kinds: even classes: ((value, count), ...) of the non-zero magnitudes ≡ 0 mod 4, descending.
        n_zero: even classes: number of zero coordinates.
        odd_kinds: odd classes: ((value, count), ...) of all magnitudes, descending value.
        weight: even classes: w, the Golay weight carrying word values (0 for odd classes).
        p_req: even classes: required parity of the number of negative word values.
        size: number of lattice points in the class.
        offset: number of non-origin points in all earlier classes; the class's indices are
            ``1 + offset .. offset + size``.
    """

    number: int
    shell: int
    odd: bool
    word_kinds: tuple[tuple[int, int], ...]
    free_kinds: tuple[tuple[int, int], ...]
    n_zero: int
    odd_kinds: tuple[tuple[int, int], ...]
    weight: int
    p_req: int
    size: int
    offset: int

    @property
    def first_index(self) -> int:
        """Smallest v1 index of this class."""
        return self.offset + 1

    @property
    def last_index(self) -> int:
        """Largest v1 index of this class."""
        return self.offset + self.size

    @property
    def n_free(self) -> int:
        """F: number of non-zero free (≡ 0 mod 4) magnitudes of an even class."""
        return sum(c for _, c in self.free_kinds)

    def magnitudes(self) -> tuple[int, ...]:
        """The 24 magnitudes of the class, sorted descending."""
        kinds = self.odd_kinds if self.odd else (*self.word_kinds, *self.free_kinds, (0, self.n_zero))
        out: list[int] = []
        for value, count in kinds:
            out.extend([value] * count)
        return tuple(sorted(out, reverse=True))

    def levels(self) -> tuple[tuple[int, int], ...]:
        """Distinct magnitudes (zero included when present) as (value, count), sorted by count
        descending then value descending (the order of the fingerprint, docs/lattice.md §5)."""
        counts: dict[int, int] = {}
        for v in self.magnitudes():
            counts[v] = counts.get(v, 0) + 1
        return tuple(sorted(counts.items(), key=lambda vc: (-vc[1], -vc[0])))


def _multinomial(total: int, counts: list[int]) -> int:
    result = math.factorial(total)
    for c in counts:
        result //= math.factorial(c)
    return result


def _even_size(word: list[tuple[int, int]], free: list[tuple[int, int]], w: int, n_zero: int) -> int:
    n_free = sum(c for _, c in free)
    signs_word = 2 ** max(w - 1, 0)
    on = _multinomial(w, [c for _, c in word])
    off = _multinomial(24 - w, [c for _, c in free] + [n_zero])
    return WEIGHT_COUNTS[w] * signs_word * 2**n_free * on * off


def _emit_even(max_shell: int) -> list[dict[str, object]]:
    maxnorm = 16 * max_shell
    out: list[dict[str, object]] = []
    for n14 in range(maxnorm // 196 + 1):
        for n10 in range(maxnorm // 100 + 1):
            for n6 in range(maxnorm // 36 + 1):
                for n2 in range(maxnorm // 4 + 1):
                    w = n14 + n10 + n6 + n2
                    if w > 24 or w not in WEIGHT_COUNTS:
                        continue
                    base = 196 * n14 + 100 * n10 + 36 * n6 + 4 * n2
                    if base > maxnorm:
                        continue
                    for n12 in range((maxnorm - base) // 144 + 1):
                        for n8 in range((maxnorm - base) // 64 + 1):
                            for n4 in range((maxnorm - base) // 16 + 1):
                                norm = base + 144 * n12 + 64 * n8 + 16 * n4
                                if norm > maxnorm or w + n12 + n8 + n4 > 24 or norm % 16:
                                    continue
                                m = norm // 16
                                if not 2 <= m <= max_shell:
                                    continue
                                s0 = 2 * n2 + 6 * n6 + 10 * n10 + 14 * n14 + 4 * n4 + 8 * n8 + 12 * n12
                                p_req = (s0 // 4) % 2
                                if w == 0 and p_req == 1:
                                    continue
                                word = [(v, n) for v, n in ((14, n14), (10, n10), (6, n6), (2, n2)) if n]
                                free = [(v, n) for v, n in ((12, n12), (8, n8), (4, n4)) if n]
                                n_zero = 24 - w - n12 - n8 - n4
                                out.append(
                                    {
                                        "shell": m,
                                        "odd": False,
                                        "word_kinds": tuple(word),
                                        "free_kinds": tuple(free),
                                        "n_zero": n_zero,
                                        "odd_kinds": (),
                                        "weight": w,
                                        "p_req": p_req,
                                        "size": _even_size(word, free, w, n_zero),
                                    }
                                )
    return out


def _emit_odd(max_shell: int) -> list[dict[str, object]]:
    maxnorm = 16 * max_shell
    out: list[dict[str, object]] = []
    for n13 in range(maxnorm // 169 + 1):
        for n11 in range(maxnorm // 121 + 1):
            for n9 in range(maxnorm // 81 + 1):
                for n7 in range(maxnorm // 49 + 1):
                    for n5 in range(maxnorm // 25 + 1):
                        heavy = n13 + n11 + n9 + n7 + n5
                        if heavy > 24:
                            continue
                        hn = 169 * n13 + 121 * n11 + 81 * n9 + 49 * n7 + 25 * n5
                        if hn > maxnorm:
                            continue
                        for n3 in range(24 - heavy + 1):
                            n1 = 24 - heavy - n3
                            norm = hn + 9 * n3 + n1
                            if norm > maxnorm or norm % 16 or not 2 <= norm // 16 <= max_shell:
                                continue
                            if (n1 + n7 + n9) % 2 == 0:
                                continue
                            kinds = tuple(
                                (v, n)
                                for v, n in (
                                    (13, n13), (11, n11), (9, n9), (7, n7), (5, n5), (3, n3), (1, n1)
                                )
                                if n
                            )
                            out.append(
                                {
                                    "shell": norm // 16,
                                    "odd": True,
                                    "word_kinds": (),
                                    "free_kinds": (),
                                    "n_zero": 0,
                                    "odd_kinds": kinds,
                                    "weight": 0,
                                    "p_req": 0,
                                    "size": 4096 * _multinomial(24, [n for _, n in kinds]),
                                }
                            )
    return out


@cache
def class_table(max_shell: int) -> tuple[LatticeClass, ...]:
    """All classes of Λ24(max_shell) in layout order, with offsets.

    Args:
        max_shell: M, 2 ≤ M ≤ 14. The format uses M = 12 (47-bit index) and M = 13 (48-bit index).

    Returns:
        The classes, shells ascending, even before odd within a shell, each in emission order.
    """
    if not 2 <= max_shell <= MAX_SHELL:
        raise ValueError(f"max_shell must be in [2, {MAX_SHELL}], got {max_shell}")
    even = _emit_even(max_shell)
    odd = _emit_odd(max_shell)
    ordered: list[dict[str, object]] = []
    for m in range(2, max_shell + 1):
        ordered.extend(c for c in even if c["shell"] == m)
        ordered.extend(c for c in odd if c["shell"] == m)
    classes: list[LatticeClass] = []
    offset = 0
    for number, c in enumerate(ordered):
        cls = LatticeClass(number=number, offset=offset, **c)  # type: ignore[arg-type]
        classes.append(cls)
        offset += cls.size
    return tuple(classes)


def ball_size(max_shell: int) -> int:
    """N(M): number of non-origin points of Λ24(M)."""
    table = class_table(max_shell)
    return table[-1].offset + table[-1].size


def shell_size(m: int) -> int:
    """|Shell(m)|, the number of lattice points with squared norm 16·m (integer embedding)."""
    return sum(c.size for c in class_table(m) if c.shell == m)


def index_bits(max_shell: int) -> int:
    """⌈log2(N(M)+1)⌉: bits of the v1 index over Λ24(M) (origin included)."""
    return (ball_size(max_shell)).bit_length()
