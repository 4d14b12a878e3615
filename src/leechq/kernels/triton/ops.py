"""Host wrappers of the lattice matvec kernels and the activation preparation: validate, allocate,
launch (same signatures as the twins in ``leechq.kernels.reference``); the one namespace the
serving layers call for the matvecs.

Every wrapper checks what it is given and raises :class:`leechq.errors.InvalidInput` (a ValueError)
naming the tensor: wrong dtype, wrong shape for the packed record, non-contiguous storage, a tensor on
the CPU (or on another device than the weights) — except under the Triton interpreter
(``TRITON_INTERPRET=1``), where CPU tensors are the point. Outputs are freshly allocated float32
unless an ``out`` buffer is given. The other kernel families' host sides live beside this module
and are re-exported here: :mod:`.ops_common` (checks, :data:`A16`), :mod:`.ops_path` (each
call's path from the dispatch table), :mod:`.ops_imma` (the int8 tensor-core kernel),
:mod:`.ops_dense` (the many-row dequantized path), :mod:`.ops_intq` (int4 / int8),
:mod:`.ops_attention` (decode attention). The activation rotations' host side is
:mod:`.ops_rotate` (not re-exported: callers import it).
"""

from __future__ import annotations

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
from leechq.kernels.triton import ops_common as _c
from leechq.kernels.triton._bits import PDL_AVAILABLE
from leechq.kernels.triton.activation import prepare_kernel
from leechq.kernels.triton.ops_attention import (  # noqa: F401  (re-exported)
    DECODE_ATTN_BLOCK_N,
    DECODE_ATTN_MAX_HEAD_DIM,
    DECODE_ATTN_MAX_SPLITS,
    decode_attention,
    decode_attention_splits,
)
from leechq.kernels.triton.ops_common import (  # noqa: F401  (re-exported)
    MAX_ROWS,
    _check_lattice,
    _check_out,
    _check_prepared,
    _check_x,
    _checked_once,
    _sm_count,
    _use_asm,
    check_tensor,
    interpreting,
)
from leechq.kernels.triton.ops_dense import (  # noqa: F401  (re-exported)
    DEQUANT_DEFAULT,
    DequantConfig,
    _check_planes14_dense,
    aligned_width,
    dense_copy,
    dense_input_columns,
    dense_input_order,
    dequant_config,
    dequant_natural_index,
    matmul_dense_ordered,
    mm_f32,
    planes14_dense_enabled,
    planes14_dequant_natural_index,
    planes14_dequantize_f16,
    planes14_matmul_dense,
    tetra48_dequantize_f16,
    tetra48_matmul_dense,
)
from leechq.kernels.triton.ops_gemm import (  # noqa: F401  (re-exported)
    matmul_gemm,
    matmul_gemm_ordered,
)
from leechq.kernels.triton.ops_imma import (  # noqa: F401  (re-exported)
    IMMA_MAXNREG,
    IMMA_ROWS,
    _check_acts,
    _check_imma_rows,
    _matvec_imma,
    _record_shapes,
    imma_activation,
    imma_chunks,
    imma_default,
    imma_records,
    imma_slices,
    planes14_matvec_imma_prepared,
    tetra48_matvec_imma_prepared,
)
from leechq.kernels.triton.ops_intq import (  # noqa: F401  (re-exported)
    code_transpose,
    int4_embedding,
    int4_matvec,
    int8_embedding,
    int8_matvec,
)
from leechq.kernels.triton.ops_path import (  # noqa: F401  (re-exported)
    _configured_m1,
    matvec_path,
    matvec_request,
)
from leechq.kernels.triton.planes14 import planes14_matvec_kernel
from leechq.kernels.triton.tetra48 import tetra48_matvec_kernel
from leechq.kernels.triton.tetra48_decode import T64_PBITS
from leechq.kernels.triton.tetra48_m1 import PLANES14, TETRA, TETRA_64, m1_kernel
from leechq.kernels.tuning import (  # noqa: F401  (IMMA_MIN_ROWS re-exported)
    IMMA_MIN_ROWS,
    M1_MAX_ROWS,
    M1_MAX_ROWS_T64,
    M1_MAXNREG,
    M1_RESIDENT,
    PDL_MAX_ROWS,
    T64_NUM_WARPS,
)

if TYPE_CHECKING:
    from leechq.formats.layouts.planes14 import Planes14Weight
    from leechq.formats.layouts.tetra48 import Tetra48Weight

