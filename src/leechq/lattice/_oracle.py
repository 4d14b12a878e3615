"""Slow, obviously correct brute-force helpers for tests and benchmarks only (never the fast path).

- :func:`shell2_points`: the 196 560 minimal vectors of √8·Λ24, built straight from the membership
  rule of docs/lattice.md §2.1 (codewords, parities, sums), without the index;
- :func:`shell_points`: every point of Shell(m), by decoding its index range in chunks (the brief of
  docs/lattice.md §6: Shell(3) has 16 773 120 points);
- :func:`lex_arrangements`, :func:`naive_rank`: lexicographic multiset permutations by plain
  recursion (and, for tiny cases, by sorting ``itertools.permutations``);
- :func:`naive_class_points`: all points of one class in v1 index order, composed digit by digit
  with ``itertools.product`` in the order docs/lattice.md §4 prescribes (feasible for small classes
  only).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from functools import cache

import numpy as np

from leechq.lattice.classes import LatticeClass, class_table
from leechq.lattice.golay import golay_code
from leechq.lattice.indexing import FORMAT_MAX_SHELL, decode_indices
from leechq.lattice.leech import DIM


@cache
def shell2_points() -> np.ndarray:
    """All 196 560 points of Shell(2) (‖x‖² = 32), int32 [196560, 24], rows sorted ascending.

    Cached and read-only.

    Built from the three shapes of docs/lattice.md §2.2, each derived from the membership rule:
    (±4)^2 anywhere (1 104); (±2)^8 on an octad with an even number of minus signs (97 152);
    (±3, ±1^23): for each codeword c and position i, every coordinate ≡ 3 (mod 4) exactly on c
    (98 304).
    """
    rows: list[list[int]] = []
    for i, j in itertools.combinations(range(DIM), 2):
        for si, sj in itertools.product((4, -4), repeat=2):
            x = [0] * DIM
            x[i], x[j] = si, sj
            rows.append(x)
    code = golay_code()
    for octad in code.words_of_weight(8).tolist():
        support = [k for k in range(DIM) if octad >> k & 1]
        for signs in itertools.product((2, -2), repeat=8):
            if sum(s < 0 for s in signs) % 2:
                continue  # an odd number of −2 breaks the sum rule (Σ ≡ 4 mod 8)
            x = [0] * DIM
            for k, s in zip(support, signs):
                x[k] = s
            rows.append(x)
    for word in code.words.tolist():
        for i in range(DIM):
            # In the odd coset the values ≡ 3 (mod 4) sit exactly on the codeword: 3 or −1 on it,
            # 1 or −3 off it. Magnitude 3 at position i, 1 elsewhere.
            x = [(-1 if word >> k & 1 else 1) for k in range(DIM)]
            x[i] = 3 if word >> i & 1 else -3
            rows.append(x)
    points = np.array(rows, dtype=np.int32)
    points = points[np.lexsort(points.T[::-1])]
    points.setflags(write=False)
    return points


def shell_points(m: int, chunk: int = 1 << 20) -> Iterator[np.ndarray]:
    """Every point of Shell(m), m = 2..13, as int32 chunks [≤ chunk, 24], in index order."""
    table = class_table(FORMAT_MAX_SHELL)
    on_shell = [c for c in table if c.shell == m]
    if not on_shell:
        raise ValueError(f"no classes on shell {m}")
    first, last = on_shell[0].first_index, on_shell[-1].last_index
    for start in range(first, last + 1, chunk):
        stop = min(start + chunk, last + 1)
        yield decode_indices(np.arange(start, stop, dtype=np.int64))


def lex_arrangements(counts: Sequence[int]) -> Iterator[tuple[int, ...]]:
    """All kind sequences with the given counts, in lexicographic order (kind 0 smallest)."""
    left = list(counts)
    n = sum(left)
    prefix: list[int] = []

    def walk() -> Iterator[tuple[int, ...]]:
        if len(prefix) == n:
            yield tuple(prefix)
            return
        for kind in range(len(left)):
            if left[kind]:
                left[kind] -= 1
                prefix.append(kind)
                yield from walk()
                prefix.pop()
                left[kind] += 1

    yield from walk()


def itertools_arrangements(counts: Sequence[int]) -> list[tuple[int, ...]]:
    """Same as :func:`lex_arrangements` via ``sorted(set(permutations))`` (tiny cases only)."""
    items = [kind for kind, count in enumerate(counts) for _ in range(count)]
    if len(items) > 9:
        raise ValueError("itertools_arrangements is for at most 9 slots")
    return sorted(set(itertools.permutations(items)))


def naive_rank(sequence: Sequence[int], counts: Sequence[int]) -> int:
    """Position of ``sequence`` in :func:`lex_arrangements` (linear scan)."""
    target = tuple(sequence)
    for rank, candidate in enumerate(lex_arrangements(counts)):
        if candidate == target:
            return rank
    raise ValueError(f"{sequence} is not an arrangement of {list(counts)}")


_Ints = tuple[int, ...]


def _kinds(cls: LatticeClass) -> tuple[_Ints, _Ints, _Ints, _Ints]:
    if cls.odd:
        return (
            tuple(v for v, _ in cls.odd_kinds),
            tuple(c for _, c in cls.odd_kinds),
            (),
            (),
        )
    off = (*cls.free_kinds, (0, cls.n_zero))
    return (
        tuple(v for v, _ in cls.word_kinds),
        tuple(c for _, c in cls.word_kinds),
        tuple(v for v, _ in off),
        tuple(c for _, c in off),
    )


def naive_class_points(cls: LatticeClass, limit: int = 2_000_000) -> np.ndarray:
    """All points of one class in v1 index order, int32 [|C|, 24] (small classes only).

    Composes the digits of docs/lattice.md §4 most significant first with ``itertools.product``:
    codeword rank, on arrangement, off arrangement, support signs (all but the last; the last one
    restores the parity p_req), non-zero off-support signs. Odd classes: codeword rank, arrangement;
    the signs follow from the codeword (a value ≡ 3 mod 4 exactly on it).
    """
    if cls.size > limit:
        raise ValueError(f"class {cls.number} has {cls.size} points, more than limit={limit}")
    code = golay_code()
    on_values, on_counts, off_values, off_counts = _kinds(cls)
    rows: list[list[int]] = []
    if cls.odd:
        arrangements = list(lex_arrangements(on_counts))
        for word in code.words.tolist():
            for kinds in arrangements:
                x = []
                for k, kind in enumerate(kinds):
                    a = on_values[kind]
                    on_word = bool(word >> k & 1)
                    # the signed value is ≡ 3 (mod 4) iff the position is on the codeword
                    x.append(a if (a % 4 == 3) == on_word else -a)
                rows.append(x)
        return np.array(rows, dtype=np.int32)
    w = cls.weight
    on_list = list(lex_arrangements(on_counts))
    off_list = list(lex_arrangements(off_counts))
    n_free = cls.n_free
    for word in code.words_of_weight(w).tolist():
        support = [k for k in range(DIM) if word >> k & 1]
        off_support = [k for k in range(DIM) if not word >> k & 1]
        for on_kinds, off_kinds, sw, sf in itertools.product(
            on_list, off_list, range(1 << max(w - 1, 0)), range(1 << n_free)
        ):
            x = [0] * DIM
            negatives = 0
            for j, (pos, kind) in enumerate(zip(support, on_kinds)):
                negative = (sw >> j & 1) if j < w - 1 else (negatives + cls.p_req) % 2
                negatives += negative
                x[pos] = -on_values[kind] if negative else on_values[kind]
            t = 0
            for pos, kind in zip(off_support, off_kinds):
                value = off_values[kind]
                if value:
                    x[pos] = -value if sf >> t & 1 else value
                    t += 1
            rows.append(x)
    return np.array(rows, dtype=np.int32)
