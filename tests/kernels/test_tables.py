"""The derived device tables: the batch-1 Tetra table decodes every word like the codebook."""

from __future__ import annotations

import numpy as np
import torch

from leechq.codebooks.tetra import decode
from leechq.codebooks.tetra_tables import tetra_tables
from leechq.kernels import tables as T


def _decode_m1(words: np.ndarray, copy: np.ndarray | int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Decode 48-bit words with the batch-1 table exactly as the kernel does (numpy), reading
    pattern-table copy ``copy`` (per word or one for all): trio-order values [N, 24] and
    ‖y‖² [N]."""
    tab = T.tetra_m1_table_numpy().astype(np.int64)
    lo, hi = words & 0xFFFFFFFF, words >> 32
    p, r = lo & 1, (lo >> 1) & 1
    v20 = ((lo >> 20) | (hi << 12)) & 0xFFFFFFFF
    pa_entry = (lo >> 2) & 63
    pb_entry = ((lo >> 8) & 1) | ((v20 & 15) << 1) | (((v20 >> 15) & 1) << 5)
    sa = tab[T.M1_PA_WORD + (((pa_entry << 3) + copy) << 2)[:, None] + np.arange(3)]
    sb = tab[T.M1_PB_WORD + (((pb_entry << 3) + copy) << 2)[:, None] + np.arange(3)]
    i1 = ((lo >> 9) & 2047) | (r << 11)
    i2 = (v20 >> 4) & 2047
    dl = (i2 >= 1240).astype(np.int64)
    i3 = ((v20 >> 16) & 2047) | ((p ^ r ^ dl) << 11)
    vals = np.zeros((len(words), 24), dtype=np.int64)
    for k, idx in enumerate((i1, i2 + T.M1_MID_SHIFT * dl, i3)):
        h = tab[idx] ^ sa[:, k] ^ sb[:, k]
        nib = (h[:, None] >> (4 * np.arange(8))) & 15
        vals[:, 8 * k : 8 * k + 8] = p[:, None] + (1 - 2 * p[:, None]) * 2 * (nib - 7)
    return vals, (vals * vals).sum(1)


def test_m1_table_decodes_like_the_codebook() -> None:
    rng = np.random.default_rng(7)
    words = rng.integers(0, 1 << 48, 20000, dtype=np.int64)
    words[:3] = [0, (1 << 48) - 1, 1 << 47]  # origin, all ones, gain bit only
    copy = np.arange(len(words)) % T.M1_COPIES
    vals, n2 = _decode_m1(words, copy=copy)
    pts = decode(torch.from_numpy(words & ((1 << 47) - 1))).numpy().astype(np.int64)
    order = tetra_tables().order.astype(np.int64)
    assert np.array_equal(vals, pts[:, order])
    # every copy is the same table
    tab = T.tetra_m1_table_numpy()
    for first, last in ((T.M1_PA_WORD, T.M1_PB_WORD), (T.M1_PB_WORD, T.M1_TABLE_WORDS)):
        part = tab[first:last].reshape(64, T.M1_COPIES, 4)
        assert (part == part[:, :1]).all() and part[:, 0, :3].any()
    # the 1/‖y‖ lookup of the dequantization kernel (word 3 of PA entry ‖y‖² / 16, any copy)
    invn = tab[T.M1_PA_WORD + ((n2 << 1) & 0x3E0) + 4 * copy + 3].view(np.float32)
    want = np.where(n2 > 0, 1.0 / np.sqrt(np.maximum(n2, 1)), 0.0)
    assert np.allclose(invn, want, rtol=1e-7, atol=0)
    assert n2.max() < 512 and np.all(n2 % 16 == 0)


def test_m1_offsets_match_the_kernel() -> None:
    from leechq.codebooks.tetra_tables import CLASS_ROWS, N0_MIXED
    from leechq.kernels.triton import tetra48_decode as K

    assert (K.PA_WORD.value, K.PB_WORD.value, K.TABLE_WORDS.value, K.MID_SHIFT.value) == (
        T.M1_PA_WORD, T.M1_PB_WORD, T.M1_TABLE_WORDS, T.M1_MID_SHIFT)
    assert T.M1_MID_SHIFT == CLASS_ROWS - N0_MIXED
    assert T.M1_TABLE_WORDS == 8192  # the staging copies two 4096-word ranges; 32 KiB reserved


def test_planes14_level_selectors() -> None:
    """The selector table against the level code, on all 4096 plane-nibble triples."""
    sel = T.planes14_level_selectors()
    for u in range(4096):
        for i in range(4):
            p0, p1, p2 = (u >> i) & 1, (u >> (4 + i)) & 1, (u >> (8 + i)) & 1
            assert (int(sel[u]) >> (4 * i)) & 15 == (4 if p2 else p0 + 2 * p1)
    table = T.planes14_m1_table("cpu")
    from leechq.kernels.triton import planes14_m1 as P

    assert table.shape == (P.TABLE_WORDS.value,) and P.SELECTOR_WORD.value == T.P14_SELECTOR_WORD
    assert P.TABLE_PARTS.value * P.TABLE_PART.value == P.TABLE_WORDS.value  # what is staged
    assert torch.equal(table[:2048], torch.from_numpy(
        T.planes14_signed_classes().reshape(-1).view(np.int32)))


def test_planes14_signed_classes() -> None:
    """The signed class entries: a byte permute by level (0..4) of words 0 and 2 gives +|v_l|,
    of word 1 and word 2 >> 8 gives −|v_l|, as int8; word 3 is the kernel form's 1/√(16 m)."""
    from leechq.formats.layouts.planes14 import planes14_tables

    tabs = planes14_tables()
    ent = T.planes14_signed_classes()
    for lvl in range(5):
        pos = np.where(lvl < 4, ent[:, 0] >> (8 * lvl), ent[:, 2]) & 0xFF
        neg = np.where(lvl < 4, ent[:, 1] >> (8 * lvl), ent[:, 2] >> 8) & 0xFF
        assert np.array_equal(pos.astype(np.uint8).view(np.int8), tabs.magnitudes[:, lvl])
        assert np.array_equal(neg.astype(np.uint8).view(np.int8), -tabs.magnitudes[:, lvl])
    assert np.array_equal(ent[:, 3], tabs.kernel.view(np.uint32)[:, 2])
