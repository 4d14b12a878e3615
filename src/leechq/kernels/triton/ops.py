"""Host wrappers of the Triton kernels: validate, allocate, launch (same signatures as the twins in
``leechq.kernels.reference``).

Every wrapper checks what it is given and raises :class:`leechq.errors.InvalidInput` (a ValueError)
naming the tensor: wrong dtype, wrong shape for the packed record, non-contiguous storage, a tensor on
the CPU (or on another device than the weights) — except under the Triton interpreter
(``TRITON_INTERPRET=1``), where CPU tensors are the point. Outputs are freshly allocated float32
unless an ``out`` buffer is given.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
import triton

from leechq.codebooks.base import BLOCK
from leechq.errors import InvalidInput, UnsupportedShape
from leechq.kernels import reference as ref
from leechq.kernels.tables import (
    natural_order,
    planes14_kernel_table,
    planes14_m1_order,
    planes14_m1_table,
    tetra_kernel_tables,
    tetra_m1_bits_table,
    tetra_m1_table,
)
from leechq.kernels.triton._bits import PDL_AVAILABLE
from leechq.kernels.triton.activation import (
    PRE_ADD_NORM,
    PRE_NORM,
    PRE_SILU_MUL,
    prepare_kernel,
    rotate_kernel,
    rotate_prepared_kernel,
)
from leechq.kernels.triton.decode_attention import (
    LOG2E,
    decode_attention_combine_kernel,
    decode_attention_partial_kernel,
)
from leechq.kernels.triton.dense_epilogue import scale_tail_kernel
from leechq.kernels.triton.intq import (
    code_transpose_kernel,
    intq_embedding_kernel,
    intq_matvec_kernel,
)
from leechq.kernels.triton.planes14 import planes14_matvec_kernel
from leechq.kernels.triton.planes14_dequant import planes14_dequant_kernel
from leechq.kernels.triton.tetra48 import tetra48_matvec_kernel
from leechq.kernels.triton.tetra48_dequant import tetra48_dequant_kernel
from leechq.kernels.triton.tetra48_imma import (
    STEP_WORDS,
    imma_activation_kernel,
    imma_finalize_kernel,
    imma_kernel,
)
from leechq.kernels.triton.tetra48_m1 import PLANES14, T64_PBITS, TETRA, TETRA_64, m1_kernel

if TYPE_CHECKING:
    from leechq.formats.int8_weight import Int8Weight
    from leechq.formats.layouts.planes14 import Planes14Weight
    from leechq.formats.layouts.tetra48 import Tetra48Weight
    from leechq.formats.quantized_weight import Int4Weight
    from leechq.formats.rotation import RotationTables

MAX_ROWS = 8
"""Largest activation row count of the matvec kernels (decode and small prefill chunks)."""


def interpreting() -> bool:
    """True under the Triton CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def _use_asm() -> bool:
    return not interpreting()


A16 = True
"""The integer kernels (``m1``, the int8 tensor-core kernel and the records the rotation writes for
them) round each activation block to 16 significant bits instead of 24
(``tetra48_m1.A16_STEP``; twin: ``reference.round_activation``): limb 0 is zero, so ``m1``
issues 12 ``dp4a`` per block and row instead of 18 and the int8 kernel 24 MMAs and 12 fragment
loads per step instead of 36 and 18. Per coordinate the activation moves by at most 2^-14 of its
block's largest |value| (half that on average); docs/kernels.md gives the tolerance. The kernels
keep their 24-bit form (``A16`` False), which the kernel tests patch in to hold the kernels to the
f64 product of the activation as given."""


def t64_serving(device: torch.device | str) -> bool:
    """Whether a Tetra group built for ``device`` holds its words in the ``tetra64`` layout: a
    CUDA device, not under the interpreter (whose serving tests keep the standard layout unless
    they ask), 16-bit activations (:data:`A16`; the batch-1 kernel decodes the layout with them
    only)."""
    return torch.device(device).type == "cuda" and not interpreting() and A16


def kernel_activation(x: torch.Tensor, n_blocks: int) -> torch.Tensor:
    """The activation the integer kernels multiply (for an f64 reference): ``x``'s 16-bit rounding
    per block with :data:`A16` (``reference.round_activation``), else ``x`` itself."""
    return ref.round_activation(x, n_blocks) if A16 else x


PDL_MAX_ROWS = 1
"""Activation rows up to which the rotations and the ``m1`` launches take programmatic dependent
launch (a grid's programs are scheduled while the grid before it finishes, stage their tables and
load their first weight words, and wait only before they read its output); tuning in
docs/decisions.md."""

_PDL_DEVICES: dict[int, bool] = {}


def pdl_enabled(device: torch.device) -> bool:
    """Whether kernels launched on ``device`` now use programmatic dependent launch: an NVIDIA
    device of compute capability ≥ 9, a Triton with grid dependency control, not under the
    interpreter and not while ``torch.compile`` traces (its kernel wrapper does not pass the
    launch attribute)."""
    if interpreting() or not PDL_AVAILABLE or device.type != "cuda" or torch.version.hip:
        return False
    if torch.compiler.is_compiling():
        return False
    return _sm90(device)


def _sm90(device: torch.device) -> bool:
    """Whether ``device`` is an NVIDIA GPU of compute capability ≥ 9 (cached per index; while
    ``torch.compile`` traces, only a cached answer, else False)."""
    if device.type != "cuda" or torch.version.hip:
        return False
    if torch.compiler.is_compiling():
        return _PDL_DEVICES.get(device.index, False)
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _PDL_DEVICES:
        _PDL_DEVICES[index] = torch.cuda.get_device_capability(index)[0] >= 9
    return _PDL_DEVICES[index]


def _pdl_launch(pdl: bool) -> dict[str, Any]:
    """The launch keywords of a kernel with a ``PDL`` constexpr: the constexpr, and the launch
    attribute only when set (so that launches without it stay plain)."""
    return {"PDL": pdl, "launch_pdl": True} if pdl else {"PDL": False}


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


@dataclass(frozen=True)
class MatvecConfig:
    """Launch geometry of the lattice matvec kernels.

    Attributes:
        rows: output rows per program (``tile``) or per row chunk (``m1``).
        bp: block pairs per iteration (``tile``) or per K-slice (``m1``: 8, 16 or 32).
        num_warps: warps per program.
        smem_rows: ``tile`` Tetra only: stage the rank table in shared memory (``tl.gather``).
        kernel: ``"tile"`` (the tiled kernels, any M ≤ 8) or ``"m1"`` (the batch-1
            activation-stationary Tetra kernel, :mod:`leechq.kernels.triton.tetra48_m1`; other
            layouts and M > 1 run the tiled kernels with their defaults).
        ctas_per_sm: ``m1``: persistent grid of ``SMs × ctas_per_sm`` programs (rounded to a
            multiple of the K-slice count); 0 launches one program per (row chunk, K-slice).
        ilp: ``m1``: rows a warp decodes per loop trip (1 or 2: two independent decode chains).
        maxnreg: ``m1``: register cap per thread handed to ptxas (0: the compiler's choice). Fewer
            registers let more programs share an SM (65536 registers / (cap · 32 · warps)).
        mb: ``m1``: activation rows per launch (1, 2 or 4): each decoded block meets all of
            them (their limbs in registers); M rows take ``ceil(M / mb)`` launches.
    """

    rows: int = 16
    bp: int = 32
    num_warps: int = 4
    smem_rows: bool = False
    kernel: str = "tile"
    ctas_per_sm: int = 0
    ilp: int = 1
    maxnreg: int = 0
    mb: int = 1


M1_MAXNREG = 96
"""Register cap of the batch-1 geometry: ptxas fits the kernel in 96 registers without spilling
(Triton 3.6, sm_90), so five 4-warp programs share an SM instead of four (H200 sweep of
2026-11-30: 1–4 % faster per group at equal rows)."""


def m1_maxnreg(n_blocks: int, tail_cols: int) -> int:
    """The register cap for a row of ``n_blocks`` blocks and ``tail_cols`` tail columns: 96 where
    ptxas (sm_90) keeps the kernel free of spills under it — rows of ≤ 448 blocks with at most
    16 tail columns (every Qwen3 and Llama-3 width), or 512 with no tail (Qwen3-8B's down
    projection) — else 0 (the compiler's choice: 127 registers, four programs per SM). Wider
    rows spill into the hot loop under the cap (Triton 3.6); so do tails of 23 or 31 columns
    with Triton 3.9 (7 local loads per loop trip at 448 blocks), though not with 3.6."""
    if (n_blocks <= 448 and tail_cols <= 16) or (n_blocks <= 512 and tail_cols == 0):
        return M1_MAXNREG
    return 0


M1_DEFAULT = MatvecConfig(rows=32, bp=32, num_warps=4, kernel="m1", ctas_per_sm=0, ilp=2,
                          maxnreg=M1_MAXNREG)
"""The batch-1 Tetra geometry of :func:`default_config` (shape-blind callers); the matvec entry
points use the per-shape rule :func:`m1_config`."""


def default_config(m_rows: int) -> MatvecConfig:
    """The geometry used when none is given and the shape is unknown: the ``m1`` kernel at batch 1
    (Tetra), otherwise the tiled kernel (best of the H200 sweep of 2026-11-29 for M > 1;
    docs/kernels.md)."""
    if m_rows == 1:
        return M1_DEFAULT
    return MatvecConfig(rows=8, bp=32, num_warps=4, kernel="tile")


M1_MAX_ROWS = 256
"""Largest chunk :func:`m1_config` picks (the fixup unrolls ``rows / 32`` times)."""


M1_MAX_ROWS_T64 = 1024
"""Largest chunk of the batch-1 ``tetra64`` geometry: wide programs (16 warps, one per SM) take
up to 576 rows per chunk at Qwen3-8B's gate|up for one wave."""

M1_RESIDENT = {1: 5, 2: 3, 4: 2}
"""Programs per H200 SM by activation rows per launch (``mb``) that :func:`m1_config` sizes its
chunks for. Registers per thread (Triton 3.6, sm_90, offline SASS with a launch's hints, Qwen3
widths): 96 capped for one row; 128 for two rows (four programs would fit, but sizing for four
was no faster on the H200, 2026-11-30: Qwen3-8B projections at M = 2 4.07 ms against 4.01 for
three); 217–254 for four rows (two programs). Caps below those spill (two rows at 112: 56–80
bytes of stack; four rows at 168: 64–424)."""


