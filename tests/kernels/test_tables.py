"""The derived device tables: the batch-1 Tetra table decodes every word like the codebook."""

from __future__ import annotations

import numpy as np
import torch

from leechq.codebooks.tetra import decode
from leechq.codebooks.tetra_tables import tetra_tables
from leechq.kernels import tables as T


def _decode_m1(words: np.ndarray, copy: np.ndarray | int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Decode 48-bit words with the batch-1 table exactly as the kernel does (numpy), reading
    ``SB`` copy ``copy`` (per word or one for all): trio-order values [N, 24] and ‖y‖² [N]."""
    tab = T.tetra_m1_table_numpy().astype(np.int64)
    lo, hi = words & 0xFFFFFFFF, words >> 32
    p, r = lo & 1, (lo >> 1) & 1
    v20 = ((lo >> 20) | (hi << 12)) & 0xFFFFFFFF
    sa = tab[T.M1_SA_WORD + (lo & 0x1FC)[:, None] + np.arange(3)]
    sb_entry = (v20 & 15) | ((v20 >> 11) & 16)
    sb = tab[T.M1_SB_WORD + (((sb_entry << 3) + copy) << 2)[:, None] + np.arange(3)]
    i1 = ((lo >> 9) & 2047) | (r << 11)
    i2 = (v20 >> 4) & 2047
    dl = (i2 >= 1240).astype(np.int64)
    i3 = ((v20 >> 16) & 2047) | ((p ^ r ^ dl) << 11)
    vals = np.zeros((len(words), 24), dtype=np.int64)
    for k, idx in enumerate((i1, T.M1_MID_WORD + i2, i3)):
        h = tab[idx] ^ sa[:, k] ^ sb[:, k]
        nib = (h[:, None] >> (4 * np.arange(8))) & 15
        vals[:, 8 * k : 8 * k + 8] = p[:, None] + (1 - 2 * p[:, None]) * 2 * (nib - 7)
    return vals, (vals * vals).sum(1)


def test_m1_table_decodes_like_the_codebook() -> None:
    rng = np.random.default_rng(7)
    words = rng.integers(0, 1 << 48, 20000, dtype=np.int64)
    words[:3] = [0, (1 << 48) - 1, 1 << 47]  # origin, all ones, gain bit only
    vals, n2 = _decode_m1(words, copy=np.arange(len(words)) % T.M1_SB_COPIES)
    pts = decode(torch.from_numpy(words & ((1 << 47) - 1))).numpy().astype(np.int64)
    order = tetra_tables().order.astype(np.int64)
    assert np.array_equal(vals, pts[:, order])
    # every SB copy is the same table
    tab = T.tetra_m1_table_numpy()
    sb = tab[T.M1_SB_WORD:T.M1_INVNORM_WORD].reshape(32, T.M1_SB_COPIES, 4)
    assert (sb == sb[:, :1]).all() and sb[:, 0, :3].any()
    # the kernel's 1/‖y‖ lookup by squared norm (one word per ‖y‖² / 16)
    invn = tab[T.M1_INVNORM_WORD + ((n2 >> 4) & 31)].view(np.float32)
    want = np.where(n2 > 0, 1.0 / np.sqrt(np.maximum(n2, 1)), 0.0)
    assert np.allclose(invn, want, rtol=1e-7, atol=0)
    assert n2.max() < 512 and np.all(n2 % 16 == 0)


def test_m1_offsets_match_the_kernel() -> None:
    from leechq.kernels.triton import tetra48_m1 as K

    assert (K.SA_WORD.value, K.SB_WORD.value, K.INVNORM_WORD.value, K.MID_WORD.value,
            K.TABLE_WORDS.value) == (T.M1_SA_WORD, T.M1_SB_WORD, T.M1_INVNORM_WORD, T.M1_MID_WORD,
                                     T.M1_TABLE_WORDS)
    assert T.M1_TABLE_WORDS <= 8192  # the kernel reserves 32 KiB of shared memory


def test_inverse_order_is_cached() -> None:
    tabs = T.tetra_kernel_tables("cpu")
    assert torch.equal(tabs.order[tabs.inv_order.long()], torch.arange(24, dtype=torch.int32))
