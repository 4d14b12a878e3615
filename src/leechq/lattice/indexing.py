"""The bijective v1 index of the Leech ball Λ24(M): lattice point <-> integer in 0..N(M).

Implements docs/lattice.md §4 (format v1, pinned by the fingerprint of docs/lattice.md §5):

- index 0 is the origin; a non-zero point of class C (``lattice.classes``) has index
  ``1 + offset(C) + local`` with ``0 <= local < |C|``;
- ``local`` is a mixed-radix number, most significant digit first:
  even class of Golay weight w: ``(((g·A_on + r_on)·A_off + r_off)·S_w + r_sw)·S_f + r_sf``;
  odd class: ``flat_rank(c)·A + r_arr``;
- r_on, r_off, r_arr are lexicographic multiset-permutation ranks (docs/lattice.md §4) of the
magnitude kinds
  over the codeword's support positions (word kinds by descending value), the off-support positions
  (free kinds by descending value, zero last) and all 24 positions (odd kinds by descending value),
  each in ascending coordinate order;
- r_sw holds the signs of the first w−1 support positions (the last one is fixed by the parity
  rule), r_sf the signs of the non-zero off-support positions.

Two implementations with the same results:

- scalar reference, Python ints, written to be read: :func:`encode_point`, :func:`decode_index`;
- vectorized numpy, for millions of labels: :func:`encode_points`, :func:`decode_indices`. The class
  is found by ``searchsorted`` over class ends, the digits are peeled in int64, and the arrangement
  (un)rank runs slot by slot over all rows at once with the incremental multinomial recurrence of
  docs/lattice.md §4 (``M_j = M·c_j / n_left``) in float64, which is exact here (every class has ≤
  5.4e9 arrangements, so all products stay integers < 2^53); the per-row kind counts are packed in
  one int64 and the kind of a slot is found for all kinds at once with a SWAR compare (see the
  comment above ``_FIELDS``). Codewords come by rank from the canonical table. Rows go in chunks of
  2^13 to stay in cache; there is no Python loop over rows.

Speed: see :data:`SPEED_NOTE`; measure again with ``OMP_NUM_THREADS=1 python -c
"from leechq.lattice.indexing import _benchmark; print(_benchmark())"``.
"""

from __future__ import annotations

import bisect
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

from leechq.errors import InvalidInput, NotInCodebook
from leechq.lattice.classes import LatticeClass, ball_size, class_table
from leechq.lattice.golay import WEIGHT_COUNTS, golay_code
from leechq.lattice.leech import DIM, as_int_point, golay_word, shell_of

FORMAT_MAX_SHELL = 13
"""Largest shell of index format v1 (48-bit index); the shipped ball uses 12 (47 bits)."""

SPEED_NOTE = (
    "decode_indices ≈ 1.1 M labels/s and encode_points ≈ 0.85 M labels/s of CPU time on one core "
    "(2^21 uniform labels over Λ24(12), best of 3; x86-64 2-core dev box, numpy 2.4, measured "
    "2026-11-29 while the box ran at load ≈ 10, so an idle core is faster)"
)
"""Measured throughput of the vectorized paths (by hand, from :func:`_benchmark`)."""

_CHUNK = 1 << 13


# --------------------------------------------------------------------------------------------------
# Shared primitive: lexicographic multiset-permutation rank (docs/lattice.md §4), exact with Python
# ints
# --------------------------------------------------------------------------------------------------


def multinomial(counts: Sequence[int]) -> int:
    """(Σ c)! / Π c! for non-negative counts, exactly."""
    result = math.factorial(sum(counts))
    for c in counts:
        result //= math.factorial(c)
    return result


