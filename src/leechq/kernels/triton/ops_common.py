"""What every host wrapper of the Triton kernels shares: argument checks that raise
:class:`leechq.errors.InvalidInput` naming the tensor, the interpreter test, the device's SM count,
a once-per-device verdict cache, and the integer kernels' activation width (:data:`A16`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from leechq.errors import InvalidInput, UnsupportedShape
from leechq.kernels import reference as ref

if TYPE_CHECKING:
    from leechq.formats.layouts.planes14 import Planes14Weight
    from leechq.formats.layouts.tetra48 import Tetra48Weight

A16 = True
"""The integer kernels (``m1``, the int8 tensor-core kernel and the records the rotation writes for
them) round each activation block to 16 significant bits instead of 24
(``tetra48_m1.A16_STEP``; twin: ``reference.round_activation``): limb 0 is zero, so ``m1``
issues 12 ``dp4a`` per block and row instead of 18 and the int8 kernel 24 MMAs and 12 fragment
loads per step instead of 36 and 18. Per coordinate the activation moves by at most 2^-14 of its
block's largest |value| (half that on average); docs/kernels.md gives the tolerance. The kernels
keep their 24-bit form (``A16`` False), which the kernel tests patch in to hold the kernels to the
f64 product of the activation as given."""


MAX_ROWS = 8
"""Largest activation row count of the matvec kernels (decode and small prefill chunks)."""


def interpreting() -> bool:
    """True under the Triton CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def _use_asm() -> bool:
    return not interpreting()



def check_tensor(t: torch.Tensor, name: str, dtype: torch.dtype | tuple[torch.dtype, ...],
                 shape: tuple[int, ...] | None = None,
                 device: torch.device | None = None) -> torch.Tensor:
    """Validate one kernel argument; raise :class:`InvalidInput` naming it."""
    if not isinstance(t, torch.Tensor):
        raise InvalidInput(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    dtypes = dtype if isinstance(dtype, tuple) else (dtype,)
    if t.dtype not in dtypes:
        raise InvalidInput(f"{name} must be {' or '.join(map(str, dtypes))}, got {t.dtype}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise InvalidInput(f"{name} must have shape {list(shape)}, got {list(t.shape)}")
    if not t.is_contiguous():
        raise InvalidInput(f"{name} must be contiguous (got strides {t.stride()})")
    if not interpreting() and t.device.type != "cuda":
        raise InvalidInput(f"{name} is on {t.device}; the Triton kernels need CUDA tensors")
    if device is not None and t.device != device:
        raise InvalidInput(f"{name} is on {t.device}, the weights on {device}")
    return t


def _check_x(x: torch.Tensor, d_in: int, device: torch.device, max_rows: int | None = MAX_ROWS,
             what: str = "the matvec kernels take") -> int:
    """Activation checks shared by the matvec entry points (``max_rows=None``: any row count)."""
    check_tensor(x, "x", (torch.float32, torch.float16, torch.bfloat16), device=device)
    if x.dim() != 2 or x.shape[1] != d_in:
        raise InvalidInput(f"x must be [M, {d_in}] for this matrix, got {list(x.shape)}")
    if max_rows is not None and not 1 <= x.shape[0] <= max_rows:
        raise UnsupportedShape(f"x has {x.shape[0]} rows; {what} 1..{max_rows}")
    return int(x.shape[0])



_SM_COUNT: dict[str, int] = {}


def _sm_count(device: torch.device) -> int:
    key = str(device)
    if key not in _SM_COUNT:
        _SM_COUNT[key] = (torch.cuda.get_device_properties(device).multi_processor_count
                          if device.type == "cuda" else 2)
    return _SM_COUNT[key]



def _checked_once(cache: dict, key: Any, check: Callable[..., bool], *args: Any) -> bool:
    """``check(*args)``'s verdict for ``key``, computed once (into ``cache``) on first use
    outside any CUDA-graph capture; under a capture with no verdict yet, False for that call."""
    if key not in cache:
        if torch.cuda.is_current_stream_capturing():
            return False
        cache[key] = check(*args)
    return cache[key]



def _check_lattice(w: Tetra48Weight | Planes14Weight, words: torch.Tensor, name: str,
                   t64_ok: bool = False) -> None:
    if w.layout == "tetra64" and not t64_ok:
        raise InvalidInput(
            "this record is in the tetra64 layout (Tetra64Weight), which only the m1, int8 and "
            "dequantization kernels read (tetra48_matvec_prepared, tetra48_dequantize_f16); "
            "convert it back with "
            "formats.layouts.tetra64.from_tetra64")
    dev = words.device
    check_tensor(words, f"{name}", torch.int32, (w.d_out, w.stride), device=dev)
    check_tensor(w.row_scales, "row_scales", torch.float32, (w.d_out,), device=dev)
    check_tensor(w.row_centroids, "row_centroids", torch.float32, (w.d_out, 2), device=dev)
    check_tensor(w.tail, "tail", torch.float32, (w.d_out, w.tail_cols), device=dev)
    if w.tail_cols > 32:
        raise UnsupportedShape("tail wider than 32 columns")


def _check_prepared(xp: torch.Tensor, m_rows: int, n_blocks: int, device: torch.device,
                    max_rows: int = MAX_ROWS) -> None:
    """A prepared activation of ``m_rows`` rows (1..``max_rows``: the int8 kernel takes
    :data:`IMMA_ROWS`, the others :data:`MAX_ROWS`) and ``n_blocks`` blocks, checked."""
    shape = (ref.prepared_rows(m_rows), ref.prepared_width(n_blocks))
    check_tensor(xp, "xp (prepared activation)", torch.float32, shape, device=device)
    if not 1 <= m_rows <= max_rows:
        raise UnsupportedShape(f"{m_rows} activation rows; the matvec kernels take 1..{max_rows}")


def _check_out(y: torch.Tensor, m_rows: int, d_out: int) -> None:
    """An output buffer a launch writes rows ``0..m_rows-1`` of: [≥ m_rows, d_out], unit column
    stride (a column slice of a wider output is fine)."""
    if y.dim() != 2 or y.shape[0] < m_rows or y.shape[1] != d_out or y.stride(1) != 1:
        raise InvalidInput(f"out must be [{m_rows}, {d_out}] with unit column stride")
