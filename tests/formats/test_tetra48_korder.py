"""Kernel order of the ``tetra48`` words (``formats.layouts.tetra48_korder``): field positions
against the canonical word, the bijection on all 48-bit words, the row packing and its round
trip, and the weight-level conversions."""

from __future__ import annotations

import pytest
import torch

from leechq.errors import InvalidInput
from leechq.formats.layouts import tetra48
from leechq.formats.layouts import tetra48_korder as K


def _canonical(p: int, r: int, s8: int, b1: int, i1: int, b2: int, i2: int, b3: int, i3: int,
               g: int) -> int:
    """A canonical 48-bit word from its fields (tetra-format.md §4.1 bit order)."""
    return (p | r << 1 | s8 << 2 | b1 << 8 | i1 << 9 | b2 << 20 | i2 << 24 | b3 << 35 | i3 << 36
            | g << 47)


@pytest.mark.parametrize("fields", [
    (0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
    (1, 0, 0, 0, 0, 0, 0, 0, 0, 0),
    (0, 1, 0, 0, 0, 0, 0, 0, 0, 0),
    (1, 1, 63, 1, 2047, 15, 2047, 1, 2047, 1),
    (0, 1, 37, 0, 1239, 9, 1240, 1, 5, 0),
    (1, 0, 5, 1, 3, 6, 1239, 0, 2046, 1),
])
def test_field_positions(fields: tuple[int, ...]) -> None:
    """Each field lands where the module's table says: ``i1 | r<<11`` at 0, ``i3 | (p^r)<<11``
    at 12, ``s8`` at 24, ``b1 | b2<<1 | b3<<5`` at 30, ``i2`` at 36, ``g`` at 47."""
    p, r, s8, b1, i1, b2, i2, b3, i3, g = fields
    word = torch.tensor([_canonical(*fields)], dtype=torch.int64)
    k = int(K.kernel_order_blocks(word)[0])
    assert k & 0xFFF == i1 | r << 11
    assert (k >> 12) & 0xFFF == i3 | (p ^ r) << 11
    assert (k >> 24) & 63 == s8
    assert (k >> 30) & 63 == b1 | b2 << 1 | b3 << 5
    assert (k >> 36) & 2047 == i2
    assert k >> 47 == g
    assert int(K.standard_order_blocks(torch.tensor([k]))[0]) == int(word[0])


def test_bijection_on_48_bit_words() -> None:
    """Random and extreme 48-bit words: both maps stay below 2^48 and invert each other (so every
    kernel-order word is legal, as every canonical one is); zero maps to zero."""
    g = torch.Generator().manual_seed(3)
    x = torch.randint(0, 2**48, (200_000,), dtype=torch.int64, generator=g)
    x = torch.cat([x, torch.tensor([0, 2**48 - 1, 1 << 47, 1])])
    k = K.kernel_order_blocks(x)
    assert int(k.min()) >= 0 and int(k.max()) < 2**48
    assert torch.equal(K.standard_order_blocks(k), x)
    assert torch.equal(K.kernel_order_blocks(K.standard_order_blocks(x)), x)
    assert int(K.kernel_order_blocks(torch.zeros(1, dtype=torch.int64))[0]) == 0
    assert len(torch.unique(k)) == len(torch.unique(x))


@pytest.mark.parametrize(("nb", "stride"), [(1, 4), (2, 4), (3, 6), (4, 6), (5, 10), (170, 256),
                                            (171, 258), (213, 322), (512, 768)])
def test_korder_stride(nb: int, stride: int) -> None:
    """Three words per block pair rounded up to an even count, never less than three per pair."""
    assert tetra48.korder_stride(nb) == stride
    assert stride >= 3 * -(-nb // 2) and stride % 2 == 0
    if nb % 2 == 0:
        assert stride == tetra48.stride_u32(nb)


@pytest.mark.parametrize("nb", [1, 2, 3, 7, 170, 171])
def test_row_packing(nb: int) -> None:
    """The pair words: ``w0`` the even block's bits 0–31, ``w1`` the odd block's, ``w2`` both
    blocks' bits 32–47 (even in the low half); the row's blocks read back exactly from either
    order, and an odd count's absent block is zeros."""
    w = tetra48.random_tetra48(5, 24 * nb + 3, seed=nb)
    blocks = K.blocks_from_words(w.words, nb)
    kb = K.kernel_order_blocks(blocks)
    rows = K.korder_words(kb, nb)
    assert rows.dtype == torch.int32 and rows.shape == (5, tetra48.korder_stride(nb))
    u = rows.to(torch.int64) & 0xFFFFFFFF
    for b in range(nb):
        pair, odd = divmod(b, 2)
        lo = u[:, 3 * pair + odd]
        hi = (u[:, 3 * pair + 2] >> (16 * odd)) & 0xFFFF
        assert torch.equal(lo | hi << 32, kb[:, b])
    if nb % 2:
        assert not u[:, 3 * (nb // 2) + 1].any() and not (u[:, 3 * (nb // 2) + 2] >> 16).any()
    assert not u[:, 3 * -(-nb // 2):].any()  # row padding
    assert torch.equal(K.korder_blocks(rows, nb), kb)


@pytest.mark.parametrize("d_in", [24, 24 * 9 + 5, 24 * 170 + 16, 24 * 213 + 8])
def test_weight_round_trip(d_in: int) -> None:
    """``to_kernel_order`` then ``to_standard_order`` gives the words back bit for bit; the
    kernel-order record validates with its stride, unpacks to the same canonical matrix, and
    concatenates by rows only with records of its own order."""
    w = tetra48.random_tetra48(9, d_in, seed=d_in)
    k = K.to_kernel_order(w)
    assert k.korder and k.stride == tetra48.korder_stride(w.n_blocks)
    assert k.words.shape == (9, k.stride)
    back = K.to_standard_order(k)
    assert not back.korder and torch.equal(back.words, w.words)
    a, b = tetra48.unpack(w), tetra48.unpack(k)
    assert torch.equal(a.labels, b.labels) and torch.equal(a.gains, b.gains)
    both = tetra48.concat_rows([k, K.to_kernel_order(tetra48.random_tetra48(4, d_in, seed=1))])
    assert both.korder and both.d_out == 13
    with pytest.raises(InvalidInput, match="word order"):
        tetra48.concat_rows([k, w])
    with pytest.raises(InvalidInput, match="kernel order already"):
        K.to_kernel_order(k)
    with pytest.raises(InvalidInput, match="standard order already"):
        K.to_standard_order(w)
