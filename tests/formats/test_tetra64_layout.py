"""The ``tetra64`` served layout (``formats.layouts.tetra64``): the all-ones pattern index, the
fields against a decode of the canonical word (rows of the three sections, pattern, shell), the
round trip through the ``tetra48`` record (distinct types), the row packing's positions and zero
bits, and the errors."""

from __future__ import annotations

import pytest
import torch

from leechq.codebooks.tetra import decode
from leechq.codebooks.tetra_tables import pattern_from_columns
from leechq.errors import InvalidInput
from leechq.formats.layouts import tetra48
from leechq.formats.layouts import tetra64 as T


def _random_blocks(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2**48, (n,), generator=g, dtype=torch.int64)


def test_x_all_is_the_all_ones_codeword() -> None:
    assert int(pattern_from_columns(T.x_all())) == 0xFFFFFF


def test_fields_follow_the_decode() -> None:
    """Per block: the three rows are those the decode reads (docs/codebooks.md §3.4), the pattern
    index is x (x ^ X_ALL for p = 1: the complemented codeword), the shell is ‖y‖²/16 (1 for the
    origin), p and g as in the word."""
    b = torch.cat([torch.tensor([0, 1 << 47, 1]), _random_blocks(4000, 1)])
    f = T.encode_blocks(b)
    p, r = b & 1, (b >> 1) & 1
    i1, i2, i3 = (b >> 9) & 2047, (b >> 24) & 2047, (b >> 36) & 2047
    dl = (i2 >= 1240).long()
    assert torch.equal(f[:, 0], i1 + 2048 * r)
    assert torch.equal(f[:, 1], torch.where(dl == 1, 2048 + i2 - 1240, i2))
    assert torch.equal(f[:, 2], i3 + 2048 * (p ^ r ^ dl))
    x = ((b >> 2) & 63) | ((b >> 8) & 1) << 6 | ((b >> 20) & 15) << 7 | ((b >> 35) & 1) << 11
    pat = torch.from_numpy(pattern_from_columns(f[:, 3].numpy()))
    want = torch.from_numpy(pattern_from_columns(x.numpy()))
    assert torch.equal(pat, torch.where(p == 1, want ^ 0xFFFFFF, want))
    y = decode(b & ((1 << 47) - 1))
    n2 = (y.long() ** 2).sum(-1)
    assert torch.equal(f[:, 4], (n2 // 16).clamp(min=1))
    assert bool((n2 % 16 == 0).all()) and int(f[0, 4]) == 1 and int(f[1, 4]) == 1
    assert torch.equal(f[:, 5], p) and torch.equal(f[:, 6], b >> 47)
    assert torch.equal(T.decode_fields(f), b)


def test_words_positions_and_zero_bits() -> None:
    """Every field lands where the module's table says, and the bits it keeps zero are."""
    f = T.encode_blocks(_random_blocks(2 * 3 * 50, 2)).reshape(3, 100, 7)
    w = T.pack_words(f).long() & 0xFFFFFFFF
    assert w.shape == (3, 200)
    w0, w1, w2, w3 = w.reshape(3, 50, 4).unbind(-1)
    e, o = f[:, 0::2], f[:, 1::2]
    assert torch.equal(w0 & 0x3FFC, 4 * e[..., 0])
    assert torch.equal((w0 >> 12) & 0x3FFC, 4 * o[..., 0])
    assert torch.equal(w1 & 0x3FFC, 4 * e[..., 1])
    assert torch.equal(w2 & 0x3FFC, 4 * e[..., 2])
    assert torch.equal((w2 >> 12) & 0x3FFC, 4 * o[..., 2])
    assert torch.equal(w3 & 0x1F80, 128 * (e[..., 3] & 63))
    assert torch.equal(w3 >> 19, 128 * (o[..., 3] & 63))  # PA_o above zeros: one shift
    assert torch.equal((w3 << 7) & 0x1F80, 128 * (e[..., 3] >> 6))
    assert torch.equal((w2 >> 19) & 0x1F80, 128 * (o[..., 3] >> 6))
    assert torch.equal(w0 >> 27, e[..., 4]) and torch.equal(w1 >> 27, o[..., 4])
    assert torch.equal(w0 & 1, e[..., 6]) and torch.equal((w0 >> 1) & 1, o[..., 6])
    assert torch.equal((w0 >> 26) & 1, e[..., 5]) and torch.equal(w1 & 1, o[..., 5])
    assert torch.equal(T.unpack_words(T.pack_words(f), 100), f)


@pytest.mark.parametrize(("d_out", "d_in"), [(5, 24 * 7 + 3), (4, 24 * 8), (3, 24), (2, 23)])
def test_round_trip(d_out: int, d_in: int) -> None:
    """tetra48 → tetra64 → tetra48 bit for bit, each in its own record type; an odd block count
    pads the last pair with the origin (shell 1)."""
    w = tetra48.random_tetra48(d_out, d_in, seed=d_in)
    x = T.to_tetra64(w)
    assert type(x) is T.Tetra64Weight and x.layout == "tetra64" and w.layout == "tetra48"
    assert x.words.shape == (d_out, T.t64_stride(w.n_blocks))
    back = T.from_tetra64(x)
    assert type(back) is tetra48.Tetra48Weight and torch.equal(back.words, w.words)
    assert torch.equal(T.canonical_blocks(x), T.blocks_from_words(w.words, w.n_blocks))
    if w.n_blocks:
        assert torch.equal(T.unpack(x).labels, tetra48.unpack(w).labels)
    if w.n_blocks % 2:  # the absent odd block: R = x = p = g = 0, m = 1
        last = x.words[:, -4:].long() & 0xFFFFFFFF
        w0, w1, w2, w3 = last.unbind(1)
        assert bool((((w0 >> 14) & 0xFFF) | ((w0 >> 1) & 1) == 0).all())
        assert bool((((w1 >> 14) & 0xFFF) | (w1 & 1) == 0).all()) and bool((w1 >> 27 == 1).all())
        assert bool((((w2 >> 14) & 0xFFF) | (w2 >> 26) | (w3 >> 26) == 0).all())


def test_concat_and_errors() -> None:
    a = T.to_tetra64(tetra48.random_tetra48(3, 48, seed=1))
    b = T.to_tetra64(tetra48.random_tetra48(2, 48, seed=2))
    cat = T.concat_rows([a, b])
    assert type(cat) is T.Tetra64Weight and cat.d_out == 5
    with pytest.raises(InvalidInput, match="expected a tetra64 record"):
        T.concat_rows([a, tetra48.random_tetra48(2, 48, seed=2)])
    with pytest.raises(InvalidInput, match="expected a tetra48 record"):
        tetra48.concat_rows([tetra48.random_tetra48(2, 48, seed=2), a])
    with pytest.raises(InvalidInput, match="expected a tetra48 record"):
        tetra48.unpack(a)  # a tetra64 record is unpacked by its own layout
    with pytest.raises(InvalidInput, match="already"):
        T.to_tetra64(a)
    with pytest.raises(InvalidInput, match="not in the tetra64"):
        T.from_tetra64(tetra48.random_tetra48(2, 48))
    bad = a.words.clone()
    bad[0, 3] |= 1 << 6  # a bit the layout keeps zero
    with pytest.raises(InvalidInput, match="zero"):
        T.unpack_words(bad, a.n_blocks)
    f = T.encode_blocks(_random_blocks(4, 3))
    f[0, 1] = 1500  # a middle-section row between the two classes
    with pytest.raises(InvalidInput, match="row fields"):
        T.decode_fields(f)
