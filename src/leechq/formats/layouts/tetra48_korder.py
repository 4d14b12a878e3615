"""Kernel order: the ``tetra48`` words with each block's fields where the batch-1 decode wants them.

A pure, bijective bit reordering of the served ``tetra48`` layout (layouts-kernels-recipe.md §2.7
leaves the served bit order to the kernels; tetra-format.md §4.1 fixes the canonical word). The
canonical 48-bit word holds, from bit 0: ``p`` (1), ``r`` (1), ``s8`` (6), ``b1`` (1), ``i1``
(11), ``b2`` (4), ``i2`` (11), ``b3`` (1), ``i3`` (11), the gain bit ``g`` (1). The batch-1
decode (``kernels.triton.tetra48_m1``) reads four tables with them: the first section's rank row
``i1 | r<<11``, the last section's ``i3 | (p ^ r ^ dl)<<11`` (``dl``: whether ``i2`` is in the
middle section's second class), and the two pattern entries ``s8`` and ``b1 | b2<<1 | b3<<5``.
Kernel order stores, from bit 0:

====== ======================= ====
bits   field                   width
====== ======================= ====
0–11   ``i1 | r<<11``          12
12–23  ``i3 | (p ^ r)<<11``    12
24–29  ``s8``                  6
30–35  ``b1 | b2<<1 | b3<<5``  6
36–46  ``i2``                  11
47     ``g``                   1
====== ======================= ====

so each table address is one mask (or a shift and a mask) from the word, ``p`` is the XOR of bits
11 and 23, and only ``dl`` is computed. A block pair takes three u32 words as in ``tetra48`` but
split differently: ``w0`` = the even block's bits 0–31, ``w1`` = the odd block's bits 0–31,
``w2`` = the two blocks' bits 32–47 (even block in the low half), so neither block needs a funnel
shift. Rows are padded to :func:`~leechq.formats.layouts.tetra48.korder_stride` words (three per
pair, rounded up to an even count). Every 48-bit word is legal in both orders, and a zero block
(absent odd block of a row) stays zero.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from leechq.errors import InvalidInput
from leechq.formats.layouts.tetra48 import Tetra48Weight, korder_stride, stride_u32

_M32 = 0xFFFFFFFF


def _fields(b: torch.Tensor, spec: tuple[tuple[int, int], ...]) -> list[torch.Tensor]:
    """Bit fields ``(shift, width)`` of int64 ``b``."""
    return [(b >> s) & ((1 << n) - 1) for s, n in spec]


def kernel_order_blocks(blocks: torch.Tensor) -> torch.Tensor:
    """Canonical 48-bit words (int64, any shape) → kernel order (int64, same shape)."""
    p, r, s8, b1, i1, b2, i2, b3, i3, g = _fields(
        blocks, ((0, 1), (1, 1), (2, 6), (8, 1), (9, 11), (20, 4), (24, 11), (35, 1), (36, 11),
                 (47, 1)))
    return ((i1 | r << 11) | (i3 | (p ^ r) << 11) << 12 | s8 << 24
            | (b1 | b2 << 1 | b3 << 5) << 30 | i2 << 36 | g << 47)


def standard_order_blocks(kblocks: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`kernel_order_blocks`."""
    f1, f3, s8, b6, i2, g = _fields(kblocks, ((0, 12), (12, 12), (24, 6), (30, 6), (36, 11),
                                               (47, 1)))
    r = f1 >> 11
    p = (f3 >> 11) ^ r
    return (p | r << 1 | s8 << 2 | (b6 & 1) << 8 | (f1 & 2047) << 9 | ((b6 >> 1) & 15) << 20
            | i2 << 24 | (b6 >> 5) << 35 | (f3 & 2047) << 36 | g << 47)


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


def korder_words(kblocks: torch.Tensor, n_blocks: int) -> torch.Tensor:
    """Kernel-order rows (int32 [d_out, korder_stride(n_blocks)]) from kernel-order words."""
    pad = -n_blocks % 2
    k = torch.nn.functional.pad(kblocks, (0, pad))
    k = k.reshape(kblocks.shape[0], (n_blocks + pad) // 2, 2)
    even, odd = k[..., 0], k[..., 1]
    return _rows(even & _M32, odd & _M32, even >> 32 | (odd >> 32) << 16,
                 korder_stride(n_blocks))


def korder_blocks(words: torch.Tensor, n_blocks: int) -> torch.Tensor:
    """Inverse of :func:`korder_words`: kernel-order words int64 [d_out, n_blocks]."""
    t = _pairs(words, -(-n_blocks // 2))
    even = t[..., 0] | (t[..., 2] & 0xFFFF) << 32
    odd = t[..., 1] | (t[..., 2] >> 16) << 32
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


def to_kernel_order(w: Tetra48Weight) -> Tetra48Weight:
    """The same matrix with its words in kernel order (``korder=True``); only the batch-1
    ``m1`` kernel reads it (``kernels.triton.ops.tetra48_matvec_prepared``)."""
    if w.korder:
        raise InvalidInput("to_kernel_order: the words are in kernel order already")
    k = kernel_order_blocks(blocks_from_words(w.words, w.n_blocks))
    out = replace(w, words=korder_words(k, w.n_blocks).contiguous(), korder=True)
    out.validate()
    return out


def to_standard_order(w: Tetra48Weight) -> Tetra48Weight:
    """Inverse of :func:`to_kernel_order` (bit for bit)."""
    if not w.korder:
        raise InvalidInput("to_standard_order: the words are in the standard order already")
    words = standard_words(standard_order_blocks(korder_blocks(w.words, w.n_blocks)), w.n_blocks)
    out = replace(w, words=words, korder=False)
    out.validate()
    return out
