"""Host wrappers of the int4 / int8 group-affine kernels (:mod:`.intq`): matvec and embedding
lookup. Twins in ``leechq.kernels.reference``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton

from leechq.errors import InvalidInput, UnsupportedShape
from leechq.kernels import reference as ref
from leechq.kernels.triton.intq import (
    code_transpose_kernel,
    intq_embedding_kernel,
    intq_matvec_kernel,
)
from leechq.kernels.triton.ops_common import _check_x, _use_asm, check_tensor

if TYPE_CHECKING:
    from leechq.formats.int8_weight import Int8Weight
    from leechq.formats.quantized_weight import Int4Weight


def code_transpose(x: torch.Tensor, per: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """``xt[m, k·WP + w] = x[m, per·w + k]`` (WP = words padded to 64), float32 [MP, per·WP]."""
    m_rows, d_in = x.shape
    words = d_in // per
    wp = -(-words // 64) * 64
    shape = (ref.prepared_rows(m_rows), per * wp)
    if out is None:
        out = torch.empty(shape, dtype=torch.float32, device=x.device)
    else:
        check_tensor(out, "out", torch.float32, shape, device=x.device)
    code_transpose_kernel[(shape[0], triton.cdiv(shape[1], 1024))](
        x, x.stride(0), out, m_rows, d_in, words, WP=wp, PER=per, BLOCK=1024)
    return out


def _intq_matvec(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                 biases: torch.Tensor, d_out: int, d_in: int, group: int, bits: int,
                 xt: torch.Tensor | None, rows: int = 16, bw: int = 32) -> torch.Tensor:
    dev = qweight.device
    per = 32 // bits
    if d_in % per or group % per:
        raise UnsupportedShape(f"int{bits} matvec needs d_in and group divisible by {per}")
    m_rows = _check_x(x, d_in, dev)
    groups = -(-d_in // group)
    check_tensor(qweight, "qweight", torch.uint8, (d_out, d_in * bits // 8), device=dev)
    check_tensor(scales, "scales", torch.float16, (d_out, groups), device=dev)
    check_tensor(biases, "biases", torch.float16, (d_out, groups), device=dev)
    if xt is None:
        xt = code_transpose(x, per)
    y = torch.empty(m_rows, d_out, dtype=torch.float32, device=dev)
    intq_matvec_kernel[(triton.cdiv(d_out, rows),)](
        xt, qweight.view(torch.int32), scales, biases, y, y.stride(0), d_out, D_IN=d_in,
        GROUP=group, BITS=bits, M=m_rows, ROWS=rows, BW=bw, USE_ASM=_use_asm(), num_warps=4,
    )
    return y


def int4_matvec(x: torch.Tensor, w: Int4Weight, xt: torch.Tensor | None = None) -> torch.Tensor:
    """``y = W x`` for an int4 group-affine matrix: float32 [M, d_out] (twin of the reference)."""
    return _intq_matvec(x, w.qweight, w.scales, w.biases, w.d_out, w.d_in, w.group, 4, xt)


def int8_matvec(x: torch.Tensor, w: Int8Weight, xt: torch.Tensor | None = None) -> torch.Tensor:
    """``y = W x`` for an int8 group-affine matrix: float32 [M, d_out]."""
    return _intq_matvec(x, w.qweight, w.scales, w.biases, w.d_out, w.d_in, w.group, 8, xt)


def _embedding(ids: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
               biases: torch.Tensor, rows: int, d: int, group: int, bits: int,
               out_dtype: torch.dtype) -> torch.Tensor:
    dev = qweight.device
    check_tensor(ids, "ids", (torch.int32, torch.int64), device=dev)
    if ids.dim() != 1:
        raise InvalidInput(f"ids must be 1-D, got shape {list(ids.shape)}")
    groups = -(-d // group)
    check_tensor(qweight, "qweight", torch.uint8, (rows, d * bits // 8), device=dev)
    check_tensor(scales, "scales", torch.float16, (rows, groups), device=dev)
    check_tensor(biases, "biases", torch.float16, (rows, groups), device=dev)
    out = torch.empty(ids.numel(), d, dtype=out_dtype, device=dev)
    if ids.numel():
        intq_embedding_kernel[(ids.numel(), triton.cdiv(d, 1024))](
            ids, qweight, scales, biases, out, D=d, GROUP=group, BITS=bits, BLOCK=1024,
            USE_ASM=_use_asm())
    return out


def int4_embedding(ids: torch.Tensor, table: Int4Weight,
                   out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rows ``ids`` of a 4-bit table, dequantized exactly: [T, d] of ``out_dtype``.

    Ids are not range-checked on the device (that would need a host sync); out-of-range ids are
    the caller's error, as in ``torch.nn.functional.embedding``."""
    return _embedding(ids, table.qweight, table.scales, table.biases, table.d_out, table.d_in,
                      table.group, 4, out_dtype)


def int8_embedding(ids: torch.Tensor, table: Int8Weight,
                   out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rows ``ids`` of an 8-bit table, dequantized exactly: [T, d] of ``out_dtype``."""
    return _embedding(ids, table.qweight, table.scales, table.biases, table.d_out, table.d_in,
                      table.group, 8, out_dtype)
