"""The ``tetra64`` served layout: each Tetra block as its decoder's table addresses and its shell.

A record in this layout is a :class:`Tetra64Weight` (a type of its own, registered as ``tetra64``
in :mod:`leechq.formats.layouts`; consumers dispatch on its ``layout``). :func:`pack`,
:func:`unpack` and :func:`concat_rows` are the layout's registry functions;
:func:`to_tetra64` / :func:`from_tetra64` convert from and to the ``tetra48`` record of the same
matrix, bit for bit.

A served form of a ``tetra48`` matrix for the batch-1 kernel (docs/kernels.md leaves
the served layout to the kernels; docs/kernels.md fixes what a word decodes to). The canonical
48-bit word (``p``, ``r``, ``s8``, ``b1``, ``i1``, ``b2``, ``i2``, ``b3``, ``i3``, gain ``g``) names
three rank-table rows and a Golay pattern; the decode turns it into

* ``R1 = i1 | r<<11``, ``R2 = i2 + 808·[i2 ≥ 1240]``, ``R3 = i3 | (p ^ r ^ [i2 ≥ 1240])<<11``: the
  rows of the three sections in the 4096-row rank table;
* ``x = s8 | b1<<6 | b2<<7 | b3<<11``: the trellis index of the pattern, which is F2-linear in
  ``x`` (``PA = x & 63``, ``PB = x >> 6`` index the kernels' two split pattern tables);
* ``m = ‖y‖² / 16``, the shell of the point, whose ``1/‖y‖`` scales the block.

This layout stores those quantities instead of the label, so the kernel spends no instruction on
field arithmetic or on the block's norm. Two further changes make the decode cheaper still:

* for ``p = 1`` the stored pattern index is ``x ^ X_ALL``, where ``X_ALL`` indexes the all-ones
  Golay codeword: the kernel then reads the complemented pattern, and every coordinate of every
  block is ``2·h − 14 − p`` in the nibbles ``h`` it builds (no sign per block);
* ``m`` is stored as ``max(m, 1)`` (the origin, and an absent odd block at the end of a row, are
  ``R = x = 0`` with ``m = 1``: their dot products with a zero activation are 0, never 0·∞).

Per block pair four u32 words (16 bytes, one 16-byte load per lane), bit 0 first:

====  =====================================================================================
word  fields
====  =====================================================================================
w0    g_e (0) · g_o (1) · R1_e·4 (2–13) · R1_o (14–25) · p_e (26) · m_e (27–31)
w1    p_o (0) · 0 (1) · R2_e·4 (2–13) · R2_o (14–25) · 0 (26) · m_o (27–31)
w2    0 (0–1) · R3_e·4 (2–13) · R3_o (14–25) · PB_o (26–31)
w3    PB_e (0–5) · 0 (6) · PA_e (7–12) · 0 (13–25) · PA_o (26–31)
====  =====================================================================================

(``_e``: the pair's even block, ``_o``: its odd block.) The even block's row fields sit where
their byte address in the table is (one mask), ``PA_e`` where the pattern entry's byte offset is
(one mask merged with the lane's copy offset), ``PA_o`` above zeros so one shift yields its
offset; the shells sit at the top of a word (one shift). Rows are ``4·ceil(n_blocks / 2)`` words.
The layout is 16 bytes per pair instead of 12: a third more weight bytes for a decode that is
roughly half the instructions (docs/kernels.md). The map is injective and :func:`from_tetra64`
inverts it bit for bit; the shells are recomputed with the codebook decoder when packing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from functools import cache
from typing import ClassVar

import numpy as np
import torch

from leechq.codebooks.tetra_tables import CLASS_ROWS, N0_MIXED
from leechq.errors import InvalidInput
from leechq.formats.layouts import tetra48
from leechq.formats.layouts.tetra48 import Tetra48Weight, TetraRecord, stride_u32
from leechq.formats.quantized_weight import QuantizedWeight

NAME = "tetra64"

MID_SHIFT = CLASS_ROWS - N0_MIXED
"""``R2 = i2 + MID_SHIFT`` for ``i2 ≥ 1240`` (the middle section's class-1 rows,
``rows[808 + i2]``; docs/kernels.md)."""
M_BITS_SHIFT = 27
CHUNK = 1 << 22
"""Blocks decoded at a time when computing shells (bounded memory on large matrices)."""

_M32 = 0xFFFFFFFF


def t64_stride(n_blocks: int) -> int:
    """u32 words per row in this layout: four per block pair."""
    return 4 * -(-n_blocks // 2)


@dataclass(frozen=True)
class Tetra64Weight(TetraRecord):
    """A Tetra-coded matrix in the served ``tetra64`` layout: ``words`` int32
    [d_out, t64_stride(n_blocks)] (the table addresses and shells of each block pair, see the
    module docstring); the other fields as :class:`~leechq.formats.layouts.tetra48.TetraRecord`.
    Read by the batch-1 ``m1``, int8 and dequantization kernels."""

    layout: ClassVar[str] = NAME

    @property
    def stride(self) -> int:
        """u32 words per row: :func:`t64_stride`."""
        return t64_stride(self.n_blocks)


def _fields(b: torch.Tensor, spec: tuple[tuple[int, int], ...]) -> list[torch.Tensor]:
    """Bit fields ``(shift, width)`` of int64 ``b``."""
    return [(b >> s) & ((1 << n) - 1) for s, n in spec]


def _to_int32(w: torch.Tensor) -> torch.Tensor:
    """u32 values held in int64 → their int32 bit pattern."""
    return torch.where(w >= 2**31, w - 2**32, w).to(torch.int32)


def _pairs(words: torch.Tensor, n_pairs: int) -> torch.Tensor:
    """int64 [d_out, n_pairs, 3]: a row's first ``3·n_pairs`` words as u32 (zero-extended)."""
    w = words.to(torch.int64) & _M32
    short = 3 * n_pairs - w.shape[1]
    if short > 0:
        w = torch.nn.functional.pad(w, (0, short))
    return w[:, : 3 * n_pairs].reshape(words.shape[0], n_pairs, 3)


