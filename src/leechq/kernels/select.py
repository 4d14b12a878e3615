"""Kernel selection: ordered candidates, ``can_implement → (ok, reason)``, and linear-layer plans.

Follows docs/kernels.md: each kernel class states which op and layout it serves
and answers ``can_implement(op, layout, shape, device)`` with a reason when it cannot; the
selector walks :data:`KERNELS` in order and returns the first that can, or raises
:class:`~leechq.errors.KernelUnavailable` listing every candidate's reason. Order: Triton kernels
first (CUDA tensors), the pure-torch references last (any device, so CPU tensors always land there).

Preference: ``preference="reference"`` or ``"triton"`` restricts the candidates; the environment
variable ``LEECHQ_DISABLE_KERNELS`` (comma-separated kernel names) removes candidates, for
debugging. Nothing here imports triton: availability is probed with ``importlib.util.find_spec``
and the kernels' modules are imported only when a kernel is called.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from leechq.errors import InvalidInput, KernelUnavailable
from leechq.kernels.tuning import DENSE_MIN_ROWS, IMMA_MIN_ROWS, IMMA_ROWS

OPS = ("matvec", "rotate", "embedding")
LAYOUTS = ("tetra48", "tetra64", "planes14", "int4", "int8", "rotation")
MAX_TRITON_ROWS = 8


@dataclass(frozen=True)
class Shape:
    """What a kernel is asked to do: ``d_out × d_in`` weights, ``m_rows`` activation rows.

    For ``rotate`` only ``d_in`` (the width) and ``odd`` (k of the rotation) matter; for
    ``embedding`` ``d_in`` is the row width."""

    d_out: int
    d_in: int
    m_rows: int = 1
    group: int = 0
    odd: int = 1


def _triton_available() -> tuple[bool, str]:
    if importlib.util.find_spec("triton") is None:
        return False, "triton is not installed"
    return True, ""


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


class Kernel:
    """Base of the kernel classes: ``name``, ``op``, ``layouts``, ``impl`` ("module:function")."""

    name = "kernel"
    op = ""
    layouts: frozenset[str] = frozenset()
    impl = ""
    backend = ""

    @classmethod
    def can_implement(cls, op: str, layout: str, shape: Shape,
                      device: torch.device) -> tuple[bool, str]:
        if op != cls.op:
            return False, f"{cls.name}: op {op!r} is not {cls.op!r}"
        if layout not in cls.layouts:
            return False, f"{cls.name}: layout {layout!r} not in {sorted(cls.layouts)}"
        return cls._check(shape, device)

    @classmethod
    def _check(cls, shape: Shape, device: torch.device) -> tuple[bool, str]:
        return True, ""

    @classmethod
    def function(cls) -> Callable[..., Any]:
        """The callable (imported on first use)."""
        module, attr = cls.impl.split(":")
        return getattr(importlib.import_module(module), attr)


class _TritonKernel(Kernel):
    backend = "triton"

    @classmethod
    def _check(cls, shape: Shape, device: torch.device) -> tuple[bool, str]:
        ok, why = _triton_available()
        if not ok:
            return False, f"{cls.name}: {why}"
        if device.type != "cuda" and not _interpreting():
            return False, f"{cls.name}: tensors on {device} (needs CUDA, or TRITON_INTERPRET=1)"
        if device.type == "cuda" and not torch.cuda.is_available():
            return False, f"{cls.name}: CUDA is not available"
        return cls._shape_ok(shape)

    @classmethod
    def _shape_ok(cls, shape: Shape) -> tuple[bool, str]:
        return True, ""


class _LatticeMatvec(_TritonKernel):
    op = "matvec"

    @classmethod
    def _shape_ok(cls, shape: Shape) -> tuple[bool, str]:
        if not 1 <= shape.m_rows <= MAX_TRITON_ROWS:
            return False, f"{cls.name}: {shape.m_rows} activation rows (takes 1..{MAX_TRITON_ROWS})"
        if shape.d_in < 24:
            return False, f"{cls.name}: d_in {shape.d_in} < 24"
        return True, ""


class TritonTetra48Matvec(_LatticeMatvec):
    name = "triton-tetra48-matvec"
    layouts = frozenset({"tetra48", "tetra64"})
    impl = "leechq.kernels.triton.ops:tetra48_matvec"


class TritonPlanes14Matvec(_LatticeMatvec):
    name = "triton-planes14-matvec"
    layouts = frozenset({"planes14"})
    impl = "leechq.kernels.triton.ops:planes14_matvec"


class TritonInt4Matvec(_TritonKernel):
    name = "triton-int4-matvec"
    op = "matvec"
    layouts = frozenset({"int4"})
    impl = "leechq.kernels.triton.ops:int4_matvec"

    @classmethod
    def _shape_ok(cls, shape: Shape) -> tuple[bool, str]:
        if not 1 <= shape.m_rows <= MAX_TRITON_ROWS:
            return False, f"{cls.name}: {shape.m_rows} activation rows (takes 1..{MAX_TRITON_ROWS})"
        if shape.d_in % 8 or (shape.group and shape.group % 8):
            return False, f"{cls.name}: d_in {shape.d_in} / group {shape.group} not a multiple of 8"
        return True, ""


class TritonInt8Matvec(TritonInt4Matvec):
    name = "triton-int8-matvec"
    layouts = frozenset({"int8"})
    impl = "leechq.kernels.triton.ops:int8_matvec"


class TritonRotate(_TritonKernel):
    name = "triton-rotate"
    op = "rotate"
    layouts = frozenset({"rotation"})
    impl = "leechq.kernels.triton.ops:rotate"

    @classmethod
    def _shape_ok(cls, shape: Shape) -> tuple[bool, str]:
        if shape.odd > 64:
            return False, f"{cls.name}: odd factor k={shape.odd} > 64"
        pow2 = shape.d_in // max(shape.odd, 1)
        if pow2 > 1 << 14:
            return False, f"{cls.name}: Hadamard size {pow2} > 16384"
        return True, ""


class TritonInt4Embedding(_TritonKernel):
    name = "triton-int4-embedding"
    op = "embedding"
    layouts = frozenset({"int4"})
    impl = "leechq.kernels.triton.ops:int4_embedding"


class TritonInt8Embedding(_TritonKernel):
    name = "triton-int8-embedding"
    op = "embedding"
    layouts = frozenset({"int8"})
    impl = "leechq.kernels.triton.ops:int8_embedding"


class _Reference(Kernel):
    backend = "reference"


def _ref(name: str, op: str, layout: str | tuple[str, ...], attr: str) -> type[Kernel]:
    return type(
        f"Reference_{attr}",
        (_Reference,),
        {"name": name, "op": op,
         "layouts": frozenset({layout} if isinstance(layout, str) else layout),
         "impl": f"leechq.kernels.reference:{attr}"},
    )


KERNELS: list[type[Kernel]] = [
    TritonTetra48Matvec,
    TritonPlanes14Matvec,
    TritonInt4Matvec,
    TritonInt8Matvec,
    TritonRotate,
    TritonInt4Embedding,
    TritonInt8Embedding,
    _ref("reference-tetra48-matvec", "matvec", ("tetra48", "tetra64"), "tetra48_matvec"),
    _ref("reference-planes14-matvec", "matvec", "planes14", "planes14_matvec"),
    _ref("reference-int4-matvec", "matvec", "int4", "int4_matvec"),
    _ref("reference-int8-matvec", "matvec", "int8", "int8_matvec"),
    _ref("reference-rotate", "rotate", "rotation", "rotate"),
    _ref("reference-int4-embedding", "embedding", "int4", "int4_embedding"),
    _ref("reference-int8-embedding", "embedding", "int8", "int8_embedding"),
]
"""All kernel classes, in selection order (Triton before reference)."""


def candidates(preference: str = "auto") -> list[type[Kernel]]:
    """Kernels allowed by ``preference`` ("auto", "triton", "reference") and the environment."""
    if preference not in ("auto", "triton", "reference"):
        raise InvalidInput(f"kernel preference must be auto, triton or reference, got {preference!r}")
    disabled = _disabled()
    out = [k for k in KERNELS if k.name not in disabled]
    if preference != "auto":
        out = [k for k in out if k.backend == preference]
    return out


def choose_kernel(op: str, layout: str, shape: Shape, device: torch.device | str,
                  preference: str = "auto") -> type[Kernel]:
    """The first kernel (in :data:`KERNELS` order) that can implement the request.

    Raises:
        KernelUnavailable: none can; the message lists every candidate's reason.
    """
    device = torch.device(device)
    reasons = []
    for k in candidates(preference):
        ok, why = k.can_implement(op, layout, shape, device)
        if ok:
            return k
        if k.op == op and layout in k.layouts:
            reasons.append(why)
    if not reasons:
        reasons.append(f"no kernel serves op {op!r} on layout {layout!r} (preference {preference})")
    raise KernelUnavailable(f"no kernel for {op} / {layout} / {shape} on {device}: "
                            + "; ".join(reasons))


# ------------------------------------------------------------------------------ per-call paths


@dataclass(frozen=True)
class Request:
    """One lattice matvec call to dispatch: ``rows`` activation rows of a ``layout`` ("tetra48",
    "tetra64" or "planes14") matrix of ``n_blocks`` coded blocks on ``device``; ``dense_copy``: the caller (a
    serving group) can multiply a float16 dequantized copy instead; ``imma_only``: only the int8
    kernel reads the matrix (the ``tetra64`` layout under 24-bit activations, ``ops_common.A16``
    False)."""

    layout: str
    rows: int
    device: torch.device
    dtype: torch.dtype = torch.float32
    n_blocks: int = 1
    dense_copy: bool = False
    imma_only: bool = False


class Path:
    """A per-call path of the lattice matvec: ``name`` and ``can_implement(req) -> (ok, reason)``.
    Every path runs Triton kernels: it needs triton, and CUDA tensors or the interpreter."""

    name = "path"

    @classmethod
    def can_implement(cls, req: Request) -> tuple[bool, str]:
        if req.layout not in ("tetra48", "tetra64", "planes14"):
            return False, f"{cls.name}: layout {req.layout!r} is not tetra48, tetra64 or planes14"
        if req.rows < 1:
            return False, f"{cls.name}: {req.rows} activation rows"
        ok, why = _triton_available()
        if not ok:
            return False, f"{cls.name}: {why}"
        if req.device.type != "cuda" and not _interpreting():
            return False, f"{cls.name}: tensors on {req.device} (needs CUDA, or TRITON_INTERPRET=1)"
        return cls._check(req)

    @classmethod
    def _check(cls, req: Request) -> tuple[bool, str]:
        return True, ""


class DenseCopyPath(Path):
    """A float16 dequantized copy and cuBLAS (``ops.matmul_dense_ordered`` and the natural-order
    dense products): a serving group's rows from ``tuning.DENSE_MIN_ROWS``; Planes14 only where
    its dequantization kernel passed its first-use check (``ops.planes14_dense_enabled``)."""

    name = "dense-f16"

    @classmethod
    def _check(cls, req: Request) -> tuple[bool, str]:
        if not req.dense_copy:
            return False, f"{cls.name}: the caller holds no dequantized copy (a serving group does)"
        if req.rows < DENSE_MIN_ROWS:
            return False, f"{cls.name}: {req.rows} rows < {DENSE_MIN_ROWS}"
        if req.layout == "planes14":
            from leechq.kernels.triton import ops

            if not ops.planes14_dense_enabled(req.device):
                return False, f"{cls.name}: the Planes14 dequantization kernel failed its check"
        return True, ""


class Int8Path(Path):
    """The int8 tensor-core kernel (``ops_imma``): ``tuning.IMMA_MIN_ROWS`` .. ``IMMA_ROWS`` rows
    of a matrix with a coded block, compiled only (not under the interpreter). Planes14 reads it
    from the ``m1`` activation order (the caller checks :class:`M1Path` first)."""

    name = "imma"

    @classmethod
    def _check(cls, req: Request) -> tuple[bool, str]:
        if req.imma_only:  # the only reader: any 1..IMMA_ROWS rows, interpreted too
            if req.n_blocks < 1 or not 1 <= req.rows <= IMMA_ROWS:
                return False, (f"{cls.name}: {req.rows} rows of {req.n_blocks} blocks (takes "
                               f"1..{IMMA_ROWS} rows of a matrix with a coded block)")
            return True, ""
        if _interpreting():
            return False, f"{cls.name}: not under the interpreter"
        if req.n_blocks < 1:
            return False, f"{cls.name}: no coded block (tail only)"
        if not IMMA_MIN_ROWS <= req.rows <= IMMA_ROWS:
            return False, f"{cls.name}: {req.rows} rows outside {IMMA_MIN_ROWS}..{IMMA_ROWS}"
        return True, ""


class M1Path(Path):
    """The ``m1`` kernel in the row groups and geometry of ``ops.m1_plan`` (which may still fall
    to the tiled kernel: a shape it cannot take, a failed first-use check): one row anywhere,
    several only compiled (``ops._many_row_m1_default``: a many-row launch costs ~10 s under the
    interpreter)."""

    name = "m1"

    @classmethod
    def _check(cls, req: Request) -> tuple[bool, str]:
        if req.imma_only:
            return False, f"{cls.name}: decodes tetra64 with 16-bit activations only"
        if req.rows == 1:
            return True, ""
        from leechq.kernels.triton.ops import _many_row_m1_default

        if not _many_row_m1_default():
            return False, f"{cls.name}: {req.rows} rows under the interpreter"
        return True, ""


class TiledPath(Path):
    """The tiled kernel, up to 8 rows a launch (the caller chunks): takes anything left."""

    name = "tiled"

    @classmethod
    def _check(cls, req: Request) -> tuple[bool, str]:
        if req.imma_only:
            return False, f"{cls.name}: does not read the tetra64 layout"
        return True, ""


PATHS: list[type[Path]] = [DenseCopyPath, Int8Path, M1Path, TiledPath]
"""The per-call paths of the lattice matvec, best first: the first that can implement a
:class:`Request` runs it."""


def _disabled() -> set[str]:
    return {s.strip() for s in os.environ.get("LEECHQ_DISABLE_KERNELS", "").split(",") if s}


def path_allowed(name: str, req: Request) -> bool:
    """Whether the path ``name`` (not disabled by ``LEECHQ_DISABLE_KERNELS``) can implement
    ``req`` — for a caller that needs to know about one path before the choice (Planes14's
    activation order follows whether ``m1`` can run)."""
    if name in _disabled():
        return False
    return next(p for p in PATHS if p.name == name).can_implement(req)[0]


def choose_path(req: Request, preference: str = "auto") -> type[Path]:
    """The first path of :data:`PATHS` that can implement ``req`` (``LEECHQ_DISABLE_KERNELS``
    removes paths by name; ``preference`` "auto" or "triton" — every path is Triton's —, while
    "reference" leaves none).

    Raises:
        KernelUnavailable: none can; the message lists every path's reason.
    """
    if preference not in ("auto", "triton", "reference"):
        raise InvalidInput(
            f"kernel preference must be auto, triton or reference, got {preference!r}")
    disabled = _disabled()
    reasons = []
    for p in PATHS:
        if p.name in disabled:
            reasons.append(f"{p.name}: disabled by LEECHQ_DISABLE_KERNELS")
            continue
        if preference == "reference":
            reasons.append(f"{p.name}: a Triton path (preference reference)")
            continue
        ok, why = p.can_implement(req)
        if ok:
            return p
        reasons.append(why)
    raise KernelUnavailable(f"no matvec path for {req.rows} rows of {req.layout} on {req.device}: "
                            + "; ".join(reasons))


# ------------------------------------------------------------------------------ linear-layer plans


@dataclass
class LinearPlan:
    """A record packed for one kernel, callable as ``plan(x) -> y`` (x [..., d_in], bias excluded).

    The attribute set matches :class:`leechq.nn.fused.FusedPlan`, so ``nn`` can use either.

    Attributes:
        kernel_name: the selected matvec kernel.
        run: ``run(x2d) -> y2d`` on [M, d_in] activations (already rotated for lattice records);
            any M (chunks of 8 rows for the Triton kernels).
        rotate: ``rotate(x2d) -> Q x`` for rotated lattice records, else None.
        d_out, d_in: shape; dtype: the activation/output dtype.
        tensors: the packed device tensors (for memory accounting).
        shared: a group's shared rotation slot (set by ``nn``), or None.
        packed: lattice records: ``{"w": packed record}``, the box ``run`` reads the packed record
            from (a serving group re-points it to row views of its concatenated record, so both
            share one copy); None otherwise.
    """

    kernel_name: str
    run: Callable[[torch.Tensor], torch.Tensor]
    rotate: Callable[[torch.Tensor], torch.Tensor] | None
    d_out: int
    d_in: int
    dtype: torch.dtype
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    shared: Any = None
    packed: dict[str, Any] | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.d_in)
        if self.rotate is not None:
            x2 = self.shared.rotate(x2, self.rotate) if self.shared is not None else self.rotate(x2)
        return self.run(x2).reshape(*lead, self.d_out)


def _chunked(fn: Callable[[torch.Tensor], torch.Tensor], rows: int, dtype: torch.dtype
             ) -> Callable[[torch.Tensor], torch.Tensor]:
    def run(x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        if x.shape[0] <= rows:
            return fn(x).to(dtype)
        return torch.cat([fn(x[i : i + rows].contiguous()) for i in range(0, x.shape[0], rows)],
                         dim=0).to(dtype)

    return run


def plan_linear(record: Any, device: torch.device | str, dtype: torch.dtype,
                preference: str = "auto") -> LinearPlan:
    """Pack ``record`` (a ``QuantizedWeight`` or an ``Int4Weight``) for the best kernel on ``device``.

    Tetra-coded matrices → ``tetra48``, ball-coded → ``planes14``, int4 → the int4 matvec.

    Raises:
        KernelUnavailable: no kernel can (the message lists why).
    """
    from leechq.formats.quantized_weight import Int4Weight, QuantizedWeight

    device = torch.device(device)
    if isinstance(record, Int4Weight):
        k = choose_kernel("matvec", "int4", Shape(record.d_out, record.d_in, 1, record.group),
                          device, preference)
        w = Int4Weight(record.d_out, record.d_in, record.qweight.to(device),
                       record.scales.to(device), record.biases.to(device), record.group)
        fn = k.function()
        rows = MAX_TRITON_ROWS if k.backend == "triton" else 1 << 30
        return LinearPlan(k.name, _chunked(lambda x: fn(x.float(), w), rows, dtype), None,
                          record.d_out, record.d_in, dtype,
                          {"qweight": w.qweight, "scales": w.scales, "biases": w.biases})
    if not isinstance(record, QuantizedWeight):
        raise InvalidInput(f"plan_linear takes a QuantizedWeight or Int4Weight, got {type(record)}")
    layout = {"tetra": "tetra48", "ball": "planes14"}.get(record.codebook)
    if layout is None:
        raise KernelUnavailable(f"no served layout for codebook {record.codebook!r}")
    k = choose_kernel("matvec", layout, Shape(record.d_out, record.d_in, 1), device, preference)
    from leechq.formats.layouts import get as get_layout

    packed = get_layout(layout).pack(record).to(device)
    fn = k.function()
    rows = MAX_TRITON_ROWS if k.backend == "triton" else 1 << 30
    rotate = None
    if record.rotation is not None:
        rk = choose_kernel("rotate", "rotation", Shape(0, record.d_in, 1, 0, record.rotation.odd),
                           device, preference)
        rot_fn = rk.function()
        tables = record.rotation
        if rk.backend == "triton":
            from leechq.kernels.triton.ops import DeviceRotation

            dev_rot = DeviceRotation.from_tables(tables, device)
            rotate = lambda x: rot_fn(x.contiguous(), dev_rot)  # noqa: E731
        else:
            rotate = lambda x: rot_fn(x.contiguous(), tables)  # noqa: E731
    tensors = {n: getattr(packed, n) for n in ("row_scales", "row_centroids", "tail")}
    tensors["words" if layout == "tetra48" else "records"] = (
        packed.words if layout == "tetra48" else packed.records)
    box = {"w": packed}
    return LinearPlan(k.name, _chunked(lambda x: fn(x.float(), box["w"]), rows, dtype), rotate,
                      record.d_out, record.d_in, dtype, tensors, packed=box)
