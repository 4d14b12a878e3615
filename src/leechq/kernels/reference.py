"""Pure-torch reference twins of every kernel: the oracle for tests and the CPU path.

Each function has the signature of its Triton twin (``leechq.kernels.triton.ops``) and computes in
float64 from the *same packed bytes* the kernel reads, through an independent decode (the codebook's
own decoder for Tetra words, the class table's magnitudes for Planes14 records), then narrows the
result to float32 once. Works on any device (CPU tensors stay on the CPU).

Contracts (shapes; docs/kernels.md has the tolerances):

* ``rotate(x [M, n] float, rotation) -> [M, n] f32``: ``Q x`` (docs/kernels.md, forward).
* ``norm_rotate(x [M, n], weight [n], eps, rotation, delta=None)`` → ``(r, y)``: ``r = x + delta``
  [M, n] in x's dtype, ``y = Q·rms_norm(r)`` [M, n] f32 (the pre-op the rotation kernels fuse,
  docs/kernels.md).
* ``silu_mul_rotate(gate_up [M, 2n], dtype, rotation) -> [M, n] f32``: ``Q·silu_mul(gate_up)``.
* ``prepare_activation(x [M, d_in] float, n_blocks, order [24] int) -> [MP, 48·NPP + 32] f32``
  (and its inverse, ``unprepare_activation``).
* ``tetra48_matvec(x [M, d_in] f32, w: Tetra48Weight) -> [M, d_out] f32``, x in the rotated basis.
* ``planes14_matvec(x [M, d_in] f32, w: Planes14Weight) -> [M, d_out] f32``.
* ``int4_matvec(x [M, d_in], w: Int4Weight) / int8_matvec(x, w: Int8Weight) -> [M, d_out] f32``.
* ``int4_embedding(ids [T] int, table: Int4Weight) / int8_embedding -> [T, d] f32``.
* ``decode_attention(q [B, n_kv, G, hd], k_cache, v_cache [B, n_kv, S, hd], slot [1], pad [B],
  scale) -> [B, n_kv, G, hd] f32``: one query position per row over a static cache.

:func:`row_bound_error` is the measure the kernels are held to against these references.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from leechq.codebooks.base import BLOCK
from leechq.errors import InvalidInput

if TYPE_CHECKING:
    from leechq.formats.int8_weight import Int8Weight
    from leechq.formats.layouts.planes14 import Planes14Weight
    from leechq.formats.layouts.tetra48 import Tetra48Weight
    from leechq.formats.quantized_weight import Int4Weight
    from leechq.formats.rotation import RotationTables


def _as_matrix(x: torch.Tensor, d_in: int, what: str = "x") -> torch.Tensor:
    if x.dim() != 2 or x.shape[1] != d_in:
        raise InvalidInput(f"{what} must be [M, {d_in}], got {list(x.shape)}")
    if not x.is_floating_point():
        raise InvalidInput(f"{what} must be a float tensor, got {x.dtype}")
    return x


# ------------------------------------------------------------------------------------ activation


def rotate(x: torch.Tensor, rotation: RotationTables) -> torch.Tensor:
    """``Q x`` row by row in float64 (leechq.formats.rotation.apply_rotation), narrowed to f32."""
    from leechq.formats.rotation import apply_rotation

    x = _as_matrix(x, rotation.n)
    return apply_rotation(x.to(torch.float64), rotation).to(torch.float32)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF RMSNorm over the last dimension: normalise in f32, narrow to ``x.dtype``, multiply by
    ``weight`` (the product in the promoted dtype). Shapes as ``x``."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def silu_mul(gate_up: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """SwiGLU on a gate|up tensor [..., 2·I] → [..., I] of ``dtype`` (computed in the input's
    dtype: float32 when a fused quantized group produced it)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(dtype)


def norm_rotate(x: torch.Tensor, weight: torch.Tensor, eps: float, rotation: RotationTables,
                delta: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(r, Q·rms_norm(r))`` with ``r = x + delta`` narrowed to x's dtype (``x`` without
    ``delta``): the norm in torch (:func:`rms_norm`), the rotation in float64 (:func:`rotate`).
    x [M, n], weight [n], delta None or [M, n]; returns x's dtype [M, n] and float32 [M, n]."""
    x = _as_matrix(x, rotation.n)
    r = x if delta is None else x + delta.to(x.dtype)
    return r, rotate(rms_norm(r, weight, eps), rotation)