def m1_config(d_out: int, n_blocks: int, device: torch.device, tail_cols: int = 0,
              m_rows: int = 1, t64: bool = False) -> MatvecConfig:
    """The ``m1`` geometry for a ``d_out × 24·n_blocks`` matrix with ``tail_cols`` tail columns
    and ``m_rows`` activation rows (H200 sweeps of 2026-11-30, docs/kernels.md): one program per
    (row chunk, K-slice), two rows per warp and loop trip, the register cap of
    :func:`m1_maxnreg`, and the larger of two chunk sizes: 64 rows when that still leaves at least
    three programs per SM (else 32), and the chunk that makes the launch about one wave of the
    programs an SM holds (:func:`m1_wave_rows`; capped at :data:`M1_MAX_ROWS`), so that large
    matrices run fewer, longer programs (each stages the table once). Several activation rows
    share each decode: two rows in one launch, three or more four at a time (``mb``, one loop
    row per trip for four: their limbs take the registers). ``t64``: the geometry of the
    ``tetra64`` decode at one row — the chunk of one wave of five programs per SM, no register
    cap (H200 sweep, BENCHMARKS.md §3 run 20: the best of nine geometries on each Qwen3-8B
    group; the cap and six programs per SM were slower)."""
    sms = _sm_count(device)
    mb = 1 if m_rows <= 1 else 2 if m_rows == 2 else 4
    ilp = 1 if mb == 4 else 2
    if t64 and mb == 1:
        nw = T64_NUM_WARPS
        return MatvecConfig(rows=min(m1_wave_rows(d_out, n_blocks, M1_RESIDENT[1] * sms, ilp=2,
                                                  num_warps=nw), M1_MAX_ROWS_T64),
                            bp=32, num_warps=nw, kernel="m1", ctas_per_sm=0, ilp=2, maxnreg=0,
                            mb=1)
    slices = ((n_blocks + 1) // 2 + 31) // 32
    rows = 64 if (d_out + 63) // 64 * slices >= 3 * sms else 32
    wave = m1_wave_rows(d_out, n_blocks, M1_RESIDENT[mb] * sms, ilp=ilp)
    rows = max(rows, min(wave, M1_MAX_ROWS))
    return MatvecConfig(rows=rows, bp=32, num_warps=4, kernel="m1", ctas_per_sm=0, ilp=ilp,
                        maxnreg=m1_maxnreg(n_blocks, tail_cols) if mb == 1 else 0, mb=mb)


T64_NUM_WARPS = 4
"""Warps per program of the batch-1 kernel on ``tetra64`` records (:func:`m1_config`; sized for
``M1_RESIDENT[1]`` programs per SM). Wider programs lost: docs/decisions.md."""


def m1_row_groups(m_rows: int) -> list[int]:
    """How :func:`tetra48_matvec_prepared` splits ``m_rows`` activation rows between ``m1``
    launches when no configuration is given: four at a time, then the remainder (1, 2, or 3 — the
    last on the four-row geometry with a zero pad row), each group in the geometry
    :func:`m1_config` picks for its own row count. E.g. 5 → [4, 1], 6 → [4, 2], 8 → [4, 4]."""
    groups = [4] * (m_rows // 4)
    if m_rows % 4:
        groups.append(m_rows % 4)
    return groups


def m1_plan(d_out: int, n_blocks: int, device: torch.device, tail_cols: int = 0,
            m_rows: int = 1, t64: bool = False) -> list[tuple[int, MatvecConfig]]:
    """``(rows, configuration)`` per ``m1`` launch group for ``m_rows`` activation rows of a
    ``d_out × 24·n_blocks`` matrix (:func:`m1_row_groups`, :func:`m1_config`; ``t64``: a
    ``tetra64`` record)."""
    return [(g, m1_config(d_out, n_blocks, device, tail_cols, m_rows=g, t64=t64))
            for g in m1_row_groups(m_rows)]


def m1_wave_rows(d_out: int, n_blocks: int, programs: int, ilp: int = 2, num_warps: int = 4,
                 bp: int = 32) -> int:
    """Chunk rows that cut a ``d_out × 24·n_blocks`` matrix into about ``programs`` (row chunk,
    K-slice) programs — e.g. one full wave of ``SMs × resident programs per SM`` — rounded up to
    the loop trip (``ilp · num_warps · 32 / bp`` rows)."""
    trip = ilp * num_warps * 32 // bp
    slices = ((n_blocks + 1) // 2 + bp - 1) // bp
    rows = -(-d_out * slices // max(programs, 1))
    return max(trip, -(-rows // trip) * trip)


def _many_row_m1_default() -> bool:
    """Whether several activation rows with no configuration run the many-row ``m1`` kernel (on a
    GPU) rather than the tiled one (under the interpreter, where a many-row ``m1`` launch costs
    ~10 s; the tests that want it ask for it or patch this)."""
    return not interpreting()


def _tile_config(cfg: MatvecConfig, m_rows: int) -> MatvecConfig:
    """The configuration the tiled kernels run with (an ``m1`` configuration falls back to the
    tiled defaults of the 2026-11-29 sweep)."""
    if cfg.kernel == "tile":
        return cfg
    if m_rows == 1:
        return MatvecConfig(rows=16, bp=32, num_warps=4, smem_rows=True, kernel="tile")
    return MatvecConfig(rows=8, bp=32, num_warps=4, kernel="tile")


_SM_COUNT: dict[str, int] = {}
_TICKETS: dict[str, torch.Tensor] = {}
TICKET_SLOTS = 1 << 16
"""Row chunks per launch the ``m1`` kernels can track (a zeroed int32 counter each, reset by the
program that consumes it, so one buffer per device serves every launch on one stream)."""


def _sm_count(device: torch.device) -> int:
    key = str(device)
    if key not in _SM_COUNT:
        _SM_COUNT[key] = (torch.cuda.get_device_properties(device).multi_processor_count
                          if device.type == "cuda" else 2)
    return _SM_COUNT[key]


def _tickets(device: torch.device) -> torch.Tensor:
    key = str(device)
    if key not in _TICKETS:
        _TICKETS[key] = torch.zeros(TICKET_SLOTS, dtype=torch.int32, device=device)
    return _TICKETS[key]


_M1_CHECKED: dict[tuple[str, MatvecConfig, str, bool], bool] = {}


def m1_enabled(device: torch.device, cfg: MatvecConfig, check: Callable | None = None) -> bool:
    """Whether the ``m1`` kernels may run on ``device`` with ``cfg``.

    On a GPU, each (device, geometry, kernel) is checked once, on
    first use and outside any CUDA-graph capture, by ``check(device, cfg)`` (default: the Tetra
    kernel's, :func:`_check_m1`: against the f64 reference on a small random record — two
    K-slices, a tail, chunk walking, two calls so that the tickets must have reset; for several
    rows ``mb + 1`` and ``mb − 1`` of them: a one-row launch and a zero pad row); a failure
    warns and falls back to the tiled kernel for good. Under a capture with no check yet, the tiled
    kernel is used for that call."""
    if interpreting() or device.type != "cuda":
        return True
    check = check or _check_m1
    return _checked_once(_M1_CHECKED, (str(device), cfg, check.__name__, A16), check, device,
                         cfg)


def _checked_once(cache: dict, key: Any, check: Callable[..., bool], *args: Any) -> bool:
    """``check(*args)``'s verdict for ``key``, computed once (into ``cache``) on first use
    outside any CUDA-graph capture; under a capture with no verdict yet, False for that call."""
    if key not in cache:
        if torch.cuda.is_current_stream_capturing():
            return False
        cache[key] = check(*args)
    return cache[key]


def _first_use_check(what: str, device: torch.device, cfg: MatvecConfig, cases: Iterator,
                     fallback: str = "the tiled kernel") -> bool:
    """Run ``cases`` (a generator of ``(y, x, dense)``: kernel output, activation, f64 reference
    matrix) and require every output within ``1e-5 · Σ|w·x|`` and the ticket counters reset; any
    failure or exception warns and returns False (the caller keeps ``fallback``)."""
    try:
        worst = 0.0
        for y, x, dense in cases:
            worst = max(worst, ref.row_bound_error(y, x, dense))
            if not worst <= 1e-5:
                break
        tickets_clean = int(_tickets(device).abs().sum()) == 0
        if worst <= 1e-5 and tickets_clean:
            return True
        reason = f"error {worst:.2e}, tickets {'reset' if tickets_clean else 'NOT reset'}"
    except Exception as exc:  # any failure means: do not use the kernel on this device
        reason = f"{type(exc).__name__}: {exc}"[:300]
    warnings.warn(f"the {what} ({cfg}) failed its first-use check on {device} ({reason}); using "
                  f"{fallback}", stacklevel=5)
    return False


def _m1_check_cases(device: torch.device, cfg: MatvecConfig, random_record: Callable,
                    dequantize: Callable, order: Callable, run: Callable) -> Iterator:
    """The first-use cases of an ``m1`` kernel (for :func:`_first_use_check`): a small random
    record (``random_record``: two K-slices, the second one short; chunk walking; a tail), its f64
    matrix (``dequantize``), and per call a NaN-poisoned output that ``run(xp, w, y, m_rows)``
    fills from the activation prepared in ``order(device)``: for several rows ``mb + 1`` rows (a
    full launch, then a one-row launch with this geometry) and ``mb − 1`` (a zero pad row for
    ``mb`` = 4); for one row, one row twice (the tickets must have reset)."""
    n_blocks = 2 * cfg.bp + 6  # bp + 3 pairs: two K-slices, the second one short
    w = random_record(3 * cfg.rows + 5, n_blocks * BLOCK + 11, seed=0x5EED, device=device)
    dense = dequantize(w)
    counts = (cfg.mb + 1, cfg.mb - 1) if cfg.mb > 1 else (1, 1)
    for seed, m_rows in zip((1, 2), counts, strict=True):
        g = torch.Generator(device=device).manual_seed(seed)
        x = torch.randn(m_rows, w.d_in, generator=g, device=device)
        xp = prepare_activation(x, w.n_blocks, order(device))
        y = torch.full((m_rows, w.d_out), float("nan"), device=device)
        run(xp, w, y, m_rows)
        yield y, kernel_activation(x, w.n_blocks), dense


def _check_m1(device: torch.device, cfg: MatvecConfig) -> bool:
    from leechq.formats.layouts.tetra48 import random_tetra48

    cases = _m1_check_cases(device, cfg, random_tetra48, ref.tetra48_dequantize_rotated,
                            lambda d: tetra_kernel_tables(d).order,
                            lambda xp, w, y, m: _launch_m1("tetra48", xp, w, y, cfg, m))
    return _first_use_check("batch-1 Tetra kernel (m1)", device, cfg, cases)


def _check_m1_t64(device: torch.device, cfg: MatvecConfig) -> bool:
    """:func:`_check_m1` on a record in the ``tetra64`` layout (``CODE = TETRA_64``)."""
    from leechq.formats.layouts.tetra48 import random_tetra48
    from leechq.formats.layouts.tetra64 import to_tetra64

    cases = _m1_check_cases(device, cfg, lambda *a, **k: to_tetra64(random_tetra48(*a, **k)),
                            ref.tetra48_dequantize_rotated,
                            lambda d: tetra_kernel_tables(d).order,
                            lambda xp, w, y, m: _launch_m1("tetra48", xp, w, y, cfg, m))
    return _first_use_check("batch-1 Tetra kernel on tetra64 records (m1)", device, cfg, cases)


def m1_grid(d_out: int, n_blocks: int, cfg: MatvecConfig, device: torch.device) -> tuple[int, int]:
    """(programs, K-slices) of an ``m1`` launch."""
    if cfg.bp not in (8, 16, 32) or cfg.ilp not in (1, 2) or (
            cfg.rows % (cfg.ilp * cfg.num_warps * 32 // cfg.bp)) or (
            cfg.maxnreg and not 32 <= cfg.maxnreg <= 255) or cfg.mb not in (1, 2, 4):
        raise InvalidInput(f"m1 config {cfg}: bp must be 8/16/32, ilp 1 or 2, rows a multiple "
                           "of ilp·num_warps·32/bp, maxnreg 0 or 32..255 and mb 1, 2 or 4")
    n_pairs = -(-n_blocks // 2)
    ns = -(-n_pairs // cfg.bp)
    chunks = -(-d_out // cfg.rows)
    if chunks > TICKET_SLOTS:
        raise UnsupportedShape(f"{d_out} rows / {cfg.rows} per chunk exceeds {TICKET_SLOTS} chunks")
    per_slice = chunks
    if cfg.ctas_per_sm > 0:
        per_slice = min(chunks, max(1, cfg.ctas_per_sm * _sm_count(device) // ns))
    return ns * per_slice, ns


# ------------------------------------------------------------------------------------ activation


def _prepared_out(out: torch.Tensor | None, m_rows: int, n_blocks: int,
                  device: torch.device) -> torch.Tensor:
    """``out`` checked as a prepared activation buffer (float32 [MP, 48·NPP + 32]), or a new one."""
    shape = (ref.prepared_rows(m_rows), ref.prepared_width(n_blocks))
    if out is None:
        return torch.empty(shape, dtype=torch.float32, device=device)
    check_tensor(out, "out", torch.float32, shape, device=device)
    return out


def prepare_activation(x: torch.Tensor, n_blocks: int, order: torch.Tensor,
                       out: torch.Tensor | None = None) -> torch.Tensor:
    """Twin of :func:`leechq.kernels.reference.prepare_activation` (float32 [MP, 48·NPP + 32])."""
    check_tensor(x, "x", (torch.float32, torch.float16, torch.bfloat16))
    check_tensor(order, "order", torch.int32, (BLOCK,), device=x.device)
    if x.dim() != 2 or x.shape[1] // BLOCK != n_blocks:
        raise InvalidInput(f"x must be [M, d_in] with d_in // 24 == {n_blocks}, got {list(x.shape)}")
    m_rows, d_in = x.shape
    out = _prepared_out(out, m_rows, n_blocks, x.device)
    npp = ref.prepared_pairs(n_blocks)
    grid = (out.shape[0], triton.cdiv(out.shape[1], 1024))
    prepare_kernel[grid](x, x.stride(0), out, out.stride(0), order, m_rows, d_in, n_blocks, npp,
                         BLOCK=1024)
    return out


@dataclass(frozen=True)
class DeviceRotation:
    """A rotation's tables on a device: signs float32 [n], small float32 [k, k], 1/√m."""

    n: int
    pow2: int
    odd: int
    signs: torch.Tensor
    small: torch.Tensor
    inv_sqrt_m: float

    @classmethod
    def from_tables(cls, tables: RotationTables, device: torch.device | str) -> DeviceRotation:
        return cls(
            n=tables.n,
            pow2=tables.pow2,
            odd=tables.odd,
            signs=torch.as_tensor(tables.signs, dtype=torch.float32, device=device).contiguous(),
            small=torch.as_tensor(tables.small, dtype=torch.float32, device=device).contiguous(),
            inv_sqrt_m=float(1.0 / math.sqrt(tables.pow2)),
        )


_PAIR_SPAN: dict[tuple[int, int, int], int] = {}


def _group_pair_span(k: int, m: int, npp: int) -> int:
    """The most pairs of the prepared layout that one rotation group's program must cover: from the
    pair of the group's first column to that of its last (the last group: to ``NPP``, so that it
    also writes the padding pairs). Computed once per shape (it runs on every rotation call)."""
    key = (k, m, npp)
    if key not in _PAIR_SPAN:
        span = 0
        for g in range(k):
            first = (g * m // BLOCK) // 2
            stop = npp if g == k - 1 else (((g + 1) * m - 1) // BLOCK) // 2 + 1
            span = max(span, stop - first)
        _PAIR_SPAN[key] = span
    return _PAIR_SPAN[key]


_HALF_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
"""The kernels' ``HDT`` code of the dtype a pre-op's output is narrowed to."""


@dataclass(frozen=True)
class _PreOp:
    """What the rotation kernels compute before rotating (``activation.PRE_*``): the code, the
    ``aux`` (residual delta) and weight tensors, the residual output, ``eps``, the ``HDT`` code."""

    code: int = 0  # PRE_NONE
    aux: torch.Tensor | None = None
    weight: torch.Tensor | None = None
    residual: torch.Tensor | None = None
    eps: float = 0.0
    hdt: int = 0


ROTATE_SPLITS = 8
"""Programs per (row, group) of the one-launch rotation into the prepared layout on a GPU
(``activation.rotate_prepared_kernel``'s ``SPLITS``, capped by the group's pair span and width).
Each transforms the whole group and writes its share of the slots. Under the interpreter the
default is 1 (each extra program repeats the transform in Python)."""


def rotate_splits(requested: int | None = None) -> int:
    """The ``SPLITS`` a prepared rotation runs with: ``requested``, else :data:`ROTATE_SPLITS`
    (1 under the interpreter); a power of two ≥ 1."""
    n = requested if requested is not None else (1 if interpreting() else ROTATE_SPLITS)
    if n < 1 or n & (n - 1):
        raise InvalidInput(f"rotation splits must be a power of two ≥ 1, got {n}")
    return n


def rotate(x: torch.Tensor, rotation: DeviceRotation | RotationTables, *,
           prepared_order: torch.Tensor | None = None, out: torch.Tensor | None = None,
           tensor_cores: bool = False, one_launch: bool = True,
           splits: int | None = None,
           records: tuple[torch.Tensor, torch.Tensor] | None = None,
           dense_order: torch.Tensor | None = None) -> torch.Tensor:
    """``Q x`` row by row (twin of ``reference.rotate``); one program per (row, group).

    x: [M, n] float32/float16/bfloat16. Returns float32 [M, n] (natural order) or, with
    ``prepared_order`` (int32 [24]), the prepared layout of the lattice kernels, float32
    [MP, 48·NPP + 32]: by default in one launch (``activation.rotate_prepared_kernel``: each
    program gathers its group's slots from registers); ``one_launch=False`` keeps the earlier two
    launches (natural order to a scratch row, then the preparation kernel) for comparison.
    ``tensor_cores`` selects the tensor-core transform for groups of 256..4096 (opt-in: slower
    than the butterflies on most H200 widths). ``splits``: programs per (row, group) of the
    prepared write (:func:`rotate_splits`). ``records``: buffers of :func:`imma_records` the same
    launch fills with the int8 tensor-core kernel's activation records (the prepared one-launch
    form of a one-group rotation, ≤ 8 rows; bit for bit :func:`imma_activation`'s words).
    ``dense_order`` (int32 [n], a permutation; not with ``prepared_order``): float16 [M, n] with
    coordinate ``c`` at column ``dense_order[c]`` — the activation of the many-row products in
    the column order of the float16 copies (:func:`dense_input_order`), in the same launch.
    """
    if not isinstance(rotation, DeviceRotation):
        rotation = DeviceRotation.from_tables(rotation, x.device)
    check_tensor(x, "x", (torch.float32, torch.float16, torch.bfloat16))
    if x.dim() != 2 or x.shape[1] != rotation.n:
        raise InvalidInput(f"x must be [M, {rotation.n}] for this rotation, got {list(x.shape)}")
    return _rotate(x, rotation, _PreOp(), prepared_order, out, tensor_cores, one_launch, splits,
                   records, dense_order)


def norm_rotate(x: torch.Tensor, weight: torch.Tensor, eps: float,
                rotation: DeviceRotation | RotationTables, *, delta: torch.Tensor | None = None,
                prepared_order: torch.Tensor | None = None, out: torch.Tensor | None = None,
                tensor_cores: bool = False, splits: int | None = None,
                records: tuple[torch.Tensor, torch.Tensor] | None = None,
                dense_order: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm (after the residual add) and the input rotation in one launch: twin of
    ``reference.norm_rotate``.

    x: the residual stream [M, n] float32/float16/bfloat16; delta: None or [M, n] (any float dtype;
    narrowed to x's dtype before the add); weight: the norm weight [n] (float32 or x's dtype); eps.
    Returns ``(r, y)``: ``r = x + delta`` in x's dtype (``x`` itself without ``delta``; a new
    tensor, written by the same launch) and ``y = Q·rms_norm(r)`` with the HF rounding of
    ``reference.rms_norm`` — float32 [M, n] in natural order, or with ``prepared_order`` the
    prepared layout (see :func:`rotate`). The row's mean square is summed in f32 in the kernel's
    order, so ``y`` can differ from the reference by one rounding of the narrowed norm.
    ``records`` and ``dense_order`` as for :func:`rotate`.
    """
    if not isinstance(rotation, DeviceRotation):
        rotation = DeviceRotation.from_tables(rotation, x.device)
    n = rotation.n
    check_tensor(x, "x", (torch.float32, torch.float16, torch.bfloat16))
    if x.dim() != 2 or x.shape[1] != n:
        raise InvalidInput(f"x must be [M, {n}] for this rotation, got {list(x.shape)}")
    check_tensor(weight, "weight", (torch.float32, x.dtype), (n,), device=x.device)
    if delta is not None:
        check_tensor(delta, "delta", (torch.float32, torch.float16, torch.bfloat16),
                     tuple(x.shape), device=x.device)
    if not math.isfinite(eps) or eps < 0:
        raise InvalidInput(f"eps must be finite and ≥ 0, got {eps}")
    r = x if delta is None else torch.empty_like(x)
    pre = _PreOp(code=(PRE_NORM if delta is None else PRE_ADD_NORM).value, aux=delta,
                 weight=weight, residual=r, eps=float(eps),
                 hdt=_HALF_CODES[torch.promote_types(x.dtype, weight.dtype)])
    return r, _rotate(x, rotation, pre, prepared_order, out, tensor_cores, True, splits, records,
                      dense_order)


def silu_mul_rotate(gate_up: torch.Tensor, dtype: torch.dtype,
                    rotation: DeviceRotation | RotationTables, *,
                    prepared_order: torch.Tensor | None = None, out: torch.Tensor | None = None,
                    tensor_cores: bool = False, splits: int | None = None,
                    records: tuple[torch.Tensor, torch.Tensor] | None = None,
                    dense_order: torch.Tensor | None = None) -> torch.Tensor:
    """SwiGLU and the input rotation of the down projection in one launch: twin of
    ``reference.silu_mul_rotate``.

    gate_up: [M, 2n] float32/float16/bfloat16 (gate columns first); dtype: the activation dtype
    ``silu(gate)·up`` (computed in gate_up's dtype) is narrowed to. Returns ``Q·silu_mul`` as
    :func:`rotate` does (natural order, or the prepared layout with ``prepared_order``;
    ``records`` and ``dense_order`` as there).
    """
    if not isinstance(rotation, DeviceRotation):
        rotation = DeviceRotation.from_tables(rotation, gate_up.device)
    n = rotation.n
    check_tensor(gate_up, "gate_up", (torch.float32, torch.float16, torch.bfloat16))
    if gate_up.dim() != 2 or gate_up.shape[1] != 2 * n:
        raise InvalidInput(f"gate_up must be [M, {2 * n}] for this rotation, "
                           f"got {list(gate_up.shape)}")
    if dtype not in _HALF_CODES:
        raise InvalidInput(f"dtype must be float32, float16 or bfloat16, got {dtype}")
    pre = _PreOp(code=PRE_SILU_MUL.value, hdt=_HALF_CODES[dtype])
    return _rotate(gate_up, rotation, pre, prepared_order, out, tensor_cores, True, splits,
                   records, dense_order)


def _rotate(x: torch.Tensor, rotation: DeviceRotation, pre: _PreOp,
            prepared_order: torch.Tensor | None, out: torch.Tensor | None, tensor_cores: bool,
            one_launch: bool, splits: int | None = None,
            records: tuple[torch.Tensor, torch.Tensor] | None = None,
            dense_order: torch.Tensor | None = None) -> torch.Tensor:
    """Launch the rotation of ``x``'s rows (or of their pre-op) after the entry points' checks."""
    n = rotation.n
    check_tensor(rotation.signs, "rotation.signs", torch.float32, (n,), device=x.device)
    m_rows = int(x.shape[0])
    k, m = rotation.odd, rotation.pow2
    if k > 64:
        raise UnsupportedShape(f"rotation with an odd factor k={k} > 64")
    warps = 8 if m >= 2048 else 4
    # PDL for one row, which goes on to the m1 kernel (PDL_MAX_ROWS)
    rotate_pdl = m_rows <= PDL_MAX_ROWS and pdl_enabled(x.device)
    aux = pre.aux if pre.aux is not None else x
    res = pre.residual if pre.residual is not None else x
    pre_args = (aux, aux.stride(0), pre.weight if pre.weight is not None else x, res,
                res.stride(0), pre.eps)
    if records is not None and (prepared_order is None or not one_launch):
        raise InvalidInput("activation records come only with the one-launch prepared rotation")
    if dense_order is not None:
        if prepared_order is not None:
            raise InvalidInput("dense_order and prepared_order are two output layouts: give one")
        check_tensor(dense_order, "dense_order", torch.int32, (n,), device=x.device)
    if prepared_order is not None and one_launch:
        check_tensor(prepared_order, "prepared_order", torch.int32, (BLOCK,), device=x.device)
        n_blocks = n // BLOCK
        out = _prepared_out(out, m_rows, n_blocks, x.device)
        npp = ref.prepared_pairs(n_blocks)
        pr = triton.next_power_of_2(_group_pair_span(k, m, npp))
        parts = min(rotate_splits(splits), pr, m)
        rec, ex = (out, out) if records is None else _check_records(records, k, m_rows, npp,
                                                                     x.device)
        if m_rows:
            rotate_prepared_kernel[(out.shape[0], k, parts)](
                x, x.stride(0), rotation.signs, rotation.small, out, out.stride(0),
                prepared_order, rotation.inv_sqrt_m, m_rows, *pre_args, rec, ex,
                N=n, N_BLOCKS=n_blocks, NPP=npp, PR=pr, K=k, MW=m, LOG2M=int(math.log2(m)),
                TC=bool(tensor_cores), PRE=pre.code, HDT=pre.hdt, SPLITS=parts,
                RECORDS=records is not None, A16=A16,
                num_warps=warps,
                **_pdl_launch(rotate_pdl),
            )
        return out
    if prepared_order is None:
        dt = torch.float32 if dense_order is None else torch.float16
        nat = out if out is not None else torch.empty((m_rows, n), dtype=dt, device=x.device)
        check_tensor(nat, "out", dt, (m_rows, n), device=x.device)
    else:
        nat = torch.empty((m_rows, n), dtype=torch.float32, device=x.device)
    if m_rows:
        rotate_kernel[(m_rows, k)](
            x, x.stride(0), rotation.signs, rotation.small, nat, nat.stride(0),
            rotation.inv_sqrt_m, *pre_args, nat if dense_order is None else dense_order,
            K=k, MW=m, LOG2M=int(math.log2(m)), TC=bool(tensor_cores), PRE=pre.code,
            HDT=pre.hdt, DEST=dense_order is not None, num_warps=warps,
            **_pdl_launch(rotate_pdl),
        )
    if prepared_order is None:
        return nat
    return prepare_activation(nat, n // BLOCK, prepared_order, out=out)


def _check_records(records: tuple[torch.Tensor, torch.Tensor], k: int, m_rows: int, npp: int,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``records`` buffers of a rotation (see :func:`rotate`), checked: one group, ≤ 16 rows,
    the shapes of :func:`imma_records` for ``m_rows``."""
    if k != 1:
        raise UnsupportedShape(f"activation records from the rotation need one group (a "
                               f"power-of-two width), not {k}")
    _check_imma_rows(m_rows)
    return _check_acts(records, npp, device, imma_chunks(m_rows))


# ------------------------------------------------------------------------------------ lattice


def _check_lattice(w: Tetra48Weight | Planes14Weight, words: torch.Tensor, name: str,
                   t64_ok: bool = False) -> None:
    if getattr(w, "t64", False) and not t64_ok:
        raise InvalidInput(
            "this Tetra48Weight is in the tetra64 layout, which only the m1, int8 and "
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


def tetra48_matvec_prepared(xp: torch.Tensor, w: Tetra48Weight, m_rows: int,
                            config: MatvecConfig | None = None,
                            out: torch.Tensor | None = None,
                            acts: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """``y = W x`` from an already prepared activation (trio order): float32 [M, d_out]. With no
    ``config``: one row, or several on the CPU interpreter, the ``m1``/tiled plan; 3..16 rows on
    a GPU the int8 tensor-core kernel (:func:`tetra48_matvec_imma_prepared`, see
    :data:`IMMA_MIN_ROWS`; ``acts``: its activation records when they exist already, e.g.
    written by the rotation; used only on that path). The ``tetra64`` layout (``w.t64``,
    ``formats.layouts.tetra64``) takes the ``m1`` plan (``CODE = TETRA_64``) or the int8
    kernel; the tiled kernel raises :class:`UnsupportedShape` on it."""
    _check_lattice(w, w.words, "words", t64_ok=True)
    if w.t64 and not A16:
        if config is None and w.n_blocks and 1 <= m_rows <= IMMA_ROWS:
            return tetra48_matvec_imma_prepared(xp, w, m_rows, out=out, acts=acts)
        raise UnsupportedShape("the batch-1 kernel decodes the tetra64 layout with 16-bit "
                               "activations only (ops.A16 is False); pass no configuration")
    if config is None and imma_default(w, m_rows):
        return tetra48_matvec_imma_prepared(xp, w, m_rows, out=out, acts=acts)
    _check_prepared(xp, m_rows, w.n_blocks, w.words.device)
    y = out if out is not None else torch.empty(m_rows, w.d_out, dtype=torch.float32,
                                                device=xp.device)
    plan = _m1_groups(w, m_rows, xp.device, config, _check_m1_t64 if w.t64 else None,
                      many_rows=w.t64)
    if plan is not None:
        first = 0
        for rows, c in plan:
            _launch_m1("tetra48", xp[first:], w, y[first:], c, rows)
            first += rows
        return y
    if w.t64:
        raise UnsupportedShape(
            f"the tetra64 layout is read only by the m1 and int8 kernels, none of which takes "
            f"{m_rows} rows of this matrix here (config {config}); use the standard layout")
    cfg = _tile_config(config or default_config(m_rows), m_rows)
    tabs = tetra_kernel_tables(w.words.device)
    tetra48_matvec_kernel[(triton.cdiv(w.d_out, cfg.rows),)](
        xp, w.words, w.row_scales, w.row_centroids, w.tail, tabs.rows, tabs.cw, y, y.stride(0),
        w.d_out, N_BLOCKS=w.n_blocks, TAIL_COLS=w.tail_cols, M=m_rows, ROWS=cfg.rows, BP=cfg.bp,
        USE_ASM=_use_asm(), SMEM_ROWS=cfg.smem_rows, num_warps=cfg.num_warps,
    )
    return y


def _m1_groups(w: Tetra48Weight | Planes14Weight, m_rows: int, device: torch.device,
               config: MatvecConfig | None, check: Callable | None = None,
               many_rows: bool = False) -> list[tuple[int, MatvecConfig]] | None:
    """The ``(rows, configuration)`` launch groups of an ``m1`` kernel for ``m_rows`` activation
    rows, or None when the tiled kernel serves them. With no ``config``: the row groups of
    :func:`m1_plan`, each in its own geometry (H200, Qwen3-8B projections, 2026-11-30: M = 5 9.18
    ms, 6 10.09, 7 12.30 against 6.59 for 4 and 12.44 for 8) — one row anywhere, several only on
    a GPU (:func:`_many_row_m1_default`); an ``m1`` ``config`` serves all rows (several need its
    ``mb`` > 1). Every group must fit the kernel and pass :func:`m1_enabled` with ``check`` (the
    kernel's first-use check; default: Tetra's). ``many_rows``: several rows take the ``m1``
    row groups under the interpreter too (a layout only ``m1`` reads)."""
    if config is None:
        if m_rows > 1 and not (many_rows or _many_row_m1_default()):
            return None
        plan = m1_plan(w.d_out, w.n_blocks, device, w.tail_cols, m_rows,
                       getattr(w, "t64", False))
    else:
        plan = [(m_rows, config)]
    if all(_m1_applies(c, w) and _m1_runs(c, rows, device, check) for rows, c in plan):
        return plan
    return None


def _m1_runs(cfg: MatvecConfig, m_rows: int, device: torch.device,
             check: Callable | None = None) -> bool:
    """Whether ``cfg`` asks for an ``m1`` kernel that may serve ``m_rows`` rows: one row, or
    several with ``mb`` > 1, and :func:`m1_enabled` with ``check``."""
    return (cfg.kernel == "m1" and (m_rows == 1 or cfg.mb > 1)
            and m1_enabled(device, cfg, check))


def _m1_applies(cfg: MatvecConfig, w: Tetra48Weight | Planes14Weight) -> bool:
    """An ``m1`` configuration and a shape it can take (≥ 1 block, chunks within the tickets)."""
    return (cfg.kernel == "m1" and w.n_blocks >= 1
            and -(-w.d_out // max(cfg.rows, 1)) <= TICKET_SLOTS)


def _check_out(y: torch.Tensor, m_rows: int, d_out: int) -> None:
    """An output buffer a launch writes rows ``0..m_rows-1`` of: [≥ m_rows, d_out], unit column
    stride (a column slice of a wider output is fine)."""
    if y.dim() != 2 or y.shape[0] < m_rows or y.shape[1] != d_out or y.stride(1) != 1:
        raise InvalidInput(f"out must be [{m_rows}, {d_out}] with unit column stride")


def _launch_m1(kind: str, xp: torch.Tensor, w: Tetra48Weight | Planes14Weight, y: torch.Tensor,
               cfg: MatvecConfig, m_rows: int = 1, **consts: Any) -> None:
    """Launch the ``m1`` kernel writing rows ``0..m_rows-1`` of ``y``: ``kind`` ``"tetra48"`` or
    ``"planes14"`` (``m1_kernel`` with that decode; ``cfg.mb`` activation rows per launch, fewer
    for the last launch when the prepared buffer has fewer rows left; ``consts``: further
    constexprs). ``CODE`` goes as a plain int (torch 2.11's Dynamo rejects a ``tl.constexpr``
    object as a kernel argument), and every parameter is passed (torch 2.11's Inductor fails on a
    call that leaves one to its default)."""
    _check_out(y, m_rows, w.d_out)
    if not w.d_out:
        return
    grid, ns = m1_grid(w.d_out, w.n_blocks, cfg, xp.device)
    if kind == "planes14":
        data, table = w.records, planes14_m1_table(xp.device)
        consts = {"CODE": PLANES14.value, "SEL_TABLE": True, **consts}
    elif w.t64:
        data, table = w.words, tetra_m1_bits_table(xp.device, T64_PBITS.value)
        consts = {"CODE": TETRA_64.value, "SEL_TABLE": True, **consts}
    else:
        data, table = w.words, tetra_m1_table(xp.device)
        consts = {"CODE": TETRA.value, "SEL_TABLE": True, **consts}
    pdl = _pdl_launch(pdl_enabled(xp.device) and m_rows <= PDL_MAX_ROWS)
    for i in range(0, m_rows, cfg.mb):
        mb = min(cfg.mb, ref.prepared_rows(m_rows - i))
        part = torch.empty(ns, mb, w.d_out, dtype=torch.float32, device=xp.device)
        m1_kernel[(grid,)](
            xp[i:], data, w.row_scales, w.row_centroids, w.tail, table, part, _tickets(xp.device),
            y[i:], w.d_out, xp.stride(0), y.stride(0), min(mb, m_rows - i),
            N_BLOCKS=w.n_blocks, TAIL_COLS=w.tail_cols, ROWS=cfg.rows, NW=cfg.num_warps,
            BP=cfg.bp, USE_ASM=_use_asm(), num_warps=cfg.num_warps, num_stages=1, ILP=cfg.ilp,
            MB=mb, A16=A16, **consts, **pdl,
            **({"maxnreg": cfg.maxnreg} if cfg.maxnreg else {}),
        )


def tetra48_matvec(x: torch.Tensor, w: Tetra48Weight,
                   config: MatvecConfig | None = None) -> torch.Tensor:
    """``y = W x`` for x [M, d_in] in the rotated basis (twin of ``reference.tetra48_matvec``)."""
    m_rows = _check_x(x, w.d_in, w.words.device)
    xp = prepare_activation(x, w.n_blocks, tetra_kernel_tables(x.device).order)
    return tetra48_matvec_prepared(xp, w, m_rows, config)


@dataclass(frozen=True)
class DequantConfig:
    """Geometry and store form of the dequantization kernels (:mod:`.tetra48_dequant`,
    :mod:`.planes14_dequant`).

    ``grouped``: the column layout of ``reference.dequant_group_columns`` (a warp's lanes store
    consecutive 16-byte units) instead of block-major (each lane's 96 bytes apart from the next
    lane's). ``vector_stores``: one ``st.global.v4`` per 8 values instead of four 4-byte stores.
    ``programs_per_sm``: grid of the grid-stride loop (each program stages the decode table once;
    at most 7 tables fit in an SM's shared memory)."""

    grouped: bool = False
    vector_stores: bool = False
    num_warps: int = 4
    programs_per_sm: int = 8


DEQUANT_DEFAULT = DequantConfig(grouped=True, vector_stores=True, num_warps=8, programs_per_sm=4)
"""The dequantization form used when none is given: the grouped layout with 16-byte stores, 8
warps, 4 programs per SM (tuning in docs/decisions.md)."""


def dequant_config() -> DequantConfig:
    """:data:`DEQUANT_DEFAULT` (read at call time, so that a test may replace it)."""
    return DEQUANT_DEFAULT


def tetra48_dequantize_f16(w: Tetra48Weight, out: torch.Tensor | None = None,
                           config: DequantConfig | None = None) -> torch.Tensor:
    """The record's coded blocks as float16 ``[d_out, 24·n_blocks]`` without σ_row, columns as
    :func:`dequant_natural_index` maps them (twin of ``reference.tetra48_dequantize_f16`` with the
    same ``grouped``; :mod:`.tetra48_dequant`). ``config``: :func:`dequant_config` if None.
    The ``tetra64`` layout (``w.t64``) is decoded as such."""
    _check_lattice(w, w.words, "words", t64_ok=True)
    dev = w.words.device
    out = _dequant_out(out, w, dev)
    cfg = dequant_config() if config is None else config
    if w.d_out and w.n_blocks:
        tetra48_dequant_kernel[(_dequant_grid(w, dev, cfg),)](
            w.words, w.row_centroids, tetra_m1_table(dev), out.view(torch.int32), w.d_out,
            N_BLOCKS=w.n_blocks, NW=cfg.num_warps, USE_ASM=_use_asm(), VEC=cfg.vector_stores,
            GROUPED=cfg.grouped, T64=w.t64, num_warps=cfg.num_warps,
            num_stages=1,
        )
    return out


def _dequant_out(out: torch.Tensor | None, w: Tetra48Weight | Planes14Weight,
                 device: torch.device) -> torch.Tensor:
    """The float16 ``[d_out, 24·n_blocks]`` buffer a dequantization kernel writes: ``out``
    checked, or a new one."""
    shape = (w.d_out, BLOCK * w.n_blocks)
    if out is None:
        return torch.empty(shape, dtype=torch.float16, device=device)
    check_tensor(out, "out", torch.float16, shape, device=device)
    return out


def _dequant_grid(w: Tetra48Weight | Planes14Weight, device: torch.device,
                  cfg: DequantConfig) -> int:
    """Programs of a dequantization kernel's grid-stride loop over (row, block pair) items: one
    item per lane, at most ``cfg.programs_per_sm`` programs per SM."""
    if cfg.num_warps not in (1, 2, 4, 8, 16) or cfg.programs_per_sm < 1:
        raise InvalidInput(f"dequantization geometry {cfg}: num_warps must be 1, 2, 4, 8 or 16 "
                           "and programs_per_sm at least 1")
    items = w.d_out * ((w.n_blocks + 1) // 2)
    return max(1, min(triton.cdiv(items, cfg.num_warps * 32),
                      cfg.programs_per_sm * _sm_count(device)))


_BLOCK_INDEX: dict[tuple[str, str, int], torch.Tensor] = {}


def _block_index(kind: str, n_blocks: int, device: torch.device | str,
                 per_block: Callable[[], torch.Tensor]) -> torch.Tensor:
    """int64 [len(per_block()) · n_blocks]: entry ``j`` of block ``b`` is column
    ``24 b + per_block()[j]`` of a row, or ``24 · n_blocks`` where ``per_block()[j] < 0``; built
    once per (kind, device, width)."""
    key = (kind, str(device), n_blocks)
    if key not in _BLOCK_INDEX:
        pb = per_block().to(torch.int64)
        idx = torch.arange(n_blocks)[:, None] * BLOCK + pb[None, :]
        idx = torch.where(pb[None, :] >= 0, idx, BLOCK * n_blocks)
        _BLOCK_INDEX[key] = idx.reshape(-1).to(device)
    return _BLOCK_INDEX[key]


def dequant_natural_index(n_blocks: int, device: torch.device | str,
                          grouped: bool = False) -> torch.Tensor:
    """int64 [24·n_blocks]: the natural (rotated-basis) column of each column of
    :func:`tetra48_dequantize_f16` in the block-major or ``grouped`` layout (cached per device,
    width and layout)."""
    def blocks() -> torch.Tensor:
        return _block_index("dequant", n_blocks, device,
                            lambda: ref.dequant_column_order(tetra_kernel_tables("cpu").order))

    return _grouped_index("tetra48", blocks, n_blocks, device) if grouped else blocks()


_GROUPED_INDEX: dict[tuple[str, str, int], torch.Tensor] = {}


def _grouped_index(kind: str, blocks: Callable[[], torch.Tensor], n_blocks: int,
                   device: torch.device | str) -> torch.Tensor:
    """The block-major column map ``blocks()`` (int64 [24·n_blocks] on ``device``; built only on
    the first call) taken in the grouped layout's column order (cached per kind, device and
    width)."""
    key = (kind, str(device), n_blocks)
    if key not in _GROUPED_INDEX:
        _GROUPED_INDEX[key] = blocks()[ref.dequant_group_columns(n_blocks).to(device)]
    return _GROUPED_INDEX[key]


def planes14_dequant_natural_index(n_blocks: int, device: torch.device | str,
                                   grouped: bool = False) -> torch.Tensor | None:
    """int64 [24·n_blocks]: the natural column of each column of :func:`planes14_dequantize_f16`
    in the ``grouped`` layout (cached), or None for the block-major layout (natural order)."""
    if not grouped:
        return None
    return _grouped_index("planes14", lambda: torch.arange(BLOCK * n_blocks, device=device),
                          n_blocks, device)


def tetra48_matmul_dense(x: torch.Tensor, w: Tetra48Weight) -> torch.Tensor:
    """``y = W x`` for many activation rows through a float16 copy of W and cuBLAS: float32
    [M, d_out] from x [M, d_in] (rotated basis). Values and activations are rounded to float16
    (relative error ≲ 2^-11 per product, the precision of an fp16 model); σ_row and the tail are
    applied in float32. Twin of ``reference.tetra48_matvec`` within that tolerance."""
    _check_x(x, w.d_in, w.words.device, max_rows=None)
    return _dense_product_natural(x, w)


def _is_tetra48(w: Tetra48Weight | Planes14Weight) -> bool:
    """Whether a lattice record is ``tetra48`` (its words) rather than ``planes14`` (records)."""
    return hasattr(w, "words")


def _copy_columns(w: Tetra48Weight | Planes14Weight, device: torch.device | str,
                  grouped: bool) -> torch.Tensor | None:
    """The natural (rotated-basis) column of each column of ``w``'s float16 copy in the
    block-major or ``grouped`` layout (:func:`dequant_natural_index`,
    :func:`planes14_dequant_natural_index`), or None where that is the natural order."""
    if _is_tetra48(w):
        return dequant_natural_index(w.n_blocks, device, grouped)
    return planes14_dequant_natural_index(w.n_blocks, device, grouped)


def _dense_product_natural(x: torch.Tensor, w: Tetra48Weight | Planes14Weight) -> torch.Tensor:
    """:func:`_dense_product` from the float32 activation in natural order: its block columns
    gathered into the copy's column order (:func:`_copy_columns`) and rounded to float16."""
    cfg = dequant_config()
    idx = _copy_columns(w, x.device, cfg.grouped)
    xq = (x[:, : BLOCK * w.n_blocks] if idx is None else x[:, idx]).to(torch.float16)
    return _dense_product(xq, x, w, cfg)


def _dense_product(xq: torch.Tensor, x: torch.Tensor, w: Tetra48Weight | Planes14Weight,
                   cfg: DequantConfig) -> torch.Tensor:
    """The many-row product from the float16 activation ``xq`` [M, 24·n_blocks] in the column
    order of ``w``'s float16 copy under ``cfg``: that copy (``tetra48_dequantize_f16`` or
    ``planes14_dequantize_f16``), one GEMM, then σ_row and the tail ``x[:, 24·n_blocks:]`` in
    one epilogue (:func:`_scale_and_tail`): float32 [M, d_out]."""
    dequantize = tetra48_dequantize_f16 if _is_tetra48(w) else planes14_dequantize_f16
    return _scale_and_tail(xq @ dequantize(w, config=cfg).T, x, w)


EPILOGUE_ROWS = 16
"""Activation rows per program of the many-row epilogue (:mod:`.dense_epilogue`) from
:data:`EPILOGUE_MIN_ROWS` rows on; fewer rows take one row per program. H200, Qwen3-8B prefill,
the 144 epilogues (``benchmarks/step_breakdown.py``): 512 rows 4.29 → 2.41 ms; 32 rows 0.54 →
0.99 ms (too few programs), hence the threshold."""

EPILOGUE_MIN_ROWS = 128
"""From this many activation rows the epilogue takes :data:`EPILOGUE_ROWS` per program."""


def _scale_and_tail(y16: torch.Tensor, x: torch.Tensor, w: Tetra48Weight | Planes14Weight
                    ) -> torch.Tensor:
    """σ_row and the tail columns on the blocks' product ``y16`` [M, d_out] (float16 or float32,
    unit column stride): float32 [M, d_out] in one launch (:mod:`.dense_epilogue`; twin
    ``reference.scale_and_tail``). The tail activation is ``x[:, 24·n_blocks:]`` (any float)."""
    m_rows = int(y16.shape[0])
    out = torch.empty(m_rows, w.d_out, dtype=torch.float32, device=y16.device)
    if m_rows and w.d_out:
        tail_x = x[:, BLOCK * w.n_blocks:]
        bo = 256
        bm = EPILOGUE_ROWS if m_rows >= EPILOGUE_MIN_ROWS else 1
        scale_tail_kernel[(triton.cdiv(m_rows, bm), triton.cdiv(w.d_out, bo))](
            y16, y16.stride(0), w.row_scales, tail_x, x.stride(0), w.tail, out, w.d_out, m_rows,
            TAIL=w.tail_cols, TP=triton.next_power_of_2(max(w.tail_cols, 1)), BO=bo, BM=bm,
            num_warps=4,
        )
    return out


IMMA_ROWS = 16
"""Activation rows of one :func:`tetra48_matvec_imma_prepared` launch: one or two chunks of 8
(the ``A`` fragments of a step hold eight; fewer real rows in a chunk pad with zeros at the same
cost), each decoded block meeting every chunk (:func:`imma_chunks`)."""


def imma_chunks(m_rows: int) -> int:
    """8-row chunks of activation records the int8 kernel runs for ``m_rows`` rows (1 or 2)."""
    return 1 if m_rows <= 8 else 2


IMMA_MAXNREG = 0
"""Register cap of the int8 tensor-core kernel (0: the compiler's choice, 128 registers offline).
H200, per Qwen3-8B projection at 8 rows (``benchmarks/imma_breakdown.py``, 2026-11-30): the cap
232 (180 registers) was 4 % faster on gate|up and up to 15 % slower on the others."""

IMMA_MIN_ROWS = 3
"""From this many activation rows (to :data:`IMMA_ROWS`) :func:`tetra48_matvec_prepared` and
:func:`planes14_matvec_planned` with no configuration run the int8 tensor-core kernel on a GPU
(fewer rows: the ``m1`` kernel; tuning in docs/decisions.md)."""


def imma_default(w: Tetra48Weight | Planes14Weight, m_rows: int) -> bool:
    """Whether ``m_rows`` unconfigured activation rows of ``w`` take the int8 tensor-core kernel
    on this machine (a matrix with no coded block, the tail only, stays on the ``m1``/tiled
    plan). For Planes14 also only from the ``m1`` order (:func:`planes14_matvec_planned` with a
    plan)."""
    return IMMA_MIN_ROWS <= m_rows <= IMMA_ROWS and w.n_blocks >= 1 and not interpreting()


def imma_activation(xp: torch.Tensor, m_rows: int, n_blocks: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """The int8 tensor-core kernel's activation (:mod:`.tetra48_imma`) from the prepared layout
    ``xp`` (float32 [MP, 48·NPP + 32], ``m_rows ≤ 16`` real rows) in ``C`` =
    :func:`imma_chunks` chunks of 8 rows: the ``A`` fragment words, int32 [C · NPP/2 · 576]
    (``tetra48_imma.STEP_WORDS`` per 4-block step), and the block exponents, float32
    [C · 2·NPP · 8]. One launch; every word is written (rows past ``m_rows`` and blocks past
    ``n_blocks`` as zeros). Shared by every matrix that reads this activation."""
    _check_imma_rows(m_rows)
    _check_prepared(xp, m_rows, n_blocks, xp.device, IMMA_ROWS)
    npp = ref.prepared_pairs(n_blocks)
    chunks = imma_chunks(m_rows)
    rec_shape, ex_shape = _record_shapes(npp, chunks)
    rec = torch.empty(rec_shape, dtype=torch.int32, device=xp.device)
    ex = torch.empty(ex_shape, dtype=torch.float32, device=xp.device)
    blk = 64
    imma_activation_kernel[(8 * chunks, triton.cdiv(npp, blk))](
        xp, xp.stride(0), rec, ex, m_rows, xp.shape[0], NPP=npp, BLK=blk, USE_ASM=_use_asm(),
        A16=A16,
    )
    return rec, ex


def imma_records(n_blocks: int, device: torch.device | str, m_rows: int = 8
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Zeroed buffers for a rotation of ``m_rows`` (1..16) rows to fill with the int8 kernel's
    activation records (``rotate(..., records=)``): int32 [C · NPP/2 · 576] and float32
    [C · 2·NPP · 8], ``C`` = :func:`imma_chunks`. The rotation writes the rows it runs
    (``prepared_rows(m)``); rows past them must stay zero, so keep one buffer per row count."""
    _check_imma_rows(m_rows)
    rec_shape, ex_shape = _record_shapes(ref.prepared_pairs(n_blocks), imma_chunks(m_rows))
    return (torch.zeros(rec_shape, dtype=torch.int32, device=device),
            torch.zeros(ex_shape, dtype=torch.float32, device=device))


def _record_shapes(npp: int, chunks: int) -> tuple[tuple[int], tuple[int]]:
    """The shapes of the int8 kernel's activation records for ``NPP`` prepared pairs and
    ``chunks`` chunks of 8 rows: the ``A`` words (``tetra48_imma.STEP_WORDS`` per 4-block step)
    and the exponents (8 rows per block), chunk after chunk."""
    return (chunks * npp // 2 * STEP_WORDS.value,), (chunks * 2 * npp * 8,)


def _check_imma_rows(m_rows: int) -> None:
    if not 1 <= m_rows <= IMMA_ROWS:
        raise UnsupportedShape(f"{m_rows} activation rows; the int8 tensor-core kernel takes "
                               f"1..{IMMA_ROWS}")


def _check_acts(acts: tuple[torch.Tensor, torch.Tensor], npp: int, device: torch.device,
                chunks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Activation records (``A`` words, exponents) checked against :func:`_record_shapes`."""
    rec, ex = acts
    rec_shape, ex_shape = _record_shapes(npp, chunks)
    check_tensor(rec, "records", torch.int32, rec_shape, device=device)
    check_tensor(ex, "exponents", torch.float32, ex_shape, device=device)
    return rec, ex


def imma_slices(d_out: int, n_blocks: int, device: torch.device, num_warps: int = 4,
                row_groups: int = 1, rows_per_step: int = 2, chunks: int = 1) -> int:
    """Blocks per K-slice (a multiple of 4) of the int8 tensor-core kernel: as many slices as fit
    one wave of four programs per SM (its register and shared-memory limit; three for two
    chunks of activation rows, 163 registers offline, or four row groups per step, 167) with all
    programs resident — never a
    partial second wave. H200, Qwen3-8B projections at 8 rows, kernel and
    slice sum, µs (``benchmarks/imma_breakdown.py --slices``, BENCHMARKS.md §3 run 14): q|k|v
    5 slices 19.6 (best, 6: 19.2); o 8 slices 15.5 (best 7: 15.1); gate|up 1 slice 57.6
    (best); down 8 slices 30.6 (best) — where rounding up to a second wave had 19.2, 16.2,
    59.9 and 33.1."""
    tiles = triton.cdiv(d_out, 8 * rows_per_step * num_warps * row_groups)
    steps = max(1, triton.cdiv(n_blocks, 4))
    resident = 4 if chunks == 1 and rows_per_step < 4 else 3
    ks = max(1, min(steps, (resident * _sm_count(device)) // tiles))
    return 4 * triton.cdiv(steps, ks)


def tetra48_matvec_imma_prepared(xp: torch.Tensor, w: Tetra48Weight, m_rows: int,
                                 out: torch.Tensor | None = None,
                                 acts: tuple[torch.Tensor, torch.Tensor] | None = None,
                                 k_per: int | None = None, num_warps: int = 4,
                                 row_groups: int = 1, rows_per_step: int = 2,
                                 maxnreg: int = IMMA_MAXNREG) -> torch.Tensor:
    """``y = W x`` for 1..16 activation rows on int8 tensor cores (:mod:`.tetra48_imma`): float32
    [M, d_out] from the prepared activation ``xp`` (as :func:`tetra48_matvec_prepared`; twin:
    ``reference.tetra48_matvec``, same accuracy as the batch-1 kernel). ``acts``: the result of
    :func:`imma_activation` for ``xp`` when several matrices share it; ``k_per`` blocks per
    K-slice (default :func:`imma_slices`); ``row_groups`` sets of ``8·rows_per_step·num_warps``
    rows per program; ``rows_per_step`` (1, 2, or 4 for at most 8 activation rows; offline
    167 registers with 16-bit activations, three programs per SM) groups of 8 rows per warp and
    step, sharing the step's activation fragments; ``maxnreg``: the register cap (0: the
    compiler's choice; :data:`IMMA_MAXNREG`). Three launches: the activation records (unless
    given), the MMA kernel and the slice sum. The ``tetra64`` layout (``w.t64``,
    ``CODE = TETRA_64``: its stored shells give ``1/‖y‖``) is decoded as such."""
    _check_lattice(w, w.words, "words", t64_ok=True)
    code = TETRA_64.value if w.t64 else TETRA.value
    return _matvec_imma(code, w.words, tetra_m1_table(xp.device), xp, w, m_rows, out,
                        acts, k_per, num_warps, row_groups, rows_per_step, maxnreg)


def planes14_matvec_imma_prepared(xp: torch.Tensor, w: Planes14Weight, m_rows: int,
                                  out: torch.Tensor | None = None,
                                  acts: tuple[torch.Tensor, torch.Tensor] | None = None,
                                  k_per: int | None = None, num_warps: int = 4,
                                  row_groups: int = 1, rows_per_step: int = 2,
                                  maxnreg: int = IMMA_MAXNREG) -> torch.Tensor:
    """:func:`tetra48_matvec_imma_prepared` for ``planes14`` records (the Planes14 decode of the
    batch-1 kernel, :mod:`.planes14_m1`), the activation prepared in ``tables.planes14_m1_order``
    (twin: ``reference.planes14_matvec``); :func:`planes14_matvec_planned` selects it for
    3..16 rows on a GPU."""
    _check_lattice(w, w.records, "records")
    return _matvec_imma(PLANES14.value, w.records, planes14_m1_table(xp.device), xp, w, m_rows,
                        out, acts, k_per, num_warps, row_groups, rows_per_step, maxnreg)


def _matvec_imma(code: int, data: torch.Tensor, table: torch.Tensor, xp: torch.Tensor,
                 w: Tetra48Weight | Planes14Weight, m_rows: int, out: torch.Tensor | None,
                 acts: tuple[torch.Tensor, torch.Tensor] | None, k_per: int | None,
                 num_warps: int, row_groups: int, rows_per_step: int,
                 maxnreg: int) -> torch.Tensor:
    """The launches of :func:`tetra48_matvec_imma_prepared` and
    :func:`planes14_matvec_imma_prepared` (``code``: the kernel's ``CODE``; ``data``: the words
    or records; ``table``: the decode's staged table)."""
    _check_imma_rows(m_rows)
    _check_prepared(xp, m_rows, w.n_blocks, data.device, IMMA_ROWS)
    chunks = imma_chunks(m_rows)
    dev = xp.device
    y = out if out is not None else torch.empty(m_rows, w.d_out, dtype=torch.float32, device=dev)
    _check_out(y, m_rows, w.d_out)
    if rows_per_step not in (1, 2, 4) or (rows_per_step == 4 and chunks > 1):
        raise InvalidInput(f"rows_per_step must be 1, 2 or 4 (4 for at most 8 activation rows), "
                           f"got {rows_per_step} for {m_rows} rows")
    if k_per is None:
        k_per = imma_slices(w.d_out, w.n_blocks, dev, num_warps, row_groups, rows_per_step,
                            chunks)
    if k_per < 4 or k_per % 4:
        raise InvalidInput(f"k_per must be a positive multiple of 4, got {k_per}")
    if not w.d_out:
        return y
    npp = ref.prepared_pairs(w.n_blocks)
    rec, ex = _check_acts(acts if acts is not None else imma_activation(xp, m_rows, w.n_blocks),
                          npp, dev, chunks)
    slices = max(1, triton.cdiv(w.n_blocks, k_per))
    part = torch.empty(slices, 8 * chunks, w.d_out, dtype=torch.float32, device=dev)
    tiles = triton.cdiv(w.d_out, 8 * rows_per_step * num_warps * row_groups)
    regs = {"maxnreg": maxnreg} if maxnreg and _use_asm() else {}
    imma_kernel[(tiles, slices)](
        rec, ex, data, w.row_centroids, table, part, w.d_out, k_per,
        N_BLOCKS=w.n_blocks, NPP=npp, NW=num_warps, RG=row_groups, RPS=rows_per_step,
        CH=chunks, CODE=code, USE_ASM=_use_asm(), A16=A16, num_warps=num_warps,
        num_stages=1, **regs,
    )
    blk = 128
    imma_finalize_kernel[(triton.cdiv(w.d_out, blk), m_rows)](
        part, w.row_scales, w.tail, xp, xp.stride(0), y, y.stride(0), w.d_out, slices,
        NPP=npp, TAIL_COLS=w.tail_cols, TAIL_P2=triton.next_power_of_2(max(1, w.tail_cols)),
        SLICES=triton.next_power_of_2(slices), BLK=blk, T=8 * chunks,
    )
    return y


def planes14_matvec_prepared(xp: torch.Tensor, w: Planes14Weight, m_rows: int,
                             config: MatvecConfig | None = None,
                             out: torch.Tensor | None = None) -> torch.Tensor:
    """``y = W x`` from a prepared activation (natural order): float32 [M, d_out]."""
    _check_lattice(w, w.records, "records")
    _check_prepared(xp, m_rows, w.n_blocks, w.records.device)
    cfg = _tile_config(config or default_config(m_rows), m_rows)
    y = out if out is not None else torch.empty(m_rows, w.d_out, dtype=torch.float32,
                                                device=xp.device)
    planes14_matvec_kernel[(triton.cdiv(w.d_out, cfg.rows),)](
        xp, w.records, w.row_scales, w.row_centroids, w.tail, planes14_kernel_table(xp.device), y,
        y.stride(0), w.d_out, N_BLOCKS=w.n_blocks, TAIL_COLS=w.tail_cols, M=m_rows,
        ROWS=cfg.rows, BP=cfg.bp, USE_ASM=_use_asm(), num_warps=cfg.num_warps,
    )
    return y


def planes14_matvec(x: torch.Tensor, w: Planes14Weight,
                    config: MatvecConfig | None = None) -> torch.Tensor:
    """``y = W x`` for a Planes14 record (twin of ``reference.planes14_matvec``). With no
    ``config``, the ``m1`` kernel with the Planes14 decode (:mod:`.planes14_m1`) in the row groups
    and per-shape geometry of :func:`m1_plan` (as Tetra: one row, two, or four per launch), and
    for 3..16 rows on a GPU the int8 tensor-core kernel (:func:`planes14_matvec_planned`); with
    an ``m1`` ``config``, that kernel in it (several rows need its ``mb`` 2 or 4); anything else
    (and several rows under the interpreter, where the many-row ``m1`` costs ~10 s a launch) the
    tiled kernel. H200, Qwen3-8B projections, 2026-11-30 (BENCHMARKS.md §3), ``m1`` against tiled
    (cuBLAS fp16 ≈ 4.7 ms): M = 1 3.37 vs 5.41 ms, M = 2 4.26 vs 5.44, M = 4 6.80 vs 9.92, M = 8
    13.10 vs 14.57."""
    m_rows = _check_x(x, w.d_in, w.records.device)
    plan = planes14_m1_groups(w, m_rows, x.device, config)
    xp = prepare_activation(x, w.n_blocks, planes14_order(x.device, plan is not None))
    return planes14_matvec_planned(xp, w, m_rows, plan, config)


def planes14_dequantize_f16(w: Planes14Weight, out: torch.Tensor | None = None,
                            config: DequantConfig | None = None) -> torch.Tensor:
    """The record's coded blocks as float16 ``[d_out, 24·n_blocks]`` without σ_row, natural
    column order within each block, the blocks as :func:`planes14_dequant_natural_index` maps
    them (twin of ``reference.planes14_dequantize_f16`` with the same ``grouped``;
    :mod:`.planes14_dequant`; the permute selectors from the staged table); ``config``:
    :func:`dequant_config` if None."""
    _check_lattice(w, w.records, "records")
    dev = w.records.device
    out = _dequant_out(out, w, dev)
    cfg = dequant_config() if config is None else config
    if w.d_out and w.n_blocks:
        planes14_dequant_kernel[(_dequant_grid(w, dev, cfg),)](
            w.records, w.row_centroids, planes14_m1_table(dev), out.view(torch.int32), w.d_out,
            N_BLOCKS=w.n_blocks, NW=cfg.num_warps, SEL_TABLE=True,
            USE_ASM=_use_asm(), VEC=cfg.vector_stores, GROUPED=cfg.grouped,
            num_warps=cfg.num_warps, num_stages=1,
        )
    return out


_P14_DENSE_CHECKED: dict[str, bool] = {}


def planes14_dense_enabled(device: torch.device) -> bool:
    """Whether :func:`planes14_matmul_dense` may serve many rows on ``device``. On a GPU its
    dequantization kernel is checked once, on first use and outside any CUDA-graph capture:
    bit-exact against ``reference.planes14_dequantize_f16`` on a small random record (odd block
    count); a failure or exception warns and disables it for good (the lattice matvec
    keeps the rows). Under a capture with no check yet it is not used for that call."""
    if interpreting() or device.type != "cuda":
        return True
    return _checked_once(_P14_DENSE_CHECKED, str(device), _check_planes14_dense, device)


def _check_planes14_dense(device: torch.device) -> bool:
    from leechq.formats.layouts.planes14 import random_planes14

    try:
        w = random_planes14(37, 13 * BLOCK + 5, seed=0x5EED, device=device)
        cfg = dequant_config()
        want = ref.planes14_dequantize_f16(w, grouped=cfg.grouped)
        same = torch.equal(planes14_dequantize_f16(w, config=cfg), want)
        if same:
            return True
        reason = "values differ from the reference"
    except Exception as exc:  # any failure means: do not use the kernel on this device
        reason = f"{type(exc).__name__}: {exc}"[:300]
    warnings.warn(f"the Planes14 dequantization kernel failed its first-use check on {device} "
                  f"({reason}); many rows keep the lattice matvec", stacklevel=3)
    return False


def planes14_matmul_dense(x: torch.Tensor, w: Planes14Weight) -> torch.Tensor:
    """``y = W x`` for many activation rows through a float16 copy of W and cuBLAS: float32
    [M, d_out] from x [M, d_in] (rotated basis), as :func:`tetra48_matmul_dense` (the same
    float16 rounding of values and activations; σ_row and the tail in float32). Twin of
    ``reference.planes14_matvec`` within that tolerance."""
    _check_x(x, w.d_in, w.records.device, max_rows=None)
    return _dense_product_natural(x, w)


_DENSE_ORDER: dict[tuple[str, str, int, int, bool], torch.Tensor] = {}


def dense_input_order(w: Tetra48Weight | Planes14Weight, device: torch.device | str
                      ) -> torch.Tensor:
    """int32 [d_in]: where each natural (rotated-basis) column of the activation goes so that the
    first ``24·n_blocks`` columns follow ``w``'s float16 copy under :func:`dequant_config` (the
    inverse of :func:`dequant_natural_index` / :func:`planes14_dequant_natural_index`) and the
    tail columns stay in place — the ``dense_order`` the rotation writes for
    :func:`matmul_dense_ordered` (cached per layout, device, width and layout form)."""
    grouped = dequant_config().grouped
    key = ("tetra48" if _is_tetra48(w) else "planes14", str(device), w.n_blocks, w.d_in, grouped)
    if key not in _DENSE_ORDER:
        n = BLOCK * w.n_blocks
        nat = _copy_columns(w, device, grouped)
        dest = torch.arange(w.d_in, dtype=torch.int64, device=device)
        if nat is not None:
            dest[nat] = torch.arange(n, dtype=torch.int64, device=device)
        _DENSE_ORDER[key] = dest.to(torch.int32)
    return _DENSE_ORDER[key]


def matmul_dense_ordered(x16: torch.Tensor, w: Tetra48Weight | Planes14Weight) -> torch.Tensor:
    """``y = W x`` for many activation rows from the float16 activation already in
    :func:`dense_input_order` (``rotate(..., dense_order=)`` writes it): float32 [M, d_out] by one
    dequantization, one GEMM and one epilogue (σ_row and the tail) — the gather and the
    conversion of :func:`tetra48_matmul_dense` / :func:`planes14_matmul_dense` are done by the
    rotation. Same numbers as those (float16 activations and values)."""
    check_tensor(x16, "x16", torch.float16, device=w.row_scales.device)
    if x16.dim() != 2 or x16.shape[1] != w.d_in:
        raise InvalidInput(f"x16 must be [M, {w.d_in}], got {list(x16.shape)}")
    return _dense_product(x16[:, : BLOCK * w.n_blocks], x16, w, dequant_config())


def planes14_m1_groups(w: Planes14Weight, m_rows: int, device: torch.device,
                       config: MatvecConfig | None = None) -> list[tuple[int, MatvecConfig]] | None:
    """The ``(rows, configuration)`` launch groups of the ``m1`` Planes14 kernel for ``m_rows``
    activation rows (1..8), or None when the tiled kernel serves them (see
    :func:`planes14_matvec`; the prepared activation's order follows: :func:`planes14_order`)."""
    return _m1_groups(w, m_rows, device, config, _check_planes14_m1)


def planes14_order(device: torch.device, m1: bool) -> torch.Tensor:
    """The order a Planes14 activation is prepared in: ``tables.planes14_m1_order`` for the ``m1``
    kernel, natural for the tiled one (int32 [24])."""
    return planes14_m1_order(device) if m1 else natural_order(device)


def planes14_matvec_planned(xp: torch.Tensor, w: Planes14Weight, m_rows: int,
                            plan: list[tuple[int, MatvecConfig]] | None,
                            config: MatvecConfig | None = None,
                            out: torch.Tensor | None = None,
                            acts: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """``y = W x`` from an activation prepared in :func:`planes14_order` for ``plan`` (from
    :func:`planes14_m1_groups`): its ``m1`` launch groups — or, for 3..16 rows with no ``config``
    on a GPU (:func:`imma_default`: 3..16 rows), the int8 tensor-core kernel from the same order
    (:func:`planes14_matvec_imma_prepared`; ``acts`` as for :func:`tetra48_matvec_prepared`) —
    or with ``plan`` None the tiled kernel (in ``config`` if that is a tiled configuration).
    float32 [m_rows, d_out]."""
    if plan is None:
        return planes14_matvec_prepared(xp, w, m_rows, config, out=out)
    if config is None and imma_default(w, m_rows):
        return planes14_matvec_imma_prepared(xp, w, m_rows, out=out, acts=acts)
    _check_prepared(xp, m_rows, w.n_blocks, w.records.device)
    y = out if out is not None else torch.empty(m_rows, w.d_out, dtype=torch.float32,
                                                device=xp.device)
    first = 0
    for rows, c in plan:
        end = first + ref.prepared_rows(rows)
        planes14_matvec_m1_prepared(xp[first:end], w, c, out=y[first:first + rows], m_rows=rows)
        first += rows
    return y


def _check_planes14_m1(device: torch.device, cfg: MatvecConfig) -> bool:
    from leechq.formats.layouts.planes14 import random_planes14

    cases = _m1_check_cases(
        device, cfg, random_planes14, ref.planes14_dequantize_rotated, planes14_m1_order,
        lambda xp, w, y, m: planes14_matvec_m1_prepared(xp, w, cfg, out=y, m_rows=m))
    return _first_use_check("m1 Planes14 kernel", device, cfg, cases)


def planes14_matvec_m1_prepared(xp: torch.Tensor, w: Planes14Weight, config: MatvecConfig,
                                out: torch.Tensor | None = None,
                                m_rows: int = 1) -> torch.Tensor:
    """``y = W x`` for ``m_rows`` activation rows prepared in ``tables.planes14_m1_order`` order,
    by the ``m1`` kernel with the Planes14 decode in ``config``'s geometry (``rows``, ``bp``,
    ``num_warps``, ``ctas_per_sm``, ``maxnreg``, ``mb`` activation rows per launch; one row per
    warp and trip): float32 [m_rows, d_out]. Several rows per launch (``mb`` 2 or 4: one decode
    for all of them; offline SASS 86 and 56 instructions per row and block against 131.5 for one
    row) are :func:`planes14_matvec`'s default for 2..8 rows. Each quad's byte-permute selector
    comes from the staged 4096-entry table (one shared load per quad)."""
    _check_lattice(w, w.records, "records")
    _check_prepared(xp, m_rows, w.n_blocks, w.records.device)
    if m_rows > 1 and config.mb == 1:
        raise InvalidInput(f"{m_rows} activation rows need a configuration with mb 2 or 4")
    y = out if out is not None else torch.empty(m_rows, w.d_out, dtype=torch.float32,
                                                device=xp.device)
    _launch_m1("planes14", xp, w, y, replace(config, ilp=1), m_rows)
    return y


# ------------------------------------------------------------------------------------ int4 / int8


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


# ------------------------------------------------------------------------------ decode attention

DECODE_ATTN_BLOCK_N = 64
"""Keys per ``tl.dot`` tile of the decode attention (:mod:`.decode_attention`)."""

DECODE_ATTN_MAX_SPLITS = 64
"""At most this many key splits per (row, key/value head); a split holds a whole number of tiles."""

DECODE_ATTN_MAX_HEAD_DIM = 256
"""The widest attention head :func:`decode_attention` takes."""


def decode_attention_splits(seq_len: int) -> tuple[int, int]:
    """``(keys per split, splits)`` of :func:`decode_attention` over a ``seq_len``-slot cache: one
    tile per split up to ``BLOCK_N · MAX_SPLITS`` slots, more tiles per split beyond."""
    tiles = max(1, triton.cdiv(seq_len, DECODE_ATTN_BLOCK_N))
    split = triton.cdiv(tiles, DECODE_ATTN_MAX_SPLITS) * DECODE_ATTN_BLOCK_N
    return split, triton.cdiv(seq_len, split)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     slot: torch.Tensor, pad: torch.Tensor, scale: float,
                     k_new: torch.Tensor | None = None,
                     v_new: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of one query position per row over a static KV cache (the serving model's decode
    step), reading only the slots the query sees (twin: ``reference.decode_attention``).

    Args:
        q: [B, n_kv, G, head_dim] (float16, bfloat16 or float32; the ``G`` query heads that share
            each key/value head, head ``kv·G + g``), unit stride along ``head_dim``.
        k_cache, v_cache: [B, n_kv, S, head_dim] of q's dtype, unit stride along ``head_dim``.
        slot: int64 [1], the query's cache slot ``t < S`` (read on the device: graph-safe; a
            larger ``t`` reads and writes nothing past the cache, and its slot is not written).
        pad: int64 [B], each row's left padding; key slot ``s`` is seen iff ``pad[b] <= s <= t``
            or ``s == t``.
        scale: the softmax scale (``head_dim ** -0.5``).
        k_new, v_new: [B, n_kv, 1, head_dim] of q's dtype (unit stride along ``head_dim``), the
            step's own key and value: written into slot ``t`` of the caches by the kernel (no
            separate cache write) and used for it; None when the caches already hold them.

    Returns:
        [B, n_kv, G, head_dim] of q's dtype, contiguous (so also [B, 1, n_kv·G·head_dim]).

    Raises:
        InvalidInput: mismatched shapes, dtypes or devices, a strided head dimension, a head
            dimension above :data:`DECODE_ATTN_MAX_HEAD_DIM`, a cache without slots.
    """
    if (k_new is None) != (v_new is None):
        raise InvalidInput("k_new and v_new go together")
    news = () if k_new is None else (("k_new", k_new), ("v_new", v_new))
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), *news):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise InvalidInput(f"{name} must be a 4-D tensor")
        if t.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise InvalidInput(f"{name} must be float16, bfloat16 or float32, got {t.dtype}")
        if t.dtype != q.dtype:
            raise InvalidInput(f"{name} is {t.dtype}, q is {q.dtype}")
        if t.stride(-1) != 1:
            raise InvalidInput(f"{name} must have unit stride along head_dim, got {t.stride()}")
        if t.device != q.device:
            raise InvalidInput(f"{name} is on {t.device}, q on {q.device}")
    if not interpreting() and q.device.type != "cuda":
        raise InvalidInput(f"q is on {q.device}; the Triton kernels need CUDA tensors")
    b, n_kv, g, hd = q.shape
    if k_cache.shape != v_cache.shape or tuple(k_cache.shape[:2]) != (b, n_kv) \
            or k_cache.shape[3] != hd:
        raise InvalidInput(f"k_cache and v_cache must be [{b}, {n_kv}, S, {hd}], got "
                           f"{list(k_cache.shape)} and {list(v_cache.shape)}")
    for name, t in news:
        if tuple(t.shape) != (b, n_kv, 1, hd):
            raise InvalidInput(f"{name} must be [{b}, {n_kv}, 1, {hd}], got {list(t.shape)}")
    if not 1 <= hd <= DECODE_ATTN_MAX_HEAD_DIM:
        raise InvalidInput(f"head_dim must be 1..{DECODE_ATTN_MAX_HEAD_DIM}, got {hd}")
    check_tensor(slot, "slot", torch.int64, (1,), device=q.device)
    check_tensor(pad, "pad", torch.int64, (b,), device=q.device)
    seq_len = int(k_cache.shape[2])
    if seq_len == 0:
        raise InvalidInput("k_cache and v_cache have no slots")
    out = torch.empty(b, n_kv, g, hd, dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    split, nsplit = decode_attention_splits(seq_len)
    po = torch.empty(b * n_kv * nsplit * g * hd, dtype=torch.float32, device=q.device)
    pml = torch.empty(b * n_kv * nsplit * g * 2, dtype=torch.float32, device=q.device)
    dp = max(16, triton.next_power_of_2(hd))
    kn, vn = (k_cache, v_cache) if k_new is None else (k_new, v_new)
    decode_attention_partial_kernel[(b * n_kv, nsplit)](
        q, k_cache, v_cache, slot, pad, po, pml, kn, vn,
        q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        kn.stride(0), kn.stride(1), vn.stride(0), vn.stride(1), float(scale) * LOG2E, seq_len,
        N_KV=n_kv, G=g, GP=max(16, triton.next_power_of_2(g)), D=hd, DP=dp,
        BLOCK_N=DECODE_ATTN_BLOCK_N, SPLIT=split, NSPLIT=nsplit,
        IEEE=q.dtype == torch.float32 or (interpreting() and q.dtype == torch.bfloat16),
        WRITE=k_new is not None, num_warps=4,
    )
    decode_attention_combine_kernel[(b * n_kv * g,)](
        po, pml, out, G=g, D=hd, DP=dp, NSPLIT=nsplit,
        SP=max(2, triton.next_power_of_2(nsplit)), num_warps=1,
    )
    return out