def _rows(w0: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, stride: int) -> torch.Tensor:
    """int32 [d_out, stride]: the three words of each pair back to back, zero padded."""
    flat = torch.stack([w0, w1, w2], dim=-1).reshape(w0.shape[0], 3 * w0.shape[1])
    flat = torch.nn.functional.pad(flat, (0, stride - flat.shape[1]))
    return _to_int32(flat)


def blocks_from_words(words: torch.Tensor, n_blocks: int) -> torch.Tensor:
    """The canonical 48-bit words (int64 [d_out, n_blocks]) of ``tetra48`` rows (int32)."""
    t = _pairs(words, -(-n_blocks // 2))
    even = t[..., 0] | (t[..., 1] & 0xFFFF) << 32
    odd = t[..., 1] >> 16 | t[..., 2] << 16
    both = torch.stack([even, odd], dim=-1)
    return both.reshape(words.shape[0], 2 * t.shape[1])[:, :n_blocks]


def standard_words(blocks: torch.Tensor, n_blocks: int) -> torch.Tensor:
    """Standard ``tetra48`` rows (int32 [d_out, stride_u32(n_blocks)], contiguous) from canonical
    48-bit words (int64 [d_out, n_blocks]); the inverse of :func:`blocks_from_words`."""
    pad = -n_blocks % 2
    b = torch.nn.functional.pad(blocks, (0, pad)).reshape(blocks.shape[0], (n_blocks + pad) // 2, 2)
    even, odd = b[..., 0], b[..., 1]
    return _rows(even & _M32, (even >> 32) | (odd & 0xFFFF) << 16, odd >> 16,
                 stride_u32(n_blocks)).contiguous()


@cache
def x_all() -> int:
    """The 12-bit trellis index ``s8 | b1<<6 | b2<<7 | b3<<11`` of the all-ones codeword."""
    from leechq.codebooks.tetra_tables import pattern_from_columns

    x = np.arange(4096)
    hit = np.nonzero(pattern_from_columns(x) == 0xFFFFFF)[0]
    if hit.size != 1:
        raise AssertionError("the all-ones word is not a unique codeword of the Tetra trellis")
    return int(hit[0])


def shells(blocks: torch.Tensor) -> torch.Tensor:
    """``m = ‖y‖² / 16`` (int64, same shape) of canonical 48-bit words (int64), by the codebook
    decoder, in chunks of :data:`CHUNK` blocks on the words' device."""
    from leechq.codebooks.tetra import decode

    flat = blocks.reshape(-1)
    out = torch.empty_like(flat)
    for s in range(0, flat.numel(), CHUNK):
        y = decode(flat[s:s + CHUNK] & ((1 << 47) - 1), validate=False).to(torch.int32)
        out[s:s + CHUNK] = (y * y).sum(-1).to(torch.int64) // 16
    return out.reshape(blocks.shape)


def encode_blocks(blocks: torch.Tensor, m: torch.Tensor | None = None) -> torch.Tensor:
    """Canonical 48-bit words (int64 [...]) → the per-block fields of this layout as int64
    ``[..., 7]``: ``R1, R2, R3, x' (x, or x ^ X_ALL for p = 1), max(m, 1), p, g`` (``m``: the
    shells, computed when not given)."""
    p, r, s8, b1, i1, b2, i2, b3, i3, g = _fields(
        blocks, ((0, 1), (1, 1), (2, 6), (8, 1), (9, 11), (20, 4), (24, 11), (35, 1), (36, 11),
                 (47, 1)))
    dl = (i2 >= N0_MIXED).to(torch.int64)
    r1 = i1 | r << 11
    r2 = i2 + MID_SHIFT * dl
    r3 = i3 | (p ^ r ^ dl) << 11
    x = s8 | b1 << 6 | b2 << 7 | b3 << 11
    x = torch.where(p == 1, x ^ x_all(), x)
    if m is None:
        m = shells(blocks)
    return torch.stack([r1, r2, r3, x, m.clamp(min=1), p, g], dim=-1)


def decode_fields(f: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`encode_blocks` (``f`` int64 [..., 7] → canonical words int64 [...]);
    raises :class:`InvalidInput` on fields no canonical word has."""
    r1, r2, r3, x, _m, p, g = f.unbind(-1)
    dl = (r2 >= CLASS_ROWS).to(torch.int64)
    i2 = r2 - MID_SHIFT * dl
    bad = (dl == 1) & (i2 < N0_MIXED) | (dl == 0) & (r2 >= N0_MIXED) | (i2 > 2047)
    r = r1 >> 11
    if bool((bad | ((r3 >> 11) != (p ^ r ^ dl))).any()):
        raise InvalidInput("tetra64: a block's row fields match no Tetra word")
    x = torch.where(p == 1, x ^ x_all(), x)
    return (p | r << 1 | (x & 63) << 2 | ((x >> 6) & 1) << 8 | (r1 & 2047) << 9
            | ((x >> 7) & 15) << 20 | i2 << 24 | (x >> 11) << 35 | (r3 & 2047) << 36 | g << 47)


def pack_words(fields: torch.Tensor) -> torch.Tensor:
    """Per-block fields (int64 [d_out, n_blocks, 7], :func:`encode_blocks`) → rows int32
    [d_out, t64_stride(n_blocks)] (an absent odd block: the origin's fields with ``m = 1``)."""
    d_out, nb = fields.shape[:2]
    if nb % 2:
        pad = torch.zeros(d_out, 1, 7, dtype=torch.int64, device=fields.device)
        pad[..., 4] = 1
        fields = torch.cat([fields, pad], dim=1)
    e, o = fields[:, 0::2], fields[:, 1::2]
    r1e, r2e, r3e, xe, me, pe, ge = e.unbind(-1)
    r1o, r2o, r3o, xo, mo, po, go = o.unbind(-1)
    w0 = ge | go << 1 | r1e << 2 | r1o << 14 | pe << 26 | me << M_BITS_SHIFT
    w1 = po | r2e << 2 | r2o << 14 | mo << M_BITS_SHIFT
    w2 = r3e << 2 | r3o << 14 | (xo >> 6) << 26
    w3 = (xe >> 6) | (xe & 63) << 7 | (xo & 63) << 26
    flat = torch.stack([w0, w1, w2, w3], dim=-1).reshape(d_out, 4 * w0.shape[1])
    return torch.where(flat >= 2**31, flat - 2**32, flat).to(torch.int32)


def unpack_words(words: torch.Tensor, n_blocks: int) -> torch.Tensor:
    """Inverse of :func:`pack_words`: int64 [d_out, n_blocks, 7]; raises :class:`InvalidInput` on
    nonzero bits the layout keeps zero."""
    d_out = words.shape[0]
    w = (words.to(torch.int64) & _M32).reshape(d_out, words.shape[1] // 4, 4)
    w0, w1, w2, w3 = w.unbind(-1)
    zero = (w1 & 0x4000002) | (w2 & 3) | (w3 & 0x3FFE040)
    if bool((zero != 0).any()):
        raise InvalidInput("tetra64: bits the layout keeps zero are set")
    m12 = (1 << 12) - 1
    e = torch.stack([(w0 >> 2) & m12, (w1 >> 2) & m12, (w2 >> 2) & m12,
                     ((w3 >> 7) & 63) | (w3 & 63) << 6, w0 >> M_BITS_SHIFT, (w0 >> 26) & 1,
                     w0 & 1], dim=-1)
    o = torch.stack([(w0 >> 14) & m12, (w1 >> 14) & m12, (w2 >> 14) & m12,
                     (w3 >> 26) | (w2 >> 26) << 6, w1 >> M_BITS_SHIFT, w1 & 1, (w0 >> 1) & 1],
                    dim=-1)
    return torch.stack([e, o], dim=2).reshape(d_out, 2 * w.shape[1], 7)[:, :n_blocks]


def _with_words(w: TetraRecord, cls: type[TetraRecord], words: torch.Tensor) -> TetraRecord:
    """A ``cls`` record with ``w``'s fields and these ``words``, validated."""
    kept = {f.name: getattr(w, f.name) for f in dataclass_fields(w) if f.name != "words"}
    out = cls(words=words, **kept)
    out.validate()
    return out


def to_tetra64(w: Tetra48Weight) -> Tetra64Weight:
    """The same matrix in this layout from a ``tetra48`` record; the shells are decoded on the
    words' device.

    Raises:
        InvalidInput: ``w`` is not a ``tetra48`` record (e.g. already a ``tetra64`` one).
    """
    if type(w) is not Tetra48Weight:
        raise InvalidInput(f"to_tetra64: expected a tetra48 record, got "
                           f"{getattr(w, 'layout', '') or type(w).__name__}"
                           + (" (the record is in the tetra64 layout already)"
                              if isinstance(w, Tetra64Weight) else ""))
    blocks = canonical_blocks(w)
    return _with_words(w, Tetra64Weight, pack_words(encode_blocks(blocks)).contiguous())


def canonical_blocks(w: TetraRecord) -> torch.Tensor:
    """The canonical 48-bit words (int64 [d_out, n_blocks]) of a record in either Tetra layout
    (``tetra48`` or this one)."""
    if isinstance(w, Tetra64Weight):
        return decode_fields(unpack_words(w.words, w.n_blocks))
    return blocks_from_words(w.words, w.n_blocks)


def from_tetra64(w: Tetra64Weight) -> Tetra48Weight:
    """Inverse of :func:`to_tetra64`: the ``tetra48`` record, bit for bit.

    Raises:
        InvalidInput: ``w`` is not a ``tetra64`` record.
    """
    if type(w) is not Tetra64Weight:
        raise InvalidInput(f"from_tetra64: the record is not in the tetra64 layout "
                           f"({getattr(w, 'layout', '') or type(w).__name__})")
    return _with_words(w, Tetra48Weight, standard_words(canonical_blocks(w), w.n_blocks))


def pack(qw: QuantizedWeight) -> Tetra64Weight:
    """A canonical Tetra-coded matrix in this layout (``tetra48.pack`` then :func:`to_tetra64`).

    Raises:
        InvalidInput: as ``tetra48.pack``.
    """
    return to_tetra64(tetra48.pack(qw))


def unpack(w: Tetra64Weight) -> QuantizedWeight:
    """The canonical matrix back from a (single-matrix) ``tetra64`` record, bit for bit."""
    return tetra48.unpack(from_tetra64(w))


def concat_rows(parts: Sequence[Tetra64Weight]) -> Tetra64Weight:
    """``tetra48.concat_rows`` for records in this layout (every part a :class:`Tetra64Weight`)."""
    return tetra48.concat_records(parts, Tetra64Weight)  # type: ignore[return-value]


__all__ = ["NAME", "Tetra64Weight", "blocks_from_words", "canonical_blocks", "concat_rows",
           "decode_fields", "encode_blocks", "from_tetra64", "pack", "pack_words", "shells",
           "standard_words", "t64_stride", "to_tetra64", "unpack", "unpack_words", "x_all"]