def multiset_rank(sequence: Sequence[int], counts: Sequence[int]) -> int:
    """Lexicographic rank of a kind sequence among all arrangements of the multiset (
    docs/lattice.md §4).

    Args:
        sequence: kind index per slot (kind 0 orders first), length Σ counts.
        counts: number of slots of each kind.

    Returns:
        The rank, in ``0 .. multinomial(counts) - 1``.

    Raises:
        InvalidInput: the sequence does not use exactly ``counts`` of each kind.
    """
    left = list(counts)
    n_left = sum(left)
    if len(sequence) != n_left:
        raise InvalidInput(f"sequence has {len(sequence)} slots, counts sum to {n_left}")
    arrangements = multinomial(left)  # M: arrangements of the slots still to fill
    rank = 0
    for kind in sequence:
        if not 0 <= kind < len(left) or left[kind] == 0:
            raise InvalidInput(f"kind {kind} used more often than counts {list(counts)} allow")
        # Arrangements starting with a smaller kind j come first: M·c_j/n_left of them each.
        rank += sum(arrangements * left[j] // n_left for j in range(kind))
        arrangements = arrangements * left[kind] // n_left
        left[kind] -= 1
        n_left -= 1
    return rank


def multiset_unrank(rank: int, counts: Sequence[int]) -> list[int]:
    """Inverse of :func:`multiset_rank`: the kind sequence of a given rank.

    Raises:
        InvalidInput: rank outside ``0 .. multinomial(counts) - 1``.
    """
    left = list(counts)
    n_left = sum(left)
    arrangements = multinomial(left)
    if not 0 <= rank < arrangements:
        raise InvalidInput(f"rank {rank} outside [0, {arrangements}) for counts {list(counts)}")
    sequence: list[int] = []
    for _ in range(n_left):
        for kind, count in enumerate(left):
            if count == 0:
                continue
            block = arrangements * count // n_left  # arrangements that put `kind` in this slot
            if rank < block:
                sequence.append(kind)
                arrangements = block
                left[kind] -= 1
                n_left -= 1
                break
            rank -= block
    return sequence


# --------------------------------------------------------------------------------------------------
# Per-class arrangement problems
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClassLayout:
    """The digits of one class's local rank (docs/lattice.md §4).

    Attributes:
        cls: the class.
        on_values: magnitudes of the on-support kinds (even: word kinds descending; odd: all kinds
            descending over the 24 positions).
        on_counts: their counts.
        off_values: even: free kinds descending then 0; odd: empty.
        off_counts: their counts.
        n_codewords: γ(w) for even classes, 4096 for odd classes (radix of g).
        a_on: arrangements of the on problem (A_on, or A for odd).
        a_off: arrangements of the off problem (1 for odd).
        sign_word_bits: w − 1 for even classes with w > 0, else 0 (S_w = 2^this).
        sign_free_bits: F, the non-zero free count (S_f = 2^F); 0 for odd.
    """

    cls: LatticeClass
    on_values: tuple[int, ...]
    on_counts: tuple[int, ...]
    off_values: tuple[int, ...]
    off_counts: tuple[int, ...]
    n_codewords: int
    a_on: int
    a_off: int
    sign_word_bits: int
    sign_free_bits: int


def _layout(cls: LatticeClass) -> ClassLayout:
    if cls.odd:
        on = cls.odd_kinds
        off: tuple[tuple[int, int], ...] = ()
        n_codewords, sw, sf = 4096, 0, 0
    else:
        on = cls.word_kinds
        off = (*cls.free_kinds, (0, cls.n_zero))
        n_codewords = WEIGHT_COUNTS[cls.weight]
        sw, sf = max(cls.weight - 1, 0), cls.n_free
    on_counts = tuple(c for _, c in on)
    off_counts = tuple(c for _, c in off)
    return ClassLayout(
        cls=cls,
        on_values=tuple(v for v, _ in on),
        on_counts=on_counts,
        off_values=tuple(v for v, _ in off),
        off_counts=off_counts,
        n_codewords=n_codewords,
        a_on=multinomial(on_counts),
        a_off=multinomial(off_counts),
        sign_word_bits=sw,
        sign_free_bits=sf,
    )


@cache
def class_layouts() -> tuple[ClassLayout, ...]:
    """Layouts of the 383 classes of Λ24(13) in layout order (Λ24(12): the first 301)."""
    return tuple(_layout(c) for c in class_table(FORMAT_MAX_SHELL))


@cache
def _class_ends() -> list[int]:
    return [c.last_index for c in class_table(FORMAT_MAX_SHELL)]  # = offset + size


@cache
def _class_by_multiset() -> dict[tuple[bool, tuple[int, ...]], ClassLayout]:
    return {(lay.cls.odd, lay.cls.magnitudes()): lay for lay in class_layouts()}


def _check_max_shell(max_shell: int) -> int:
    max_shell = operator.index(max_shell)
    if not 2 <= max_shell <= FORMAT_MAX_SHELL:
        raise InvalidInput(f"max_shell must be in [2, {FORMAT_MAX_SHELL}], got {max_shell}")
    return max_shell


# --------------------------------------------------------------------------------------------------
# Scalar reference
# --------------------------------------------------------------------------------------------------


def encode_point(point: Sequence[int] | np.ndarray, max_shell: int = FORMAT_MAX_SHELL) -> int:
    """The v1 index of one point of Λ24(max_shell) (scalar reference, Python ints).

    Args:
        point: 24 integers, a point of √8·Λ24 in the integer embedding.
        max_shell: M; the point must satisfy ‖x‖² ≤ 16·M. The index does not depend on M.

    Returns:
        The index in ``0 .. N(M)`` (0 for the origin).

    Raises:
        NotInCodebook: not a lattice member, or outside the ball Λ24(M).
        InvalidInput: not 24 integers, or max_shell outside [2, 13].
    """
    max_shell = _check_max_shell(max_shell)
    coords = as_int_point(point)
    if not any(coords):
        return 0
    shell = shell_of(coords)  # raises NotInCodebook for non-members
    if shell > max_shell:
        raise NotInCodebook(
            f"point {coords} lies on shell {shell}, outside the ball Λ24({max_shell})"
        )
    odd = bool(coords[0] % 2)
    magnitudes = tuple(sorted((abs(v) for v in coords), reverse=True))
    layout = _class_by_multiset().get((odd, magnitudes))
    if layout is None:  # cannot happen for a member of the ball: the class table is complete
        raise NotInCodebook(f"point {coords} matches no class of Λ24({max_shell})")
    code = golay_code()
    word = golay_word(coords)
    if odd:
        kind_of = {v: k for k, v in enumerate(layout.on_values)}
        r_arr = multiset_rank([kind_of[abs(v)] for v in coords], layout.on_counts)
        local = code.flat_rank(word) * layout.a_on + r_arr
    else:
        support = [i for i in range(DIM) if word >> i & 1]
        off_support = [i for i in range(DIM) if not word >> i & 1]
        on_kind = {v: k for k, v in enumerate(layout.on_values)}
        off_kind = {v: k for k, v in enumerate(layout.off_values)}
        r_on = multiset_rank([on_kind[abs(coords[i])] for i in support], layout.on_counts)
        r_off = multiset_rank([off_kind[abs(coords[i])] for i in off_support], layout.off_counts)
        # Signs of all support positions but the last (which the parity rule fixes).
        r_sw = sum(1 << j for j, i in enumerate(support[:-1]) if coords[i] < 0)
        nonzero_off = [i for i in off_support if coords[i] != 0]
        r_sf = sum(1 << j for j, i in enumerate(nonzero_off) if coords[i] < 0)
        g = code.rank_in_weight(word)
        local = g * layout.a_on + r_on
        local = local * layout.a_off + r_off
        local = (local << layout.sign_word_bits) + r_sw
        local = (local << layout.sign_free_bits) + r_sf
    return 1 + layout.cls.offset + local


def _check_index(index: int, max_shell: int) -> int:
    try:
        value = operator.index(index)
    except TypeError:
        raise InvalidInput(f"index must be an integer, got {index!r}") from None
    limit = ball_size(max_shell)
    if not 0 <= value <= limit:
        raise InvalidInput(
            f"index {value} outside the v1 range [0, {limit}] of Λ24({max_shell})"
        )
    return value


def decode_index(index: int, max_shell: int = FORMAT_MAX_SHELL) -> np.ndarray:
    """The point of Λ24(max_shell) with a given v1 index (scalar reference, Python ints).

    Args:
        index: an integer in ``0 .. N(max_shell)``.
        max_shell: M, 2..13; decides only the valid range (the map itself is the same for all M).

    Returns:
        int32 [24], the point in the integer embedding √8·Λ24 (natural coordinate order).

    Raises:
        InvalidInput: index not an integer or outside the range.
    """
    max_shell = _check_max_shell(max_shell)
    idx = _check_index(index, max_shell)
    coords = [0] * DIM
    if idx == 0:
        return np.zeros(DIM, dtype=np.int32)
    i = idx - 1
    number = bisect.bisect_right(_class_ends(), i)  # first class whose end exceeds i
    layout = class_layouts()[number]
    local = i - layout.cls.offset
    code = golay_code()
    if layout.cls.odd:
        g, r_arr = divmod(local, layout.a_on)
        word = int(code.words[g])
        kinds = multiset_unrank(r_arr, layout.on_counts)
        for pos, kind in enumerate(kinds):
            magnitude = layout.on_values[kind]
            # +a iff (pos in the codeword) XOR (a ≡ 1 mod 4); otherwise −a (docs/lattice.md §3, §4).
            positive = bool(word >> pos & 1) != (magnitude % 4 == 1)
            coords[pos] = magnitude if positive else -magnitude
    else:
        cls = layout.cls
        r_sf = local & ((1 << layout.sign_free_bits) - 1)
        local >>= layout.sign_free_bits
        r_sw = local & ((1 << layout.sign_word_bits) - 1)
        local >>= layout.sign_word_bits
        local, r_off = divmod(local, layout.a_off)
        g, r_on = divmod(local, layout.a_on)
        word = code.word_of_weight(cls.weight, g)
        support = [p for p in range(DIM) if word >> p & 1]
        off_support = [p for p in range(DIM) if not word >> p & 1]
        negatives = 0
        for j, (pos, kind) in enumerate(zip(support, multiset_unrank(r_on, layout.on_counts))):
            if j < len(support) - 1:
                negative = r_sw >> j & 1
                negatives += negative
            else:  # the last support sign makes the count of negative word values ≡ p_req
                negative = (negatives + cls.p_req) & 1
            magnitude = layout.on_values[kind]
            coords[pos] = -magnitude if negative else magnitude
        t = 0
        for pos, kind in zip(off_support, multiset_unrank(r_off, layout.off_counts)):
            magnitude = layout.off_values[kind]
            if magnitude:
                coords[pos] = -magnitude if r_sf >> t & 1 else magnitude
                t += 1
    return np.array(coords, dtype=np.int32)


# --------------------------------------------------------------------------------------------------
# Vectorized numpy twins
# --------------------------------------------------------------------------------------------------
#
# Both arrangement problems of a class run as ONE problem over 24 slots: the on kinds followed by
# the off kinds, with the on problem's slots first. Its rank r_on·A_off + r_off is a lexicographic
# rank in which slots 0..n_on−1 may only hold on kinds and the rest only off kinds, so the
# recurrence is the usual one with M = (on arrangements left)·A_off, divided by the slots left *of
# the current problem* (n_on − s, then 24 − s). When the on kinds run out, M is exactly A_off and
# the rank exactly r_off, so nothing but the divisor changes at the switch.
#
# Per-row state packed in int64 so that a slot costs only [n]-wide numpy operations:
# - counts: 6-bit fields, each biased by +31: field 0 holds 0, field k+1 holds C_k, the cumulative
#   count of unplaced kinds 0..k (fields past the last kind repeat the total: never chosen).
# - Slot s holds kind j iff M·C_{j−1}/n ≤ r < M·C_j/n, i.e. j = #{k : C_k ≤ q} with q = ⌊r·n/M⌋.
#   q is exact in float64: r·n < 2^53, r·n/M < 24 and M < 2^33, so a non-integer quotient lies
#   ≥ 2^−33 from an integer, far above the rounding error. Subtracting q from the biased fields 1..5
#   leaves bit 5 of a field set iff C_k > q, with no borrow between fields (SWAR), so
#   j = 5 − popcount, and those same guard bits >> 5 are exactly the decrements of C_k for k ≥ j.
# - The kind is carried as code = 5 − j (the popcount); tables are indexed by it.

_FIELDS = 6  # field 0 + up to 5 kinds (the most any class has, on and off together)
_ONES = sum(1 << (6 * k) for k in range(1, _FIELDS))  # 1 in fields 1..5
_GUARD = _ONES << 5
_SHIFT = np.array([6 * (_FIELDS - 1 - code) for code in range(_FIELDS)], dtype=np.int64)
_SUBTRACT = np.array(  # C_k −= 1 for every k ≥ j after placing kind j = 5 − code
    [sum(1 << (6 * (k + 1)) for k in range(_FIELDS - 1 - code, _FIELDS - 1)) for code in range(6)],
    dtype=np.int64,
)
_PAIR = np.arange(4096, dtype=np.int64)  # two adjacent biased fields (C_{j−1}, C_j)
_BEFORE = ((_PAIR & 63) - 31).astype(np.float64)  # C_{j−1}
_COUNT = ((_PAIR >> 6) - (_PAIR & 63)).astype(np.float64)  # c_j = C_j − C_{j−1}
_KEY_RADIX = 25  # multiset key digit: a count ≤ 24
_NO_ZERO = 255


@dataclass(frozen=True)
class _Tables:
    """Flat per-class arrays for the vectorized paths."""

    ends: np.ndarray  # int64 [C]: offset + size (searchsorted key for i = idx − 1)
    offsets: np.ndarray  # int64 [C]
    odd: np.ndarray  # bool [C]
    n_on: np.ndarray  # int64 [C]: slots of the on problem (w, or 24 for odd classes)
    sign_free_bits: np.ndarray  # int64 [C]: F
    sign_word_bits: np.ndarray  # int64 [C]: max(w − 1, 0)
    arrangements: np.ndarray  # int64 [C]: A_on·A_off (A for odd classes)
    word_base: np.ndarray  # int64 [C]: flat rank of the first codeword of weight w (0 for odd)
    p_req: np.ndarray  # int64 [C]
    counts: np.ndarray  # int64 [C]: packed biased cumulative counts (see above)
    zero_code: np.ndarray  # uint8 [C]: code of the zero kind (255: none)
    signed_value: np.ndarray  # int8 [C·16]: at 16·class + 2·code + bit: ±magnitude (see decode)
    code_of: np.ndarray  # int64 [C·16]: at 16·class + magnitude: its kind code
    class_keys: np.ndarray  # float64 [C] sorted multiset keys (see _multiset_key)
    class_of_key: np.ndarray  # int64 [C]: class number of each sorted key
    words: np.ndarray  # int64 [4096] canonical order
    flat_of_low: np.ndarray  # int64 [4096]: flat rank of the codeword with these low 12 bits
    position_slot: np.ndarray  # int64 [4097, 24]: slot of each position; row 4096 = identity
    slot_position_t: np.ndarray  # int64 [24, 4097]: position of slot s of codeword row f at [s, f]
    key_weight: np.ndarray  # float64 [16]: 25^(v // 2), the multiset key weight of magnitude v


def _multiset_key(odd: bool, magnitudes: Sequence[int]) -> int:
    # Magnitude v of either coset has level v // 2 in 0..7; the key counts coordinates per level.
    # Keys stay below 2·24·25^7 + 1 < 2^53, so they are exact in float64 too.
    return 2 * sum(_KEY_RADIX ** (v // 2) for v in magnitudes) + int(odd)


@cache
def _tables() -> _Tables:
    layouts = class_layouts()
    code = golay_code()
    n_classes = len(layouts)
    counts = np.zeros(n_classes, dtype=np.int64)
    zero_code = np.full(n_classes, _NO_ZERO, dtype=np.uint8)
    signed_value = np.zeros((n_classes, 8, 2), dtype=np.int8)
    code_of = np.zeros((n_classes, 16), dtype=np.int64)
    for number, lay in enumerate(layouts):
        values = (*lay.on_values, *lay.off_values)
        kind_counts = (*lay.on_counts, *lay.off_counts)
        if len(values) > _FIELDS - 1:
            raise AssertionError(f"class {number} has more kinds than the packed state holds")
        cumulative = [0, *np.cumsum(kind_counts).tolist()]
        cumulative += [cumulative[-1]] * (_FIELDS - len(cumulative))
        counts[number] = sum((c + 31) << (6 * k) for k, c in enumerate(cumulative))
        for kind, value in enumerate(values):
            kind_code = _FIELDS - 1 - kind
            code_of[number, value] = kind_code
            if value == 0:
                zero_code[number] = kind_code
            # The sign bit read for a slot makes it negative iff bit XOR (value ≡ 1 mod 4)
            # (docs/lattice.md §4).
            for bit in (0, 1):
                negative = bit ^ (value % 4 == 1)
                signed_value[number, kind_code, bit] = -value if negative else value
    arrangements = np.array([lay.a_on * lay.a_off for lay in layouts], dtype=np.int64)
    if int(arrangements.max()) * DIM >= 1 << 53 or int(arrangements.max()) >= 1 << 33:
        raise AssertionError("class arrangements too large for the exact float64 recurrence")
    weight_start = {w: code.flat_rank(code.word_of_weight(w, 0)) for w in WEIGHT_COUNTS}
    keys = np.array(
        [_multiset_key(lay.cls.odd, lay.cls.magnitudes()) for lay in layouts], dtype=np.int64
    )
    if len(np.unique(keys)) != n_classes:
        raise AssertionError("class multiset keys collide")
    key_order = np.argsort(keys, kind="stable")
    words = code.words.astype(np.int64)
    flat_of_low = np.full(4096, -1, dtype=np.int64)
    flat_of_low[words & 4095] = np.arange(4096)
    if (flat_of_low < 0).any():
        raise AssertionError("the low 12 bits of the codewords are not an information set")
    bits = (words[:, None] >> np.arange(DIM)) & 1
    slot_position = np.empty((4097, DIM), dtype=np.int64)
    # A stable sort on "not in the word" lists the support positions first, each part ascending.
    slot_position[:4096] = np.argsort(1 - bits, axis=1, kind="stable")
    slot_position[4096] = np.arange(DIM)

    def column(values: list[int]) -> np.ndarray:
        return np.array(values, dtype=np.int64)

    return _Tables(
        ends=column(_class_ends()),
        offsets=column([lay.cls.offset for lay in layouts]),
        odd=np.array([lay.cls.odd for lay in layouts], dtype=bool),
        n_on=column([sum(lay.on_counts) for lay in layouts]),
        sign_free_bits=column([lay.sign_free_bits for lay in layouts]),
        sign_word_bits=column([lay.sign_word_bits for lay in layouts]),
        arrangements=arrangements,
        word_base=column([0 if lay.cls.odd else weight_start[lay.cls.weight] for lay in layouts]),
        p_req=column([lay.cls.p_req for lay in layouts]),
        counts=counts,
        zero_code=zero_code,
        signed_value=signed_value.reshape(-1),
        code_of=code_of.reshape(-1),
        class_keys=keys[key_order].astype(np.float64),
        class_of_key=key_order.astype(np.int64),
        words=words,
        flat_of_low=flat_of_low,
        position_slot=np.argsort(slot_position, axis=1),
        slot_position_t=np.ascontiguousarray(slot_position.T),
        key_weight=np.array([_KEY_RADIX ** (v // 2) for v in range(16)], dtype=np.float64),
    )


def _switch_slots(n_on: np.ndarray) -> set[int]:
    """Slots at which some row's on problem ends and its off problem starts (w ∈ {8, 12, 16})."""
    present = np.bincount(n_on, minlength=DIM + 1)
    return {s for s in range(1, DIM) if present[s]}


def _popcount(values: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Bits set per non-negative int64 as uint8 (numpy ≥ 2 ufunc; SWAR fallback otherwise)."""
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(values, out=out)
    v = values.astype(np.uint64)
    v = v - ((v >> np.uint64(1)) & np.uint64(0x5555555555555555))
    v = (v & np.uint64(0x3333333333333333)) + ((v >> np.uint64(2)) & np.uint64(0x3333333333333333))
    v = (v + (v >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    result = ((v * np.uint64(0x0101010101010101)) >> np.uint64(56)).astype(np.uint8)
    if out is None:
        return result
    out[...] = result
    return out


def _as_index_array(indices: np.ndarray | Sequence[int], max_shell: int) -> np.ndarray:
    arr = np.asarray(indices)
    if arr.size == 0 and arr.dtype.kind == "f":  # np.asarray([]) is float64
        arr = arr.astype(np.int64)
    if not np.issubdtype(arr.dtype, np.integer):
        raise InvalidInput(f"indices must have an integer dtype, got {arr.dtype}")
    limit = ball_size(max_shell)
    if arr.dtype == np.uint64 and arr.size and int(arr.max()) > limit:
        raise InvalidInput(f"index {int(arr.max())} outside the v1 range [0, {limit}]")
    arr = arr.astype(np.int64)
    bad = (arr < 0) | (arr > limit)
    if bad.any():
        first = int(arr[bad].reshape(-1)[0])
        raise InvalidInput(
            f"{int(bad.sum())} indices outside the v1 range [0, {limit}] of Λ24({max_shell}), "
            f"e.g. {first}"
        )
    return arr


def decode_indices(
    indices: np.ndarray | Sequence[int], max_shell: int = FORMAT_MAX_SHELL
) -> np.ndarray:
    """Vectorized :func:`decode_index`: int64 indices [...] -> int32 points [..., 24].

    Bit-identical to the scalar reference. No Python loop over the labels (module docstring).

    Args:
        indices: integer array [...] of v1 indices in ``0 .. N(max_shell)``.
        max_shell: M, 2..13; decides only the valid range.

    Returns:
        int32 [..., 24], the points of √8·Λ24, natural coordinate order.

    Raises:
        InvalidInput: non-integer dtype or an index outside the range.
    """
    max_shell = _check_max_shell(max_shell)
    arr = _as_index_array(indices, max_shell)
    flat = arr.reshape(-1)
    out = np.empty((flat.size, DIM), dtype=np.int32)
    tables = _tables()
    for start in range(0, flat.size, _CHUNK):
        stop = min(start + _CHUNK, flat.size)
        out[start:stop] = _decode_chunk(flat[start:stop], tables)
    return out.reshape(*arr.shape, DIM)


def _decode_chunk(idx: np.ndarray, t: _Tables) -> np.ndarray:
    n = idx.size
    i = np.maximum(idx - 1, 0)  # the origin (idx 0) is decoded as class 0 and zeroed at the end
    cls = np.searchsorted(t.ends, i, side="right")
    local = i - t.offsets[cls]
    # Peel the digits, least significant first (docs/lattice.md §4); the sign radices are powers of
    # two and
    # (r_on, r_off) stay together as one rank (see the comment above _FIELDS).
    sf_bits = t.sign_free_bits[cls]
    r_sf = local & ((1 << sf_bits) - 1)
    local >>= sf_bits
    sw_bits = t.sign_word_bits[cls]
    r_sw = local & ((1 << sw_bits) - 1)
    local >>= sw_bits
    arrangements = t.arrangements[cls]
    g, rank_int = np.divmod(local, arrangements)
    flat_rank = t.word_base[cls] + g
    odd = t.odd[cls]
    n_on = t.n_on[cls]

    # Sign stream, one bit per non-zero slot in slot order; the slot is negative iff (its bit) XOR
    # (magnitude ≡ 1 mod 4). Even classes: the w support signs (r_sw, then the parity bit that makes
    # the number of negative word values ≡ p_req), then r_sf. Odd classes: NOT(codeword), so a
    # magnitude is +a iff (position in c) XOR (a ≡ 1 mod 4) (docs/lattice.md §4). Zero slots consume
    # no bit.
    parity = (_popcount(r_sw).astype(np.int64) + t.p_req[cls]) & 1
    even_stream = np.where(n_on > 0, r_sw | (parity << np.maximum(n_on - 1, 0)), 0)
    even_stream |= r_sf << n_on
    stream = np.where(odd, ~t.words[flat_rank] & 0xFFFFFF, even_stream)

    rank = rank_int.astype(np.float64)
    remaining = arrangements.astype(np.float64)  # M
    slots_left = np.where(n_on == 0, DIM, n_on).astype(np.float64)
    counts = t.counts[cls]
    zero_code = t.zero_code[cls]
    codes = np.empty((DIM, n), dtype=np.uint8)
    sign_bits = np.empty((DIM, n), dtype=np.uint8)
    quotient = np.empty(n, dtype=np.float64)
    guards = np.empty(n, dtype=np.int64)
    switch_slots = _switch_slots(n_on)
    for s in range(DIM):
        if s in switch_slots:  # rows whose on problem just ended now divide by the off slots left
            slots_left = np.where(n_on == s, float(DIM - s), slots_left)
        np.multiply(rank, slots_left, out=quotient)
        quotient /= remaining
        shifted_q = quotient.astype(np.int64)
        shifted_q *= _ONES
        np.subtract(counts, shifted_q, out=guards)
        guards &= _GUARD  # bit 5 of field k+1 set iff C_k > q
        code = codes[s]
        _popcount(guards, out=code)
        pair = counts >> _SHIFT.take(code)
        pair &= 4095
        before = _BEFORE.take(pair)
        before *= remaining
        before /= slots_left
        rank -= before  # r −= M·C_{j−1}/n
        remaining *= _COUNT.take(pair)
        remaining /= slots_left  # M ← M·c_j/n
        guards >>= 5
        counts -= guards
        slots_left -= 1.0
        np.bitwise_and(stream, 1, out=sign_bits[s], casting="unsafe")
        stream >>= code != zero_code
    # ±magnitude per slot from (class, kind code, sign bit); int16 indices (< 383·16) save traffic.
    table_index = codes.astype(np.int16)
    table_index <<= 1
    table_index += sign_bits
    table_index += (cls << 4).astype(np.int16)
    signed = t.signed_value.take(table_index)  # int8 [24, n], slot order
    # Slot order -> natural coordinate order: points[r, p] = signed[slot of p in row r, r].
    gather = t.position_slot[np.where(odd, 4096, flat_rank)]
    gather *= n
    gather += np.arange(n)[:, None]
    points = signed.reshape(-1).take(gather).astype(np.int32)
    points[idx == 0] = 0
    return points


def encode_points(points: np.ndarray, max_shell: int = FORMAT_MAX_SHELL) -> np.ndarray:
    """Vectorized :func:`encode_point`: int points [..., 24] -> int64 indices [...].

    Bit-identical to the scalar reference. No Python loop over the points.

    Args:
        points: integer array [..., 24], points of √8·Λ24 in the integer embedding.
        max_shell: M, 2..13; every point must satisfy ‖x‖² ≤ 16·M.

    Returns:
        int64 [...], the v1 indices (0 for the origin).

    Raises:
        NotInCodebook: some point is not a lattice member or lies outside Λ24(M) (the message gives
            the first one).
        InvalidInput: wrong shape or dtype, or max_shell outside [2, 13].
    """
    max_shell = _check_max_shell(max_shell)
    x = np.asarray(points)
    if x.ndim == 0 or x.shape[-1] != DIM:
        raise InvalidInput(f"points must have shape [..., 24], got {x.shape}")
    if not np.issubdtype(x.dtype, np.integer):
        raise InvalidInput(f"points must have an integer dtype, got {x.dtype}")
    flat = x.reshape(-1, DIM)
    out = np.empty(flat.shape[0], dtype=np.int64)
    tables = _tables()
    for start in range(0, flat.shape[0], _CHUNK):
        stop = min(start + _CHUNK, flat.shape[0])
        out[start:stop] = _encode_chunk(flat[start:stop], tables, max_shell)
    return out.reshape(x.shape[:-1])


def _encode_chunk(raw: np.ndarray, t: _Tables, max_shell: int) -> np.ndarray:
    n = raw.shape[0]
    if n and (raw.max() > 15 or raw.min() < -15):  # outside Λ24(13): zero those rows (they are
        far = (raw.max(axis=1) > 15) | (raw.min(axis=1) < -15)  # rejected below) so that no
        x = np.where(far[:, None], 0, raw).astype(np.int32)  # square or sum can overflow
    else:
        far = np.zeros(n, dtype=bool)
        x = raw.astype(np.int32)
    # x mod 4 decides everything about membership: bit 0 is the coset parity, bit 1 the Golay bit
    # (for either coset the docs/lattice.md §2.1 bit ((x_i − p)/2) mod 2 equals bit 1 of x_i in
    # two's complement).
    mod4 = x.astype(np.uint8) & 3  # two's complement: the low bits survive the cast
    word_bytes = np.packbits(mod4 >> 1, axis=1, bitorder="little").astype(np.int64)
    word = word_bytes[:, 0] | (word_bytes[:, 1] << 8) | (word_bytes[:, 2] << 16)
    parity_bytes = np.packbits(mod4 & 1, axis=1, bitorder="little")
    parity = (parity_bytes[:, 0] & 1).astype(np.int64)
    same_parity = np.all(parity_bytes == (parity * 255).astype(np.uint8)[:, None], axis=1)
    # The low 12 bits of a codeword determine it (they are an information set of m(x)·g(x)).
    flat_rank = t.flat_of_low.take(word & 4095)
    in_code = t.words.take(flat_rank) == word
    total = x.sum(axis=1)
    norm = np.einsum("ij,ij->i", x, x)
    member = ~far & same_parity & in_code & ((total & 7) == 4 * parity)
    bad = ~member | (norm > 16 * max_shell)
    if bad.any():
        first = raw[np.flatnonzero(bad)[0]].tolist()
        raise NotInCodebook(
            f"point {first} is not in Λ24({max_shell}) (needs a lattice member with "
            f"‖x‖² ≤ {16 * max_shell})"
        )
    origin = norm == 0
    magnitude = np.abs(x)
    keys = 2.0 * np.einsum("ij->i", t.key_weight.take(magnitude)) + parity  # exact: < 2^53
    where_key = np.searchsorted(t.class_keys, keys).clip(max=t.class_keys.size - 1)
    if not np.all((t.class_keys[where_key] == keys) | origin):  # the class table is complete
        raise AssertionError("a member of the ball matches no class")
    cls = np.where(origin, 0, t.class_of_key[where_key])
    odd = t.odd[cls]
    # Natural order -> slot order, slot-major: slot_x[s, r] = x[r, position of slot s in row r].
    gather = t.slot_position_t.take(np.where(odd, 4096, flat_rank), axis=1)
    gather += np.arange(n, dtype=np.int64) * DIM
    slot_x = x.reshape(-1).take(gather)  # int32 [24, n]
    codes = t.code_of.take(np.abs(slot_x) + (cls << 4))  # origin rows: garbage, masked at the end
    shifts = _SHIFT.take(codes)
    decrements = _SUBTRACT.take(codes)
    n_on = t.n_on[cls]

    rank = np.zeros(n, dtype=np.float64)
    remaining = t.arrangements[cls].astype(np.float64)
    slots_left = np.where(n_on == 0, DIM, n_on).astype(np.float64)
    counts = t.counts[cls]
    switch_slots = _switch_slots(n_on)
    for s in range(DIM):
        if s in switch_slots:
            slots_left = np.where(n_on == s, float(DIM - s), slots_left)
        pair = counts >> shifts[s]
        pair &= 4095
        before = _BEFORE.take(pair)
        before *= remaining
        before /= slots_left
        rank += before  # r += M·C_{j−1}/n
        remaining *= _COUNT.take(pair)
        remaining /= slots_left  # M ← M·c_j/n
        counts -= decrements[s]
        slots_left -= 1.0

    # Sign stream: one bit per non-zero slot, in slot order (the inverse of the decoder's stream).
    # Bit position of slot s = s − (zero slots before s); uint8 throughout keeps this cheap.
    zero = (slot_x == 0).view(np.uint8)
    zeros_before = np.empty((DIM, n), dtype=np.uint8)
    running = np.zeros(n, dtype=np.uint8)
    for s in range(DIM):
        zeros_before[s] = running
        running += zero[s]
    bit_position = np.arange(DIM, dtype=np.uint8)[:, None] - zeros_before
    stream = ((slot_x < 0).astype(np.int64) << bit_position).sum(axis=0)
    sw_bits = t.sign_word_bits[cls]
    r_sw = np.where(odd, 0, stream & ((1 << sw_bits) - 1))  # odd classes store no signs
    r_sf = np.where(odd, 0, stream >> n_on)
    local = (flat_rank - t.word_base[cls]) * t.arrangements[cls] + rank.astype(np.int64)
    local = (local << sw_bits) + r_sw
    local = (local << t.sign_free_bits[cls]) + r_sf
    return np.where(origin, 0, 1 + t.offsets[cls] + local)


def _benchmark(
    count: int = 1 << 21, max_shell: int = 12, seed: int = 0, trials: int = 3
) -> dict[str, float]:
    """Labels/s of the vectorized paths on uniform random labels over Λ24(max_shell).

    CPU time of this process (single-threaded numpy), best of ``trials``.
    """
    import time

    rng = np.random.default_rng(seed)
    labels = rng.integers(0, ball_size(max_shell) + 1, size=count, dtype=np.int64)
    encode_points(decode_indices(labels[:1000]))  # build the tables outside the timing
    best = {"decode_labels_per_s": 0.0, "encode_labels_per_s": 0.0}
    for _ in range(trials):
        t0 = time.process_time()
        points = decode_indices(labels, max_shell)
        t1 = time.process_time()
        again = encode_points(points, max_shell)
        t2 = time.process_time()
        if not np.array_equal(again, labels):
            raise AssertionError("encode_points(decode_indices(x)) != x")
        best["decode_labels_per_s"] = max(best["decode_labels_per_s"], count / (t1 - t0))
        best["encode_labels_per_s"] = max(best["encode_labels_per_s"], count / (t2 - t1))
    return best