def t64_serving(device: torch.device | str) -> bool:
    """Whether a Tetra group built for ``device`` holds its words in the ``tetra64`` layout: a
    CUDA device, not under the interpreter (whose serving tests keep the standard layout unless
    they ask), 16-bit activations (:data:`.ops_common.A16`; the batch-1 kernel decodes the layout with them
    only)."""
    return torch.device(device).type == "cuda" and not interpreting() and _c.A16


def kernel_activation(x: torch.Tensor, n_blocks: int) -> torch.Tensor:
    """The activation the integer kernels multiply (for an f64 reference): ``x``'s 16-bit rounding
    per block with :data:`.ops_common.A16` (``reference.round_activation``), else ``x`` itself."""
    return ref.round_activation(x, n_blocks) if _c.A16 else x


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
    (Tetra), otherwise the tiled kernel (best of the H200 sweep for M > 1;
    docs/kernels.md)."""
    if m_rows == 1:
        return M1_DEFAULT
    return MatvecConfig(rows=8, bp=32, num_warps=4, kernel="tile")


def m1_config(d_out: int, n_blocks: int, device: torch.device, tail_cols: int = 0,
              m_rows: int = 1, t64: bool = False) -> MatvecConfig:
    """The ``m1`` geometry for a ``d_out × 24·n_blocks`` matrix with ``tail_cols`` tail columns
    and ``m_rows`` activation rows (H200 sweeps, docs/kernels.md): one program per
    (row chunk, K-slice), two rows per warp and loop trip, the register cap of
    :func:`m1_maxnreg`, and the larger of two chunk sizes: 64 rows when that still leaves at least
    three programs per SM (else 32), and the chunk that makes the launch about one wave of the
    programs an SM holds (:func:`m1_wave_rows`; capped at :data:`M1_MAX_ROWS`), so that large
    matrices run fewer, longer programs (each stages the table once). Several activation rows
    share each decode: two rows in one launch, three or more four at a time (``mb``, one loop
    row per trip for four: their limbs take the registers). ``t64``: the geometry of the
    ``tetra64`` decode at one row — the chunk of one wave of five programs per SM, no register
    cap (H200 sweep: the best of nine geometries on each Qwen3-8B
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


def _tile_config(cfg: MatvecConfig, m_rows: int) -> MatvecConfig:
    """The configuration the tiled kernels run with (an ``m1`` configuration falls back to the
    tiled defaults of the H200 sweep)."""
    if cfg.kernel == "tile":
        return cfg
    if m_rows == 1:
        return MatvecConfig(rows=16, bp=32, num_warps=4, smem_rows=True, kernel="tile")
    return MatvecConfig(rows=8, bp=32, num_warps=4, kernel="tile")


_TICKETS: dict[str, torch.Tensor] = {}
TICKET_SLOTS = 1 << 16
"""Row chunks per launch the ``m1`` kernels can track (a zeroed int32 counter each, reset by the
program that consumes it, so one buffer per device serves every launch on one stream)."""


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
    warns, and the verdict stays False (:func:`matvec_path` then marks ``m1`` unusable for the
    request and the dispatch table chooses again). Under a capture with no check yet, False for
    that call."""
    if interpreting() or device.type != "cuda":
        return True
    check = check or _check_m1
    return _checked_once(_M1_CHECKED, (str(device), cfg, check.__name__, _c.A16), check, device,
                         cfg)


def _first_use_check(what: str, device: torch.device, cfg: MatvecConfig, cases: Iterator,
                     fallback: str = "the dispatch table chooses again without it") -> bool:
    """Run ``cases`` (a generator of ``(y, x, dense)``: kernel output, activation, f64 reference
    matrix) and require every output within ``1e-5 · Σ|w·x|`` and the ticket counters reset; any
    failure or exception warns (a ``UserWarning`` naming the kernel) and returns False (the
    caller then does ``fallback``)."""
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
    warnings.warn(f"the {what} ({cfg}) failed its first-use check on {device} ({reason}); "
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


# ------------------------------------------------------------------------------------ lattice


def tetra48_matvec_prepared(xp: torch.Tensor, w: Tetra48Weight, m_rows: int,
                            config: MatvecConfig | None = None,
                            out: torch.Tensor | None = None,
                            acts: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """``y = W x`` from an already prepared activation (trio order): float32 [M, d_out]. With no
    ``config`` the dispatch table picks the path (:func:`matvec_path`: the int8 tensor-core
    kernel, :func:`tetra48_matvec_imma_prepared` — ``acts``: its activation records when they
    exist already, e.g. written by the rotation; used only there —, the ``m1`` launch groups of
    :func:`m1_plan`, or the tiled kernel). The ``tetra64`` layout (a ``Tetra64Weight``,
    ``formats.layouts.tetra64``) is read by ``m1`` (``CODE = TETRA_64``) and the int8 kernel
    only. An explicit ``config`` runs that kernel: an ``m1`` configuration that cannot take the
    shape (or failed its first-use check) runs the tiled kernel's defaults; the tiled kernel
    raises :class:`UnsupportedShape` on ``tetra64``."""
    _check_lattice(w, w.words, "words", t64_ok=True)
    if config is not None:
        if w.layout == "tetra64" and not _c.A16:
            raise UnsupportedShape("the batch-1 kernel decodes the tetra64 layout with 16-bit "
                                   "activations only (ops_common.A16 is False); pass no "
                                   "configuration")
        plan = _configured_m1(w, m_rows, xp.device, config)
        path = "m1" if plan is not None else "tiled"
    else:
        path, plan = matvec_path(w, m_rows, xp.device)
    if path == "imma":
        return tetra48_matvec_imma_prepared(xp, w, m_rows, out=out, acts=acts)
    _check_prepared(xp, m_rows, w.n_blocks, w.words.device)
    y = out if out is not None else torch.empty(m_rows, w.d_out, dtype=torch.float32,
                                                device=xp.device)
    if plan is not None:
        first = 0
        for rows, c in plan:
            _launch_m1("tetra48", xp[first:], w, y[first:], c, rows)
            first += rows
        return y
    if w.layout == "tetra64":
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
    elif w.layout == "tetra64":
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
            MB=mb, A16=_c.A16, **consts, **pdl,
            **({"maxnreg": cfg.maxnreg} if cfg.maxnreg else {}),
        )


def tetra48_matvec(x: torch.Tensor, w: Tetra48Weight,
                   config: MatvecConfig | None = None) -> torch.Tensor:
    """``y = W x`` for x [M, d_in] in the rotated basis (twin of ``reference.tetra48_matvec``)."""
    m_rows = _check_x(x, w.d_in, w.words.device)
    xp = prepare_activation(x, w.n_blocks, tetra_kernel_tables(x.device).order)
    return tetra48_matvec_prepared(xp, w, m_rows, config)


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
    ``config``, the dispatch table's path (:func:`matvec_path`): the ``m1`` kernel with the
    Planes14 decode (:mod:`.planes14_m1`) in the row groups and per-shape geometry of
    :func:`m1_plan` (as Tetra: one row, two, or four per launch), the int8 tensor-core kernel
    (:func:`planes14_matvec_planned`), or the tiled kernel; with an ``m1`` ``config``, that
    kernel in it (several rows need its ``mb`` 2 or 4) where it applies, else the tiled
    kernel. H200, Qwen3-8B projections, ``m1`` against tiled
    (cuBLAS fp16 ≈ 4.7 ms): M = 1 3.37 vs 5.41 ms, M = 2 4.26 vs 5.44, M = 4 6.80 vs 9.92, M = 8
    13.10 vs 14.57."""
    m_rows = _check_x(x, w.d_in, w.records.device)
    plan = planes14_m1_groups(w, m_rows, x.device, config)
    xp = prepare_activation(x, w.n_blocks, planes14_order(x.device, plan is not None))
    return planes14_matvec_planned(xp, w, m_rows, plan, config)


def planes14_m1_groups(w: Planes14Weight, m_rows: int, device: torch.device,
                       config: MatvecConfig | None = None) -> list[tuple[int, MatvecConfig]] | None:
    """The ``(rows, configuration)`` launch groups of the ``m1`` Planes14 kernel for ``m_rows``
    activation rows, or None when the tiled kernel serves them: with no ``config`` the dispatch
    table's (:func:`matvec_path`; the int8 kernel's calls get them too, it reads the ``m1``
    order), else ``config``'s one group where it applies (:func:`_configured_m1`). The prepared
    activation's order follows: :func:`planes14_order`."""
    if config is not None:
        return _configured_m1(w, m_rows, device, config)
    return matvec_path(w, m_rows, device)[1]


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
    :func:`planes14_m1_groups`): its ``m1`` launch groups — or, with no ``config`` where the
    dispatch table picks it (:func:`imma_default`), the int8 tensor-core kernel from the same order
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