def silu_mul_rotate(gate_up: torch.Tensor, dtype: torch.dtype,
                    rotation: RotationTables) -> torch.Tensor:
    """``Q·silu_mul(gate_up, dtype)``: SwiGLU in torch (:func:`silu_mul`), the rotation in float64.
    gate_up [M, 2n] → float32 [M, n]."""
    gate_up = _as_matrix(gate_up, 2 * rotation.n, "gate_up")
    return rotate(silu_mul(gate_up, dtype), rotation)


PAIR_PAD = 64
"""Pairs per prepared row are padded to a multiple of this (the largest pair tile of the kernels)."""


def prepared_pairs(n_blocks: int) -> int:
    """NPP: ``ceil(n_blocks / 2)`` rounded up to a multiple of 64."""
    n_pairs = -(-n_blocks // 2)
    return -(-n_pairs // PAIR_PAD) * PAIR_PAD


def prepared_width(n_blocks: int) -> int:
    """Width of a prepared activation row: ``48·NPP + 32``."""
    return 48 * prepared_pairs(n_blocks) + 32


def prepared_rows(m_rows: int) -> int:
    """Rows of a prepared activation: the next power of two ≥ M."""
    return 1 << max(0, (m_rows - 1).bit_length())


def prepare_activation(x: torch.Tensor, n_blocks: int, order: torch.Tensor) -> torch.Tensor:
    """The prepared layout (``leechq.kernels.triton.activation``) of ``x``: float32 [MP, width].

    Args:
        x: float [M, d_in] with ``d_in // 24 == n_blocks`` and ``d_in % 24 ≤ 32``.
        n_blocks: blocks per row.
        order: int [24], position t of a block reads natural coordinate ``order[t]``.
    """
    m_rows, d_in = x.shape
    if d_in // BLOCK != n_blocks:
        raise InvalidInput(f"x has {d_in} columns, not {n_blocks} blocks of 24 (+ tail)")
    npp = prepared_pairs(n_blocks)
    out = torch.zeros(prepared_rows(m_rows), prepared_width(n_blocks), dtype=torch.float32,
                      device=x.device)
    xf = x.to(torch.float32)
    blocks = xf[:, : n_blocks * BLOCK].reshape(m_rows, n_blocks, BLOCK)
    blocks = blocks[:, :, order.long().to(x.device)]  # [M, nb, 24] in position order
    padded = torch.zeros(m_rows, 2 * npp, BLOCK, dtype=torch.float32, device=x.device)
    padded[:, :n_blocks] = blocks
    # [M, pair, parity, t] -> [M, parity, t, pair]
    body = padded.reshape(m_rows, npp, 2, BLOCK).permute(0, 2, 3, 1).reshape(m_rows, -1)
    out[:m_rows, : 48 * npp] = body
    tail = d_in - n_blocks * BLOCK
    out[:m_rows, 48 * npp : 48 * npp + tail] = xf[:, n_blocks * BLOCK :]
    return out


A16_STEP = 256
"""With 16-bit activations (``a16``) the integer kernels round each block's 24-bit integers x̃ to
multiples of this (``tetra48_m1.A16_STEP``)."""


def _block_scale(mx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The integer kernels' per-block scale of a float32 block maximum ``mx``: the clamped biased
    exponent ``eb`` (int32, ≥ 22) and ``s = 2^(148 − eb)`` (float64), so ``mx · s ∈ [2^21, 2^22)``
    (``tetra48_m1.block_scale``)."""
    eb = ((mx.to(torch.float32).view(torch.int32) >> 23) & 0xFF).clamp(min=22)
    return eb, ((275 - eb) << 23).view(torch.float32).double()


def round_activation(x: torch.Tensor, n_blocks: int) -> torch.Tensor:
    """``x`` as the integer kernels see it with 16-bit activations (``a16``; in the rotated basis,
    natural column order): each of the first ``n_blocks`` 24-column blocks of every row rounded
    (half to even) to multiples of ``256 / s`` with the block's scale ``s`` (:func:`_block_scale`
    of its largest |value|), i.e. to 16 significant bits per block; the tail columns unchanged.
    Per coordinate the change is at most ``128 / s ≤ 2^-14 ·`` the block's largest |value|.

    Args:
        x: [M, d_in] any float dtype (taken as float32, as the kernels read it).
        n_blocks: the matrix's blocks (``d_in // 24``).

    Returns:
        float64 [M, d_in].
    """
    xf = x.to(torch.float32)
    body = xf[:, : BLOCK * n_blocks].reshape(xf.shape[0], n_blocks, BLOCK)
    _eb, scale = _block_scale(body.abs().amax(dim=2))
    step = A16_STEP / scale[:, :, None]
    out = xf.double().clone()
    out[:, : BLOCK * n_blocks] = (torch.round(body.double() / step) * step).reshape(
        xf.shape[0], -1)
    return out


def unprepare_activation(xp: torch.Tensor, m_rows: int, n: int, order: torch.Tensor
                         ) -> torch.Tensor:
    """The first ``m_rows`` rows of a prepared activation back in natural order: the inverse of
    :func:`prepare_activation` on its data slots (the zero slots are not read). xp [MP, width],
    ``n`` the row width, ``order`` int [24]; returns [m_rows, n] of xp's dtype."""
    n_blocks, tail = n // BLOCK, n % BLOCK
    npp = prepared_pairs(n_blocks)
    # [M, parity, t, pair] -> [M, pair, parity, t] -> blocks in position order [M, nb, 24]
    body = xp[:m_rows, : 48 * npp].reshape(m_rows, 2, BLOCK, npp).permute(0, 3, 1, 2)
    blocks = body.reshape(m_rows, 2 * npp, BLOCK)[:, :n_blocks]
    natural = torch.empty_like(blocks)
    natural[:, :, order.long().to(xp.device)] = blocks
    out = torch.empty(m_rows, n, dtype=xp.dtype, device=xp.device)
    out[:, : n_blocks * BLOCK] = natural.reshape(m_rows, -1)
    out[:, n_blocks * BLOCK :] = xp[:m_rows, 48 * npp : 48 * npp + tail]
    return out


# ------------------------------------------------------------------------------------ tetra48


def tetra48_labels_gains(w: Tetra48Weight) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels int64 [d_out, n_blocks] and gains int64 from the packed words (torch, any device;
    a record of either Tetra layout: ``tetra48`` or ``tetra64``)."""
    if w.layout == "tetra64":  # the layout's own inverse map
        from leechq.formats.layouts.tetra64 import canonical_blocks

        word = canonical_blocks(w)
        return word & ((1 << 47) - 1), word >> 47
    return tetra48_word_codes(w.words, w.n_blocks)


def tetra48_word_codes(words: torch.Tensor, n_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels int64 [R, n_blocks] and gains int64 of ``tetra48`` rows ``words`` (int32 [R,
    stride]: any rows of a record, e.g. gathered; torch, any device, no host sync)."""
    rows = words.shape[0]
    raw = words.contiguous().view(torch.uint8).reshape(rows, -1)[:, : 6 * n_blocks]
    b = raw.reshape(rows, n_blocks, 6).to(torch.int64)
    word = torch.zeros(rows, n_blocks, dtype=torch.int64, device=raw.device)
    for i in range(6):
        word |= b[:, :, i] << (8 * i)
    return word & ((1 << 47) - 1), word >> 47


def tetra48_dequantize_rotated(w: Tetra48Weight) -> torch.Tensor:
    """The matrix the kernel multiplies, in the rotated basis: float64 [d_out, d_in].

    Decoded through ``leechq.codebooks.tetra.decode`` (independent of the kernel's derived
    tables), with the f32 scales/centroids the kernel reads widened to f64.
    """
    from leechq.codebooks.tetra import decode

    labels, gains = tetra48_labels_gains(w)
    pts = decode(labels).to(torch.float64)
    return _blocks_to_matrix(w, pts, gains)


def dequant_column_order(order: torch.Tensor) -> torch.Tensor:
    """int64 [24]: the natural coordinate of each column of a block in the dequantized float16
    matrix: column ``8 s + 4 h + i`` holds trio coordinate ``t = 8 s + 2 i + h`` (section, half,
    byte of the decoder's value words), i.e. natural coordinate ``order[t]``."""
    cols = torch.arange(BLOCK)
    s, h, i = cols // 8, (cols % 8) // 4, cols % 4
    return order.to(torch.int64).cpu()[8 * s + 2 * i + h]


DEQUANT_GROUP_PAIRS = 32
"""Block pairs per column group of the grouped dequantized layout (the dequantization kernels'
``GROUP_PAIRS`` is this number)."""


def dequant_group_columns(n_blocks: int) -> torch.Tensor:
    """int64 [24·n_blocks]: for each column of the *grouped* dequantized layout, the block-major
    column (``24 b + k``) it holds. A row's block pairs go in groups of :data:`DEQUANT_GROUP_PAIRS`
    (the last one shorter); a group holds the 8-column sections of its even blocks, section-major
    and pair-minor, then those of its odd blocks (the last pair's odd block is absent when
    ``n_blocks`` is odd) — so the dequantization kernel's consecutive lanes (pairs) store
    consecutive 16-byte units."""
    n_pairs = (n_blocks + 1) // 2
    units = []
    for g0 in range(0, n_pairs, DEQUANT_GROUP_PAIRS):
        pairs = torch.arange(g0, min(n_pairs, g0 + DEQUANT_GROUP_PAIRS))
        for half in (0, 1):
            blocks = 2 * pairs + half
            blocks = blocks[blocks < n_blocks]
            units.append((3 * blocks[None, :] + torch.arange(3)[:, None]).reshape(-1))
    unit = torch.cat(units) if units else torch.zeros(0, dtype=torch.int64)
    return (8 * unit[:, None] + torch.arange(8)[None, :]).reshape(-1)


def _grouped(matrix: torch.Tensor, n_blocks: int, grouped: bool) -> torch.Tensor:
    """``matrix`` [d_out, 24·n_blocks] (block-major columns) in the grouped layout, or as is."""
    return matrix[:, dequant_group_columns(n_blocks).to(matrix.device)] if grouped else matrix


def tetra48_dequantize_f16(w: Tetra48Weight, grouped: bool = False,
                           scaled: bool = False) -> torch.Tensor:
    """float16 [d_out, 24·n_blocks]: block values ``y · c_g / ‖y‖`` without σ_row (``scaled``:
    with it, ``c_g`` replaced by ``f32(c_g · σ_row)``), each block's columns in the order of
    :func:`dequant_column_order`, the blocks block-major or (``grouped``) in the layout of
    :func:`dequant_group_columns` — computed as the kernel does (the scale ``f32(c_g) ·
    f32(1/‖y‖)`` rounded to float16, the value times it exactly, rounded once to float16), from
    the independent codebook decoder."""
    from leechq.codebooks.tetra import decode
    from leechq.kernels.tables import tetra_kernel_tables

    labels, gains = tetra48_labels_gains(w)
    pts = decode(labels).to(torch.float64).cpu()  # [d_out, nb, 24] natural order
    n2 = (pts * pts).sum(-1)
    invn = (1.0 / _correctly_rounded_sqrt(torch.clamp(n2, min=1.0))).to(torch.float32)
    invn = torch.where(n2 > 0, invn, torch.zeros_like(invn))
    cent = _centroids(w, scaled).cpu().gather(1, gains.cpu().long())  # float32 [d_out, nb]
    scale = cent * invn
    cols = dequant_column_order(tetra_kernel_tables("cpu").order)
    vals = pts[:, :, cols].to(torch.float32) * _f16_scale(scale)[:, :, None]
    out = vals.to(torch.float16).reshape(w.d_out, -1)
    return _grouped(out, w.n_blocks, grouped).to(w.words.device)


def _f16_scale(scale: torch.Tensor) -> torch.Tensor:
    """A float32 block scale as the kernels apply it: rounded to float16, held in float32 (a small
    integer value times it is then exact in float32, so one rounding to float16 remains)."""
    return scale.to(torch.float16).to(torch.float32)


def _centroids(w: Tetra48Weight | Planes14Weight, scaled: bool) -> torch.Tensor:
    """float32 [d_out, 2]: the rows' gain centroids, times σ_row in f32 when ``scaled`` (what the
    dequantization kernels compute with ``SCALED``)."""
    if not scaled:
        return w.row_centroids
    return w.row_centroids * w.row_scales.to(torch.float32)[:, None]


def folded_dense_f16(w: Tetra48Weight | Planes14Weight, grouped: bool = False) -> torch.Tensor:
    """float16 [d_out, d_in]: the matrix the many-row path multiplies (``ops.dense_copy``) —
    the blocks' values with σ_row folded in (:func:`tetra48_dequantize_f16` /
    :func:`planes14_dequantize_f16` with ``scaled``) in the copy's column order, then the tail
    columns rounded to float16, in place (``ops.dense_input_order``)."""
    dequant = tetra48_dequantize_f16 if hasattr(w, "words") else planes14_dequantize_f16
    blocks = dequant(w, grouped=grouped, scaled=True)
    return torch.cat([blocks, w.tail.to(blocks.device, torch.float16)], dim=1)


def scale_and_tail(y: torch.Tensor, x_tail: torch.Tensor, row_scales: torch.Tensor,
                   tail: torch.Tensor) -> torch.Tensor:
    """The float16 GEMM's finalize (``tetra48_gemm.gemm_finalize_kernel``): float32 [M, d_out]
    ``f32(y) · σ + f32(x_tail) · tailᵀ`` from the blocks' product ``y`` [M, d_out], the tail
    activation ``x_tail`` [M, t], σ_row [d_out] and the tail columns [d_out, t]."""
    return y.float() * row_scales + x_tail.float() @ tail.T


def _correctly_rounded_sqrt(values: torch.Tensor) -> torch.Tensor:
    """IEEE sqrt of a few distinct exact integers (torch's vectorized CPU f64 sqrt is 1 ulp low for
    some squared norms, e.g. 32, 128, 304)."""
    distinct, inverse = torch.unique(values, return_inverse=True)
    roots = torch.tensor([math.sqrt(v) for v in distinct.tolist()], dtype=torch.float64,
                         device=values.device)
    return roots[inverse]


def _blocks_to_matrix(w: Tetra48Weight | Planes14Weight, pts: torch.Tensor,
                      gains: torch.Tensor, n2: torch.Tensor | None = None) -> torch.Tensor:
    """Blocks ``y · (c_g · σ_row / √n2)`` (n2 = ‖y‖² unless given) then the tail: f64 [d_out, d_in]."""
    if n2 is None:
        n2 = (pts * pts).sum(-1)
    cent = w.row_centroids.to(torch.float64).gather(1, gains.long())  # [d_out, nb]
    picked = cent * w.row_scales.to(torch.float64)[:, None]
    scale = torch.where(n2 > 0, picked / _correctly_rounded_sqrt(torch.clamp(n2, min=1.0)),
                        torch.zeros_like(picked))
    out = torch.empty(w.d_out, w.d_in, dtype=torch.float64, device=pts.device)
    out[:, : w.n_blocks * BLOCK] = (pts * scale[..., None]).reshape(w.d_out, -1)
    out[:, w.n_blocks * BLOCK :] = w.tail.to(torch.float64)
    return out


def tetra48_matvec(x: torch.Tensor, w: Tetra48Weight) -> torch.Tensor:
    """``y = W x`` for x [M, d_in] in the rotated basis: float32 [M, d_out] (f64 inside)."""
    x = _as_matrix(x, w.d_in)
    return (x.to(torch.float64) @ tetra48_dequantize_rotated(w).T).to(torch.float32)


# ------------------------------------------------------------------------------------ planes14


def planes14_points(w: Planes14Weight) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decode records (torch, any device): points float64 [d_out, nb, 24] (signed class magnitudes),
    gains int64 [d_out, nb] and the class norms ``16·m`` float64 [d_out, nb] (0 for the origin).

    The block scale uses the class's shell, as the per-class table does: for a record of a
    real lattice point ``16·m = ‖y‖²``; a malformed record (a level past its class's length, as the
    random benchmark records have) still decodes exactly as the kernel decodes it."""
    return planes14_record_points(w.records, w.n_blocks)


def planes14_class_tables(device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """The class table's magnitudes float64 [classes, 5] and shells float64 [classes] on
    ``device`` (what :func:`planes14_record_points` reads)."""
    from leechq.formats.layouts.planes14 import planes14_tables

    t = planes14_tables()
    return (torch.as_tensor(t.magnitudes, dtype=torch.float64, device=device),
            torch.as_tensor(t.shells, dtype=torch.float64, device=device))


def planes14_record_points(records: torch.Tensor, n_blocks: int,
                           class_tables: tuple[torch.Tensor, torch.Tensor] | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`planes14_points` of ``planes14`` rows ``records`` (int32 [R, stride]: any rows of
    a record, e.g. gathered); ``class_tables``: :func:`planes14_class_tables` already on the
    records' device (then no host transfer or sync)."""
    nb = n_blocks
    rows = records.shape[0]
    raw = records.contiguous().view(torch.uint8).reshape(rows, -1)[:, : 14 * nb]
    b = raw.reshape(rows, nb, 14).to(torch.int64)
    lo = torch.zeros(rows, nb, dtype=torch.int64, device=raw.device)
    hi = torch.zeros_like(lo)
    for i in range(8):
        lo |= b[:, :, i] << (8 * i)
    for i in range(6):
        hi |= b[:, :, 8 + i] << (8 * i)
    m24 = 0xFFFFFF
    ids = lo & 0x1FF
    gains = (lo >> 9) & 1
    signs = (lo >> 10) & m24
    p0 = (lo >> 34) & m24
    p1 = ((lo >> 58) & 0x3F) | ((hi & 0x3FFFF) << 6)
    p2 = (hi >> 18) & m24
    j = torch.arange(BLOCK, device=raw.device)
    bit = lambda p: (p[..., None] >> j) & 1  # noqa: E731
    level = torch.where(bit(p2) == 1, 4, bit(p0) | (bit(p1) << 1))
    mags, shells = class_tables if class_tables is not None else planes14_class_tables(raw.device)
    mag = mags[ids[..., None], level]
    pts = torch.where(bit(signs) == 1, -mag, mag)
    return pts, gains, 16.0 * shells[ids]


def planes14_dequantize_rotated(w: Planes14Weight) -> torch.Tensor:
    """The matrix the Planes14 kernel multiplies: float64 [d_out, d_in] (rotated basis)."""
    pts, gains, n2 = planes14_points(w)
    return _blocks_to_matrix(w, pts, gains, n2)


def planes14_dequantize_f16(w: Planes14Weight, grouped: bool = False,
                            scaled: bool = False) -> torch.Tensor:
    """float16 [d_out, 24·n_blocks]: block values ``y · c_g / ‖y‖`` without σ_row (``scaled``: as
    :func:`tetra48_dequantize_f16`), natural column
    order within each block, the blocks block-major or (``grouped``) in the layout of
    :func:`dequant_group_columns` — computed as the kernel does (the scale ``f32(c_g) ·
    f32(1/√(16 m))`` rounded to float16, the value times it exactly, rounded once to float16),
    from the torch record decoder :func:`planes14_points`."""
    pts, gains, n2 = planes14_points(w)
    invn = (1.0 / _correctly_rounded_sqrt(torch.clamp(n2, min=1.0))).to(torch.float32)
    invn = torch.where(n2 > 0, invn, torch.zeros_like(invn))
    cent = _centroids(w, scaled).to(pts.device).gather(1, gains)  # float32 [d_out, nb]
    vals = pts.to(torch.float32) * _f16_scale(cent * invn)[:, :, None]
    out = vals.to(torch.float16).reshape(w.d_out, -1)
    return _grouped(out, w.n_blocks, grouped).to(w.records.device)


def planes14_matvec(x: torch.Tensor, w: Planes14Weight) -> torch.Tensor:
    """``y = W x`` for a Planes14 record: float32 [M, d_out] (f64 inside)."""
    x = _as_matrix(x, w.d_in)
    return (x.to(torch.float64) @ planes14_dequantize_rotated(w).T).to(torch.float32)


def row_bound_error(y: torch.Tensor, x: torch.Tensor, dense: torch.Tensor) -> float:
    """The largest ``|y − x·Wᵀ| / Σ_j |w_j x_j|`` over the outputs ``y [M, d_out]`` of a matvec
    with ``x [M, d_in]`` and the matrix ``dense [d_out, d_in]`` (any float; compared in f64), or
    infinity when an output is not finite (an unwritten, NaN-poisoned output fails). The kernels'
    bound is 1e-5 (f32 paths) of this (docs/kernels.md)."""
    if not bool(torch.isfinite(y).all()):
        return math.inf
    xd, wd = x.double(), dense.double()
    bound = xd.abs() @ wd.abs().T
    return float(((y.double() - xd @ wd.T).abs() / bound).max())


# ------------------------------------------------------------------------------------ int4 / int8


def _group_affine(codes: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor,
                  group: int) -> torch.Tensor:
    """``f32(s)·f32(q) + f32(b)`` (two roundings), widened to f64."""
    col = torch.arange(codes.shape[1], device=codes.device) // group
    prod = scales.to(torch.float32)[:, col] * codes.to(torch.float32)
    return (prod + biases.to(torch.float32)[:, col]).to(torch.float64)


def int4_matvec(x: torch.Tensor, w: Int4Weight) -> torch.Tensor:
    """``y = W x`` for an int4 group-affine matrix: float32 [M, d_out] (exact weights, f64 dot)."""
    x = _as_matrix(x, w.d_in)
    dense = _group_affine(w.codes(), w.scales, w.biases, w.group)
    return (x.to(torch.float64) @ dense.T).to(torch.float32)


def int8_matvec(x: torch.Tensor, w: Int8Weight) -> torch.Tensor:
    """``y = W x`` for an int8 group-affine matrix: float32 [M, d_out]."""
    x = _as_matrix(x, w.d_in)
    dense = _group_affine(w.qweight, w.scales, w.biases, w.group)
    return (x.to(torch.float64) @ dense.T).to(torch.float32)


def _check_ids(ids: torch.Tensor, rows: int) -> torch.Tensor:
    if ids.dim() != 1 or ids.dtype not in (torch.int32, torch.int64):
        raise InvalidInput(f"ids must be a 1-D int32/int64 tensor, got {ids.dtype} {list(ids.shape)}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= rows):
        raise InvalidInput(f"ids must lie in [0, {rows})")
    return ids.long()


def int4_embedding(ids: torch.Tensor, table: Int4Weight) -> torch.Tensor:
    """Rows ``ids`` of a 4-bit group-affine table, dequantized exactly: float32 [T, d]."""
    ids = _check_ids(ids, table.d_out)
    lo = table.qweight[ids] & 0x0F
    hi = table.qweight[ids] >> 4
    codes = torch.stack((lo, hi), dim=-1).reshape(ids.numel(), table.d_in)
    return _group_affine(codes, table.scales[ids], table.biases[ids], table.group).to(torch.float32)


def int8_embedding(ids: torch.Tensor, table: Int8Weight) -> torch.Tensor:
    """Rows ``ids`` of an 8-bit group-affine table, dequantized exactly: float32 [T, d]."""
    ids = _check_ids(ids, table.d_out)
    return _group_affine(table.qweight[ids], table.scales[ids], table.biases[ids],
                         table.group).to(torch.float32)


# ------------------------------------------------------------------------------ decode attention


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     slot: torch.Tensor, pad: torch.Tensor, scale: float,
                     k_new: torch.Tensor | None = None,
                     v_new: torch.Tensor | None = None, window: int = 0) -> torch.Tensor:
    """Softmax attention of one query position per row in float64, narrowed to float32: key slot
    ``s`` of row ``b`` is seen from the query's slot ``t = slot[0]`` iff ``pad[b] <= s <= t`` (and
    ``s > t - window`` when ``window`` > 0) or ``s == t`` (the serving model's mask).
    q [B, n_kv, G, hd]; k_cache, v_cache [B, n_kv, S, hd]; slot int64 [1]; pad int64 [B] →
    [B, n_kv, G, hd] f32. ``k_new``, ``v_new`` [B, n_kv, 1, hd]:
    first written into slot ``t`` of the caches (in place, as the kernel does)."""
    if q.dim() != 4 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise InvalidInput("q must be [B, n_kv, G, hd] and k_cache, v_cache [B, n_kv, S, hd]")
    if k_new is not None and v_new is not None:
        k_cache.index_copy_(2, slot.reshape(-1)[:1], k_new)
        v_cache.index_copy_(2, slot.reshape(-1)[:1], v_new)
    keys = torch.arange(k_cache.shape[2], device=q.device)
    t = slot.reshape(-1)[:1].to(q.device)
    seen = (keys[None, :] <= t) & (keys[None, :] >= pad.to(q.device)[:, None])
    if window > 0:
        seen &= keys[None, :] > t - window
    seen |= keys == t
    scores = torch.einsum("bhgd,bhsd->bhgs", q.double(), k_cache.double()) * scale
    scores = scores.masked_fill(~seen[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("bhgs,bhsd->bhgd", probs, v_cache.double()).to(torch.float32)
