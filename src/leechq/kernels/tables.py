"""Device-side decode tables derived from the codebooks' tables (built lazily, cached per device).

* Tetra (docs/kernels.md): ``rows`` int32 [4096] (the rank table as is), and the
  Golay pattern split by F2-linearity into two small tables, ``cw`` int32 [256]:
  ``cw[s8 | b1<<6]`` (128 entries) = pattern of (s8, b1, b2 = 0, b3 = 0) and
  ``cw[128 + (b2 | b3<<4)]`` (32 entries) = pattern of (s8 = 0, b1 = 0, b2, b3), so the full 24-bit
  trio-order pattern ``c1 | c2<<8 | c3<<16`` of a word is ``cw[a] ^ cw[128 + b]`` — two independent
  reads instead of the dependent prefix → branch → suffix chain. The split is checked against the
  trellis on all 4096 inputs when built.
* ``order`` int32 [24] (trio → natural) for the activation preparation.
* The batch-1 Tetra table (:func:`tetra_m1_table`, one int32 tensor staged in shared memory by the
  ``tetra48_m1`` kernel): the rank rows re-coded as nibbles ``f = 2·u(ρ) + 7`` with
  ``u = (0, 1, −1, 2, −2, 3, −3, 4)[ρ]``, the Golay pattern as per-section nibble masks split by
  F2-linearity (the pattern is linear in all twelve bits ``s8, b1, b2, b3``, checked when built),
  here as ``PA[s8] ^ PB[b1 | b2<<1 | b3<<5]``: 64 entries each, 4 words per entry, eight
  bank-spread copies, and ``1/‖y‖`` by ``‖y‖²/16`` in the spare fourth words of ``PA``.
  With ``h = f ^ mask`` (nibble j of section k) a coordinate is
  ``p + (−1)^p · 2 · (h − 7)`` — the identity ``val(o, ρ) = a(o) + 4·σ(o)·u(ρ)`` with the
  pattern bit folded in as a 4-bit complement (checked on every table entry when built, and against
  the codebook decoder in the tests).
* The batch-1 ``tetra64`` table (:func:`tetra_m1_bits_table`, the default of the kernel's
  ``tetra64`` decode): the same rank rows, the pattern tables as one word per entry (bit
  ``4i + k`` = nibble ``i`` of section ``k``'s mask, :func:`pattern_bits`) in 8, 16 or 32
  bank-spread copies.
* Planes14: the 512-entry class table in its kernel form (``formats.layouts.planes14``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class TetraKernelTables:
    """Tetra tables as the kernels read them (all int32, on one device)."""

    rows: torch.Tensor
    cw: torch.Tensor
    order: torch.Tensor


def tetra_pattern_split() -> np.ndarray:
    """The 256-entry split pattern table (uint32), verified against the trellis tables."""
    from leechq.codebooks.tetra_tables import tetra_tables

    t = tetra_tables()

    def pattern(s8: np.ndarray, b1: np.ndarray, b2: np.ndarray, b3: np.ndarray) -> np.ndarray:
        c1 = t.prefixes[s8, b1].astype(np.uint32)
        c2 = t.branch_c2[s8, b2].astype(np.uint32)
        s16 = t.branch_s16[s8, b2].astype(np.int64)
        c3 = t.suffixes[s16, b3].astype(np.uint32)
        return c1 | (c2 << 8) | (c3 << 16)

    cw = np.zeros(256, dtype=np.uint32)
    a = np.arange(128)
    cw[:128] = pattern(a & 63, a >> 6, np.zeros_like(a), np.zeros_like(a))
    b = np.arange(32)
    cw[128:160] = pattern(np.zeros_like(b), np.zeros_like(b), b & 15, b >> 4)
    x = np.arange(4096)
    s8, b1, b2, b3 = x & 63, (x >> 6) & 1, (x >> 7) & 15, x >> 11
    full = pattern(s8, b1, b2, b3)
    split = cw[s8 | (b1 << 6)] ^ cw[128 + (b2 | (b3 << 4))]
    if not np.array_equal(full, split):
        raise AssertionError("the Golay trellis is not F2-linear in (s8, b1, b2, b3)")
    return cw


def _memo(kind: str, device: torch.device | str, build: Any) -> Any:
    """``build(device_str)`` once per (kind, device), kept in a plain dict.

    A plain dict, not ``functools.cache``: torch.compile ignores the cache wrapper and would trace
    the builder (numpy table construction) inside a compiled forward; a dict hit is traced as a
    constant lookup, so a module whose tables were built eagerly compiles with ``fullgraph=True``.
    """
    key = (kind, str(torch.device(device)))
    hit = _MEMO.get(key)
    if hit is None:
        hit = _MEMO[key] = build(key[1])
    return hit


_MEMO: dict[tuple[str, str], Any] = {}


def _tetra_tables_build(device: str) -> TetraKernelTables:
    from leechq.codebooks.tetra_tables import tetra_tables

    t = tetra_tables()
    rows = torch.from_numpy(t.rows.astype(np.uint32).view(np.int32).copy())
    cw = torch.from_numpy(tetra_pattern_split().view(np.int32).copy())
    order = torch.from_numpy(t.order.astype(np.int32))
    return TetraKernelTables(rows.to(device), cw.to(device), order.to(device))


def tetra_kernel_tables(device: torch.device | str) -> TetraKernelTables:
    """The Tetra kernel tables on ``device`` (built once per device)."""
    return _memo("tetra", device, _tetra_tables_build)


M1_RANK_U = (0, 1, -1, 2, -2, 3, -3, 4)
"""``u(ρ)``: ``val(o, ρ) = a(o) + 4·σ(o)·u(ρ)``, ``a = (0, 1, 2, −1)[o]``, ``σ = (1, −1, −1, 1)[o]``."""

M1_COPIES = 8
"""Copies of each pattern-table entry, one per 16-byte bank group: a 16-byte shared load is served
eight lanes at a time, and lane ``ℓ`` reading copy ``ℓ mod 8`` keeps those eight lanes on distinct
banks whatever entries they read (random entries of one copy conflict ~2.3-way: ncu on the H200
counted 63 % of the batch-1 kernel's shared-load wavefronts as conflicts with one copy)."""
M1_PA_WORD = 4096
"""Word offset of the pattern table ``PA`` (64 entries by ``s8``, word bits 2..7), ``M1_COPIES``
copies each: entry ``a``, copy ``c`` at words ``M1_PA_WORD + 4·(8·a + c) …+3``; words 0..2 are the
section masks, word 3 of entries ``k < 32`` holds ``1/‖y‖`` for ``‖y‖² = 16·k`` (every Tetra
point has ‖y‖² ≡ 0 mod 16 and < 512; 0 for the origin and impossible norms)."""
M1_PB_WORD = M1_PA_WORD + 4 * 64 * M1_COPIES
"""Word offset of the pattern table ``PB`` (64 entries by ``b1 | b2<<1 | b3<<5``: word bits 8,
20..23 and 35), ``M1_COPIES`` copies each, laid out like ``PA`` (word 3 is 0)."""
M1_TABLE_WORDS = M1_PB_WORD + 4 * 64 * M1_COPIES
"""8192 words: the 32 KiB the kernels reserve (five programs per H200 SM)."""
M1_MID_SHIFT = 2048 - 1240
"""The middle section's row is ``i2`` (``i2 < 1240``, class 0) or ``i2 + M1_MID_SHIFT`` (class 1,
rows ``2048 + i2 − 1240``); 1240 is ``codebooks.tetra_tables.N0_MIXED`` (checked in the tests)."""


def _spread_nibbles(byte: np.ndarray) -> np.ndarray:
    """8-bit masks → 32-bit nibble masks (bit j set ⇒ nibble j = 0xF)."""
    out = np.zeros(byte.shape, dtype=np.uint32)
    for j in range(8):
        out |= (((byte >> j) & 1).astype(np.uint32) * 0xF) << np.uint32(4 * j)
    return out


def _m1_parts() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The batch-1 table's parts (uint32): re-coded rank rows [4096], ``PA`` [64, 4] and ``PB``
    [64, 4], verified: the re-coded rows reproduce ``val(o, ρ)`` for every row, nibble and residue,
    and ``PA ^ PB`` reproduces the trellis pattern for all 4096 ``(s8, b1, b2, b3)``."""
    from leechq.codebooks.tetra_tables import tetra_tables

    t = tetra_tables()
    ranks = (t.rows.astype(np.int64)[:, None] >> (4 * np.arange(8))) & 15
    u = np.asarray(M1_RANK_U, dtype=np.int64)[ranks]
    f = 2 * u + 7
    if f.min() < 0 or f.max() > 15:
        raise AssertionError("re-coded rank nibble outside 0..15")
    hrow = (f.astype(np.uint64) << (4 * np.arange(8, dtype=np.uint64))).sum(1).astype(np.uint32)
    # val(o, ρ) = p + (−1)^p·2·(h − 7), h = f (pattern bit 0) or 15 − f (bit 1), o = p + 2c
    for p in (0, 1):
        for c in (0, 1):
            h = f if c == 0 else 15 - f
            got = p + (1 - 2 * p) * 2 * (h - 7)
            if not np.array_equal(got, t.values[p + 2 * c][ranks]):
                raise AssertionError(f"re-coded rows disagree with val(o={p + 2 * c}, ρ)")
    cw = tetra_pattern_split()
    a = np.arange(64)
    pa_pat = cw[a]  # (s8 = a, b1 = 0, b2 = b3 = 0)
    pb_pat = cw[(a & 1) << 6] ^ cw[128 + (((a >> 1) & 15) | ((a >> 5) << 4))]
    pa = np.zeros((64, 4), dtype=np.uint32)
    pb = np.zeros((64, 4), dtype=np.uint32)
    for k in range(3):
        pa[:, k] = _spread_nibbles((pa_pat >> np.uint32(8 * k)) & 0xFF)
        pb[:, k] = _spread_nibbles((pb_pat >> np.uint32(8 * k)) & 0xFF)
    pa[:32, 3] = t.invnorm.astype(np.float32).view(np.uint32)
    x = np.arange(4096)
    s8, b1, b2, b3 = x & 63, (x >> 6) & 1, (x >> 7) & 15, x >> 11
    pattern = cw[s8 | (b1 << 6)] ^ cw[128 + (b2 | (b3 << 4))]
    for k in range(3):
        want = _spread_nibbles((pattern >> np.uint32(8 * k)) & 0xFF)
        if not np.array_equal(pa[s8, k] ^ pb[b1 | (b2 << 1) | (b3 << 5), k], want):
            raise AssertionError("split nibble masks disagree with the trellis pattern")
    return hrow, pa, pb


def tetra_m1_table_numpy() -> np.ndarray:
    """The batch-1 Tetra table as uint32 (see the module docstring): [M1_TABLE_WORDS] with the
    pattern tables in :data:`M1_COPIES` bank-spread copies (the kernels stage it in shared
    memory)."""
    hrow, pa, pb = _m1_parts()
    copies = M1_COPIES
    pb_word = M1_PB_WORD
    out = np.zeros(pb_word + 4 * 64 * copies, dtype=np.uint32)
    out[:4096] = hrow
    out[M1_PA_WORD:pb_word] = np.repeat(pa, copies, axis=0).reshape(-1)
    out[pb_word:] = np.repeat(pb, copies, axis=0).reshape(-1)
    return out


M1_BITS_COPIES = (8, 16, 32)
"""Copy counts of the pattern-bits table (:func:`tetra_m1_bits_table_numpy`): 32 copies give
each lane of a warp its own bank (one wavefront per lookup, 32 KiB in all); 16 copies (24 KiB)
let lanes ``ℓ`` and ``ℓ + 16`` share a bank, 8 copies (20 KiB) lanes ``ℓ + 8j`` (about two
wavefronts per lookup)."""


def pattern_bits(masks: np.ndarray) -> np.ndarray:
    """Pattern entries ``[..., 4]`` of nibble masks (word ``k`` < 3: section ``k``, nibble ``i``
    ``0xF`` or 0) → one uint32 each: bit ``4i + k`` is nibble ``i`` of section ``k``'s mask, so
    ``((P >> k) & 0x11111111) · 15`` gives the mask back (and the XOR of two such words gives
    the XOR of their masks)."""
    out = np.zeros(masks.shape[:-1], dtype=np.uint32)
    for k in range(3):
        for i in range(8):
            bit = (masks[..., k] >> np.uint32(4 * i)) & np.uint32(1)
            out |= bit.astype(np.uint32) << np.uint32(4 * i + k)
    return out


def tetra_m1_bits_table_numpy(copies: int = 32) -> np.ndarray:
    """The batch-1 ``tetra64`` table with the Golay pattern as bits (uint32): the re-coded rank
    rows [4096] as in :func:`tetra_m1_table_numpy`, then ``PA`` and ``PB`` as one word per entry
    (:func:`pattern_bits`), ``copies`` copies each (8, 16 or 32, :data:`M1_BITS_COPIES`): entry
    ``a``, copy ``c`` at word ``4096 + copies·a + c`` (``PA``) and ``4096 + 64·copies +
    copies·a + c`` (``PB``). 8192 words with 32 copies, 6144 with 16, 5120 with 8. Every
    entry's masks are checked to come back from its bits."""
    if copies not in M1_BITS_COPIES:
        raise ValueError(f"copies must be one of {M1_BITS_COPIES}, got {copies}")
    hrow, pa, pb = _m1_parts()
    bits_a, bits_b = pattern_bits(pa), pattern_bits(pb)
    for bits, masks in ((bits_a, pa), (bits_b, pb)):
        for k in range(3):
            back = ((bits >> np.uint32(k)) & np.uint32(0x11111111)) * np.uint32(15)
            if not np.array_equal(back, masks[:, k]):
                raise AssertionError("pattern bits do not give the nibble masks back")
    out = np.zeros(4096 + 2 * 64 * copies, dtype=np.uint32)
    out[:4096] = hrow
    out[4096:4096 + 64 * copies] = np.repeat(bits_a, copies)
    out[4096 + 64 * copies:] = np.repeat(bits_b, copies)
    return out


def _tetra_m1_bits_build(device: str, copies: int) -> torch.Tensor:
    return torch.from_numpy(tetra_m1_bits_table_numpy(copies).view(np.int32).copy()).to(device)


def tetra_m1_bits_table(device: torch.device | str, copies: int = 32) -> torch.Tensor:
    """:func:`tetra_m1_bits_table_numpy` as int32 on ``device`` (built once per device and copy
    count; an unknown count is refused by the builder)."""
    return _memo(f"tetra_m1_bits{copies}", device, partial(_tetra_m1_bits_build, copies=copies))


def _tetra_m1_build(device: str) -> torch.Tensor:
    return torch.from_numpy(tetra_m1_table_numpy().view(np.int32).copy()).to(device)


def tetra_m1_table(device: torch.device | str) -> torch.Tensor:
    """The batch-1 Tetra table, int32 [M1_TABLE_WORDS], on ``device`` (built once per device)."""
    return _memo("tetra_m1", device, _tetra_m1_build)


def _planes14_table_build(device: str) -> torch.Tensor:
    from leechq.formats.layouts.planes14 import planes14_tables

    return torch.from_numpy(planes14_tables().kernel.copy()).to(device)


def planes14_kernel_table(device: torch.device | str) -> torch.Tensor:
    """The Planes14 class table, int32 [512, 4], on ``device``."""
    return _memo("planes14", device, _planes14_table_build)


P14_SELECTOR_WORD = 2048
"""Word offset of the level-selector table in :func:`planes14_m1_table` (after the class table)."""


def planes14_level_selectors() -> np.ndarray:
    """uint32 [4096]: for the 12-bit index ``u`` holding one quad's level-plane bits (plane k's bit
    i at bit ``4k + i``), the byte-permute selector of that quad: nibble i is the level of
    coordinate i, ``4`` if its plane-2 bit is set, else ``P0 + 2·P1`` (the Planes14 level code,
    docs/kernels.md)."""
    u = np.arange(4096, dtype=np.uint32)
    sel = np.zeros(4096, dtype=np.uint32)
    for i in range(4):
        p0, p1, p2 = (u >> i) & 1, (u >> (4 + i)) & 1, (u >> (8 + i)) & 1
        sel |= np.where(p2 == 1, 4, p0 + 2 * p1).astype(np.uint32) << (4 * i)
    return sel


def planes14_signed_classes() -> np.ndarray:
    """uint32 [512, 4]: the class table in the batch-1 Planes14 kernel's signed form, per entry
    word 0 = the magnitudes of levels 0..3 as bytes, word 1 = their negatives (two's complement
    bytes), word 2 = level 4's magnitude in byte 0 and its negative in byte 1, word 3 = the f32
    bits of ``1/√(16 m)`` (word 2 of ``planes14_tables().kernel``). A byte permute of words 0 and
    2 (selector nibble = level 0..4) gives the positive value bytes, of word 1 and word 2 >> 8 the
    negative ones — signed bytes as they are, no bias to remove."""
    from leechq.formats.layouts.planes14 import planes14_tables

    tabs = planes14_tables()
    mags = tabs.magnitudes.astype(np.uint32)
    negs = (256 - mags) & 0xFF
    out = np.zeros((mags.shape[0], 4), dtype=np.uint32)
    for lvl in range(4):
        out[:, 0] |= mags[:, lvl] << (8 * lvl)
        out[:, 1] |= negs[:, lvl] << (8 * lvl)
    out[:, 2] = mags[:, 4] | (negs[:, 4] << 8)
    out[:, 3] = tabs.kernel.view(np.uint32)[:, 2]
    return out


def _planes14_m1_build(device: str) -> torch.Tensor:
    words = np.concatenate([planes14_signed_classes().reshape(-1), planes14_level_selectors()])
    return torch.from_numpy(words.view(np.int32).copy()).to(device)


def planes14_m1_table(device: torch.device | str) -> torch.Tensor:
    """The batch-1 Planes14 kernel's table, int32 [6144] (built once per device): the class table
    in its signed form (:func:`planes14_signed_classes`, 512 × 4 words) then the level selectors
    (:func:`planes14_level_selectors`, 4096 words, at :data:`P14_SELECTOR_WORD`), staged together
    in shared memory."""
    return _memo("planes14_m1", device, _planes14_m1_build)


def _planes14_m1_order_build(device: str) -> torch.Tensor:
    t = np.arange(24)
    order = 8 * (t // 8) + 4 * (t % 2) + (t % 8) // 2
    return torch.from_numpy(order.astype(np.int32)).to(device)


def planes14_m1_order(device: torch.device | str) -> torch.Tensor:
    """int32 [24]: the block-coordinate order of the activation the batch-1 Planes14 kernel reads
    (``kernels.triton.planes14_m1``): prepared coordinate ``8k + 2j + h`` holds natural coordinate
    ``8k + 4h + j`` (record quad ``2k + h``, element ``j``), built once per device."""
    return _memo("planes14_m1_order", device, _planes14_m1_order_build)


def natural_order(device: torch.device | str) -> torch.Tensor:
    """int32 [24] identity permutation (Planes14 blocks are in natural order)."""
    return torch.arange(24, dtype=torch.int32, device=device)
