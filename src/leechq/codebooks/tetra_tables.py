"""The Tetra decode tables, rebuilt from first principles (no data file).

Implements docs/codebooks.md §3.1–§3.3 and §3.6: the trio order of
the ``0xC75`` Golay code, the 64-state trellis at cuts 8 and 16 with the echelon (smallest coset
member) state numbering, the rank-vector rows sorted by ``(cost, lexicographic)``, the mixed split
``N0 = 1240`` and the value table. Every tensor carries exactly the name, dtype and shape of the
published ``tetra-tables.safetensors``; the per-tensor sha256 digests pin them (tests).

Also here, because the kernels and the encoder need them: ``invnorm`` (``f32(1/sqrt(f64(16 m)))``,
entry 0 = 0), the 12 F2-linear pattern columns of docs/codebooks.md §3.2, and the closed-form list
boundaries of docs/codebooks.md §3.3 (each row list is ``{T < B} ∪ {T = B, ρ ≤lex cut}`` with
``T = Σ tri(ρ_j)``, ``cost = 8 + 8·T``).

Nothing is computed at import; :func:`tetra_tables` builds everything once (a few milliseconds).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache

import numpy as np

from leechq.lattice.golay import golay_code

FINGERPRINT = "9c3060086c7a13e6"
"""The pinned Tetra map fingerprint (docs/codebooks.md §3.6; an opaque constant)."""

TRIO_OCTADS = (0x00149F, 0x0F6840, 0xF08320)
"""The three disjoint octads whose coordinates, in turn, give the trio order (
docs/codebooks.md §3.1)."""

SECTION = 8
CLASS_ROWS = 2048
N0_MIXED = 1240
LABEL_BITS = 47
MAX_RANK = 7
"""Ranks 0..7 name a member of ``o + 4Z`` (docs/codebooks.md §3.3); the rows only use 0..4."""

TABLE_NAMES = (
    "order",
    "prefixes",
    "prefixes_flat",
    "suffixes",
    "suffixes_flat",
    "branch_c2",
    "branch_s16",
    "branches_u16",
    "rows",
    "values",
)
"""The ten tensors of the published table file, in its order."""

PUBLISHED_DIGESTS = {
    "order": "68b84f77bf97fdd3672b732b8d6d552aeb6ed8249c1123dac61dc06c5f6849eb",
    "prefixes": "6d1aaa9a3697e9ba3fad5f4439d5dc62f3259694d2064748489935b1f4779acc",
    "prefixes_flat": "6d1aaa9a3697e9ba3fad5f4439d5dc62f3259694d2064748489935b1f4779acc",
    "suffixes": "4d38e387c9adf7709b89a03d275d9ae8149216ae9234f22d6ffeba911a9d691b",
    "suffixes_flat": "4d38e387c9adf7709b89a03d275d9ae8149216ae9234f22d6ffeba911a9d691b",
    "branch_c2": "1d6378dd1251628a4de94b3b1d3994a8a0d20d185be6fdb7dd9fb6f8ba9f5511",
    "branch_s16": "53b950eef7669efab7deaf39dde6590c6525b37c511da68c7d533a02b43997c0",
    "branches_u16": "5118263121ad4907bf7fff9e7b0f731f63acf5bd7b370875a820ff9fe4f5c17d",
    "rows": "3cb31a97d042a0784e38b43e09426b1ee62b6c220fd34d71a4d21fe812c3653b",
    "values": "122811857cda78ca1887ff88a2cbe75a524b10c1e40d5546b68bd1540bef4bc7",
}
"""Per-tensor sha256 of the shipped tables (docs/codebooks.md §3.6), little-endian C-order bytes."""

BRANCHES_AS_U16_DIGEST = "fa6aee80f834fe7e092240929bf584c193e30a8d38a36ae327899ccee3361eb7"
"""sha256 of ``branches_u16`` narrowed to ``<u2``, as kernels upload it."""

TRI = np.array([k * (k + 1) // 2 for k in range(MAX_RANK + 1)], dtype=np.int64)
"""``tri(ρ) = ρ(ρ+1)/2``; ``cost(ρ) = Σ (2ρ_j+1)² = 8 + 8·Σ tri(ρ_j)`` over a section."""


@dataclass(frozen=True)
class RowList:
    """One of the row lists in closed form (docs/codebooks.md §3.3).

    A rank vector is a member iff ``class == cls`` (when ``cls`` is not None) and
    ``T < budget or (T == budget and ρ ≤lex cut)`` with ``T = Σ tri(ρ_j)``.

    Attributes:
        budget: ``B``; the cutoff cost is ``8 + 8·B``.
        cut: the last member's ranks (tuple of 8), ρ_0 most significant.
        cls: the k-parity class of the list, or None for the mixed list.
    """

    budget: int
    cut: tuple[int, ...]
    cls: int | None

    @property
    def cost(self) -> int:
        """The cutoff cost ``C = Σ (2ρ_j+1)²`` of the boundary (88, 96 or 72)."""
        return 8 + 8 * self.budget


@dataclass(frozen=True)
class TetraTables:
    """The Tetra tables (docs/codebooks.md §3.6) plus kernel and encoder constants.

    Attributes:
        order: uint8 [24], trio position → natural coordinate.
        prefixes: uint8 [64, 2], the two prefix bytes of each cut-8 state, ascending.
        prefixes_flat: uint8 [128], ``prefixes`` flattened (index ``2·s8 + b1``).
        suffixes: uint8 [64, 2], the two suffix bytes of each cut-16 state, ascending.
        suffixes_flat: uint8 [128], index ``2·s16 + b3``.
        branch_c2: uint8 [64, 16], middle byte of each branch leaving s8, ascending.
        branch_s16: uint8 [64, 16], the cut-16 state the branch reaches.
        branches_u16: uint32 [64, 16], ``c2 | s16 << 8`` (uploaded as ``<u2`` by kernels).
        rows: uint32 [4096], class-0 rows then class-1 rows; rank j in nibble j.
        values: int64 [4, 8], ``val(o, ρ)``.
        invnorm: float32 [32], ``f32(1/sqrt(f64(16 m)))``, entry 0 = 0.
        columns: uint32 [12], the F2-linear pattern columns (s8 bits 0..5, b1, b2 bits 0..3, b3).
        n0_mixed: 1240.
        fingerprint: ``"9c3060086c7a13e6"``.
        class0_list, class1_list, mixed_list: closed forms of the three row lists.
    """

    order: np.ndarray
    prefixes: np.ndarray
    prefixes_flat: np.ndarray
    suffixes: np.ndarray
    suffixes_flat: np.ndarray
    branch_c2: np.ndarray
    branch_s16: np.ndarray
    branches_u16: np.ndarray
    rows: np.ndarray
    values: np.ndarray
    invnorm: np.ndarray
    columns: np.ndarray
    class0_list: RowList
    class1_list: RowList
    mixed_list: RowList
    n0_mixed: int = N0_MIXED
    fingerprint: str = FINGERPRINT
    class_rows: int = CLASS_ROWS
    label_bits: int = LABEL_BITS

    def tensors(self) -> dict[str, np.ndarray]:
        """The ten published tensors by name (the file's names, dtypes and shapes)."""
        return {name: getattr(self, name) for name in TABLE_NAMES}

    def digests(self) -> dict[str, str]:
        """sha256 (hex) of each published tensor's little-endian C-order bytes.

        Also ``"branches_as_u16"``: the digest of ``branches_u16`` narrowed to ``<u2``.
        """
        out = {name: _sha256(arr) for name, arr in self.tensors().items()}
        out["branches_as_u16"] = _sha256(self.branches_u16.astype("<u2"))
        return out


def _sha256(arr: np.ndarray) -> str:
    little = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
    return hashlib.sha256(little.tobytes()).hexdigest()


def value_of(o: int, rank: int) -> int:
    """``val(o, ρ)``: the ρ-th member of ``o + 4Z`` outward from 0, positive first on a tie."""
    reach = 4 * (MAX_RANK + 2)
    members = sorted(range(o - reach, o + reach + 1, 4), key=lambda v: (abs(v), -v))
    return members[rank]


def rank_class(ranks: np.ndarray) -> np.ndarray:
    """k-parity class of rank vectors: ``Σ_j [ρ_j mod 4 ∈ {1, 2}] mod 2`` over the last axis."""
    r = np.asarray(ranks) % 4
    return (((r == 1) | (r == 2)).sum(axis=-1) & 1).astype(np.int64)


def _trio_order(words: np.ndarray) -> np.ndarray:
    word_set = set(int(w) for w in words)
    covered = 0
    for octad in TRIO_OCTADS:
        if octad not in word_set or octad.bit_count() != 8:
            raise AssertionError(f"0x{octad:06x} is not an octad of the code")
        if covered & octad:
            raise AssertionError("trio octads overlap")
        covered |= octad
    if covered != 0xFFFFFF:
        raise AssertionError("trio octads do not cover the 24 coordinates")
    order = [i for octad in TRIO_OCTADS for i in range(24) if (octad >> i) & 1]
    return np.array(order, dtype=np.int64)


def _permute(words: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Bit j of the result = bit ``order[j]`` of the input."""
    out = np.zeros_like(words)
    for j, src in enumerate(order):
        out |= ((words >> int(src)) & 1) << j
    return out


def _states(words: np.ndarray, cut: int) -> np.ndarray:
    """Trellis state of each codeword at ``cut`` (docs/codebooks.md §3.2: rank of its least
    coset member)."""
    low = (1 << cut) - 1
    sub = words[((words & ~low) == 0) | ((words & low) == 0)]
    span = np.unique((sub[:, None] ^ sub[None, :]).ravel())
    if span.size != 64:
        raise AssertionError(f"|V| = {span.size} at cut {cut}, expected 64")
    minima = (words[:, None] ^ span[None, :]).min(axis=1)
    reps, state = np.unique(minima, return_inverse=True)
    if reps.size != 64:
        raise AssertionError(f"{reps.size} states at cut {cut}, expected 64")
    return state.astype(np.int64)


def _trellis(trio_words: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    s8 = _states(trio_words, 8)
    s16 = _states(trio_words, 16)
    c1 = trio_words & 0xFF
    c2 = (trio_words >> 8) & 0xFF
    c3 = (trio_words >> 16) & 0xFF
    prefixes = np.zeros((64, 2), dtype=np.uint8)
    suffixes = np.zeros((64, 2), dtype=np.uint8)
    branch_c2 = np.zeros((64, 16), dtype=np.uint8)
    branch_s16 = np.zeros((64, 16), dtype=np.uint8)
    for s in range(64):
        pre = np.unique(c1[s8 == s])
        suf = np.unique(c3[s16 == s])
        pairs = np.unique(c2[s8 == s] * 64 + s16[s8 == s])
        if pre.size != 2 or suf.size != 2 or pairs.size != 16 or np.unique(pairs // 64).size != 16:
            raise AssertionError(f"state {s}: trellis is not 2 × 16 × 2")
        if pre[0] ^ pre[1] != 0xFF or suf[0] ^ suf[1] != 0xFF:
            raise AssertionError(f"state {s}: end bytes are not complementary")
        prefixes[s] = pre
        suffixes[s] = suf
        branch_c2[s] = pairs // 64
        branch_s16[s] = pairs % 64
    return prefixes, suffixes, branch_c2, branch_s16


def _rank_rows() -> tuple[np.ndarray, int, list[RowList]]:
    """Rows (uint32 [4096]), N0, and the closed forms of the three lists (
    docs/codebooks.md §3.3)."""
    cap = 64
    while True:
        # A rank ρ > rmax alone costs (2ρ+1)² + 7 ≥ cap: {0..rmax}^8 holds every vector under cap.
        rmax = max(r for r in range(MAX_RANK + 1) if (2 * r + 1) ** 2 + 7 < cap)
        grid = np.indices((rmax + 1,) * SECTION).reshape(SECTION, -1).T  # lexicographic, ρ_0 major
        cost = ((2 * grid + 1) ** 2).sum(axis=1)
        keep = cost < cap
        grid, cost = grid[keep], cost[keep]
        cls = rank_class(grid)
        if min(int((cls == 0).sum()), int((cls == 1).sum())) >= CLASS_ROWS:
            break
        cap *= 2
    lex = np.zeros(len(grid), dtype=np.int64)
    for j in range(SECTION):
        lex = lex * (MAX_RANK + 1) + grid[:, j]
    order = np.lexsort((lex, cost))  # stable: cost first, then lexicographic
    grid, cost, cls = grid[order], cost[order], cls[order]
    packed = np.zeros(len(grid), dtype=np.int64)
    for j in range(SECTION):
        packed |= grid[:, j] << (4 * j)
    class_rows = [np.flatnonzero(cls == k)[:CLASS_ROWS] for k in (0, 1)]
    rows = np.concatenate([packed[class_rows[0]], packed[class_rows[1]]]).astype(np.uint32)
    mixed = np.arange(CLASS_ROWS)
    n0 = int((cls[mixed] == 0).sum())
    lists = []
    for members, k in ((class_rows[0], 0), (class_rows[1], 1), (mixed, None)):
        last = members[-1]
        budget = (int(cost[last]) - 8) // 8
        lists.append(RowList(budget=budget, cut=tuple(int(v) for v in grid[last]), cls=k))
    return rows, n0, lists


def _columns(
    prefixes: np.ndarray, branch_c2: np.ndarray, branch_s16: np.ndarray, suffixes: np.ndarray
) -> np.ndarray:
    cols = []
    for bit in range(12):
        x = 1 << bit
        s8, b1, b2, b3 = x & 63, (x >> 6) & 1, (x >> 7) & 15, (x >> 11) & 1
        c1 = int(prefixes[s8, b1])
        c2 = int(branch_c2[s8, b2])
        c3 = int(suffixes[branch_s16[s8, b2], b3])
        cols.append(c1 | c2 << 8 | c3 << 16)
    return np.array(cols, dtype=np.uint32)


@cache
def tetra_tables() -> TetraTables:
    """Build (once) the Tetra tables from the Golay code; see the module docstring."""
    words = np.asarray(golay_code().words, dtype=np.int64)
    order = _trio_order(words)
    trio_words = _permute(words, order)
    prefixes, suffixes, branch_c2, branch_s16 = _trellis(trio_words)
    rows, n0, (list0, list1, mixed) = _rank_rows()
    if n0 != N0_MIXED:
        raise AssertionError(f"N0 = {n0}, expected {N0_MIXED}")
    values = np.array(
        [[value_of(o, r) for r in range(MAX_RANK + 1)] for o in range(4)], dtype=np.int64
    )
    invnorm = np.zeros(32, dtype=np.float32)
    shells = np.arange(1, 32, dtype=np.float64)
    invnorm[1:] = (1.0 / np.sqrt(16.0 * shells)).astype(np.float32)
    return TetraTables(
        order=order.astype(np.uint8),
        prefixes=prefixes,
        prefixes_flat=prefixes.reshape(-1).copy(),
        suffixes=suffixes,
        suffixes_flat=suffixes.reshape(-1).copy(),
        branch_c2=branch_c2,
        branch_s16=branch_s16,
        branches_u16=(branch_c2.astype(np.uint32) | (branch_s16.astype(np.uint32) << 8)),
        rows=rows,
        values=values,
        invnorm=invnorm,
        columns=_columns(prefixes, branch_c2, branch_s16, suffixes),
        class0_list=list0,
        class1_list=list1,
        mixed_list=mixed,
    )


def rows_ranks(rows: np.ndarray) -> np.ndarray:
    """Unpack rows: uint32 [...] → int64 [..., 8] ranks (nibble j = rank j)."""
    r = np.asarray(rows, dtype=np.int64)
    return (r[..., None] >> (4 * np.arange(SECTION, dtype=np.int64))) & 15


def pattern_from_columns(x: np.ndarray) -> np.ndarray:
    """Trio-order Golay pattern of ``x = s8 | b1<<6 | b2<<7 | b3<<11`` from the columns of
    docs/codebooks.md §3.2."""
    cols = tetra_tables().columns.astype(np.int64)
    x = np.asarray(x, dtype=np.int64)
    out = np.zeros_like(x)
    for bit in range(12):
        out ^= np.where((x >> bit) & 1, cols[bit], 0)
    return out


__all__ = [
    "BRANCHES_AS_U16_DIGEST",
    "CLASS_ROWS",
    "FINGERPRINT",
    "LABEL_BITS",
    "N0_MIXED",
    "PUBLISHED_DIGESTS",
    "TABLE_NAMES",
    "RowList",
    "TetraTables",
    "pattern_from_columns",
    "rank_class",
    "rows_ranks",
    "tetra_tables",
    "value_of",
]
