"""Kernel dispatch: one ordered table, best first, of everything that can run an op.

Each entry of :data:`KERNELS` is a class that states the op and the layouts it serves and answers
``can_implement(request) -> (ok, reason)`` for a :class:`Request` (op, layout, activation rows,
device, dtype, shape). :func:`choose` walks the table and returns the first entry that can, or
raises :class:`~leechq.errors.KernelUnavailable` listing every entry's reason
(docs/kernels.md, "Dispatch"). The table holds the per-call paths of the lattice matvec
(``dense-f16``, ``imma``, ``m1``, ``tiled``), the Triton kernels of the other ops, then the
pure-torch references (any device, so CPU tensors land there). A new kernel is a new class in the
list.

Overrides: ``prefer=`` (restrict to a backend, an entry's name, or an entry's family) and the
environment variable ``LEECHQ_DISABLE_KERNELS`` (comma-separated entry names or families). The
choice for a request is memoized (requests are hashable); the memo is dropped when
``LEECHQ_DISABLE_KERNELS`` or ``TRITON_INTERPRET`` change and by :func:`clear_memo`. A kernel
whose first-use check fails on a device is marked unusable for the request with :func:`refuse`
and the caller chooses again. Nothing here imports triton: availability is probed with
``importlib.util.find_spec`` and the kernels' modules are imported only when used.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from leechq.errors import InvalidInput, KernelUnavailable
from leechq.kernels.tuning import (
    DENSE_MIN_ROWS,
    GEMM_MAX_ROWS,
    GEMM_MIN_ROWS,
    IMMA_MIN_ROWS,
    IMMA_ROWS,
)

OPS = ("matvec", "rotate", "embedding")
LATTICE = ("tetra48", "tetra64", "planes14")
"""The lattice layouts (``tetra64``: the served form of ``tetra48`` on a GPU)."""
LAYOUTS = (*LATTICE, "int4", "int8", "rotation")
MAX_TRITON_ROWS = 8
"""Activation rows of one launch of the Triton matvec kernels (callers chunk larger inputs)."""
M1_MIN_CHUNK = 8
"""The smallest row chunk ``ops.m1_config`` ever picks (the ``tetra64`` loop trip; 32 otherwise):
below ``TICKET_SLOTS · M1_MIN_CHUNK`` output rows every ``m1`` geometry fits its tickets."""

_CPU = torch.device("cpu")


@dataclass(frozen=True)
class Request:
    """What to run, hashable (the memo's key).

    Attributes:
        layout: one of :data:`LAYOUTS` (``tetra64``: a ``Tetra64Weight``).
        rows: activation rows of the call (1 for a layer-level choice).
        device: where the tensors are (a ``torch.device``).
        dtype: the activation dtype.
        n_blocks: coded 24-column blocks per row (lattice layouts).
        dense_copy: the caller (a serving group) holds a float16 dequantized copy it can multiply.
        op: one of :data:`OPS`.
        d_out, d_in: the matrix shape (0: not given; ``rotate``: ``d_in`` is the width;
            ``embedding``: rows and width of the table).
        tail_cols: the lattice record's tail columns.
        group: the int4/int8 quantization group (0: per row).
        odd: ``rotate``: the odd factor k of the rotation's width.
        a16: the integer kernels round activations to 16 bits (``ops_common.A16``).
    """

    layout: str
    rows: int = 1
    device: torch.device = _CPU
    dtype: torch.dtype = torch.float32
    n_blocks: int = 1
    dense_copy: bool = False
    op: str = "matvec"
    d_out: int = 0
    d_in: int = 0
    tail_cols: int = 0
    group: int = 0
    odd: int = 1
    a16: bool = True


def _triton_available() -> tuple[bool, str]:
    if importlib.util.find_spec("triton") is None:
        return False, "triton is not installed"
    return True, ""


def _interpreting() -> bool:
    """Whether the Triton interpreter runs the kernels (CPU tensors are then allowed)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def _interpreter_costs() -> bool:
    """Whether the interpreter's cost rules apply: several rows on the many-row ``m1`` and the
    int8 kernel cost seconds a launch there, so those entries leave them to the tiled kernel
    (the only readers of a layout excepted). Tests that exercise the GPU's choice on the CPU
    patch this to False."""
    return _interpreting()


class Kernel:
    """An entry of :data:`KERNELS`: ``name``, ``op``, ``layouts``, ``backend`` ("triton" or
    "reference"), ``impl`` ("module:function", ``{layout}`` filled in), ``can_implement``."""

    name = "kernel"
    op = ""
    layouts: frozenset[str] = frozenset()
    backend = ""
    impl = ""

    @classmethod
    def family(cls, layout: str) -> str:
        """``backend-layout-op`` (e.g. ``triton-tetra48-matvec``): what a layer built on this
        entry reports, and a name ``prefer=`` and ``LEECHQ_DISABLE_KERNELS`` accept."""
        if cls.op == "rotate":
            return f"{cls.backend}-rotate"
        return f"{cls.backend}-{layout}-{cls.op}"

    @classmethod
    def can_implement(cls, req: Request) -> tuple[bool, str]:
        """``(True, "")`` or ``(False, reason)``; the reason starts with the entry's name."""
        if req.op != cls.op:
            return False, f"{cls.name}: op {req.op!r} is not {cls.op!r}"
        if req.layout not in cls.layouts:
            return False, f"{cls.name}: layout {req.layout!r} not in {sorted(cls.layouts)}"
        return cls._check(req)

    @classmethod
    def _check(cls, req: Request) -> tuple[bool, str]:
        return True, ""

    @classmethod
    def function(cls, layout: str) -> Callable[..., Any]:
        """The callable for ``layout`` (imported on first use)."""
        module, attr = cls.impl.format(layout=layout).split(":")
        return getattr(importlib.import_module(module), attr)


class _Triton(Kernel):
    backend = "triton"

    @classmethod
    def _check(cls, req: Request) -> tuple[bool, str]:
        ok, why = _triton_available()
        if not ok:
            return False, f"{cls.name}: {why}"
        if req.device.type != "cuda" and not _interpreting():
            return False, f"{cls.name}: tensors on {req.device} (needs CUDA, or TRITON_INTERPRET=1)"
        if req.device.type == "cuda" and not _interpreting() and not torch.cuda.is_available():
            return False, f"{cls.name}: CUDA is not available"
        return cls._shape_ok(req)

    @classmethod
    def _shape_ok(cls, req: Request) -> tuple[bool, str]:
        return True, ""


# ------------------------------------------------------------------- the lattice matvec paths


class _Lattice(_Triton):
    """A path of the lattice matvec; the entry points ``ops.tetra48_matvec`` /
    ``ops.planes14_matvec`` (and their ``_prepared`` forms) choose it per call."""

    op = "matvec"
    layouts = frozenset(LATTICE)
    impl = "leechq.kernels.triton.ops:{layout}_matvec"

    @classmethod
    def function(cls, layout: str) -> Callable[..., Any]:
        return super().function("tetra48" if layout == "tetra64" else layout)

    @classmethod
    def _shape_ok(cls, req: Request) -> tuple[bool, str]:
        if req.rows < 1:
            return False, f"{cls.name}: {req.rows} activation rows"
        return cls._path_ok(req)

    @classmethod
    def _path_ok(cls, req: Request) -> tuple[bool, str]:
        return True, ""


class GemmF16(_Lattice):
    """The float16 tensor-core GEMM (``ops_gemm.matmul_gemm_ordered``: each weight block decoded
    once per launch, no dequantized copy written): a serving group's ``tuning.GEMM_MIN_ROWS`` ..
    ``GEMM_MAX_ROWS`` rows of a lattice matrix (either Tetra layout or ``planes14``), from the
    activation its rotation writes in the copy's column order; not under the interpreter's cost
    rules."""

    name = "gemm-f16"

    @classmethod
    def _path_ok(cls, req: Request) -> tuple[bool, str]:
        if not req.dense_copy:
            return False, f"{cls.name}: reads the copy's activation order (a serving group does)"
        if not GEMM_MIN_ROWS <= req.rows <= GEMM_MAX_ROWS:
            return False, f"{cls.name}: {req.rows} rows outside {GEMM_MIN_ROWS}..{GEMM_MAX_ROWS}"
        if _interpreter_costs():
            return False, f"{cls.name}: not under the interpreter (seconds a launch)"
        return True, ""


class DenseCopy(_Lattice):
    """A float16 dequantized copy and cuBLAS (``ops.matmul_dense_ordered`` and the natural-order
    dense products): a serving group's rows from ``tuning.DENSE_MIN_ROWS``; Planes14 only where
    its dequantization kernel passed its first-use check (``ops.planes14_dense_enabled``)."""

    name = "dense-f16"

    @classmethod
    def _path_ok(cls, req: Request) -> tuple[bool, str]:
        if not req.dense_copy:
            return False, f"{cls.name}: the caller holds no dequantized copy (a serving group does)"
        if req.rows < DENSE_MIN_ROWS:
            return False, f"{cls.name}: {req.rows} rows < {DENSE_MIN_ROWS}"
        if req.layout == "planes14":
            from leechq.kernels.triton import ops

            if not ops.planes14_dense_enabled(req.device):
                return False, f"{cls.name}: the Planes14 dequantization kernel failed its check"
        return True, ""


class Int8(_Lattice):
    """The int8 tensor-core kernel (``ops_imma``): ``tuning.IMMA_MIN_ROWS`` .. ``IMMA_ROWS`` rows
    of a matrix with a coded block, not under the interpreter's cost rules. Planes14 reads it
    from the ``m1`` activation order, so only where ``m1`` is usable for the request. A
    ``tetra64`` matrix under 24-bit activations has no other reader: 1..``IMMA_ROWS`` rows,
    interpreted too."""

    name = "imma"

    @classmethod
    def _path_ok(cls, req: Request) -> tuple[bool, str]:
        if req.n_blocks < 1:
            return False, f"{cls.name}: no coded block (tail only)"
        if req.rows > IMMA_ROWS:
            return False, f"{cls.name}: {req.rows} rows > {IMMA_ROWS}"
        if req.layout == "tetra64" and not req.a16:  # the only reader
            return True, ""
        if _interpreter_costs():
            return False, f"{cls.name}: not under the interpreter (seconds a launch)"
        if req.rows < IMMA_MIN_ROWS:
            return False, f"{cls.name}: {req.rows} rows < {IMMA_MIN_ROWS}"
        if req.layout == "planes14":
            ok, why = usable(M1, req)
            if not ok:
                return False, (f"{cls.name}: reads Planes14 from the m1 activation order, and "
                               f"m1 cannot run here ({why})")
        return True, ""


class M1(_Lattice):
    """The ``m1`` kernel in the row groups and geometry of ``ops.m1_plan``: needs a coded block
    and a row count whose chunks fit the kernel's tickets (``ops.TICKET_SLOTS``); decodes
    ``tetra64`` with 16-bit activations only; several rows not under the interpreter's cost rules
    (except for ``tetra64``, which the tiled kernel does not read)."""

    name = "m1"

    @classmethod
    def _path_ok(cls, req: Request) -> tuple[bool, str]:
        if req.layout == "tetra64" and not req.a16:
            return False, f"{cls.name}: decodes tetra64 with 16-bit activations only"
        if req.n_blocks < 1:
            return False, f"{cls.name}: no coded block (tail only)"
        if req.rows > 1 and req.layout != "tetra64" and _interpreter_costs():
            return False, f"{cls.name}: {req.rows} rows under the interpreter (seconds a launch)"
        from leechq.kernels.triton import ops

        if req.d_out > ops.TICKET_SLOTS * M1_MIN_CHUNK:
            for _rows, cfg in ops.m1_plan(req.d_out, req.n_blocks, req.device, req.tail_cols,
                                         req.rows, req.layout == "tetra64"):
                chunks = -(-req.d_out // cfg.rows)
                if chunks > ops.TICKET_SLOTS:
                    return False, (f"{cls.name}: {req.d_out} rows make {chunks} chunks of "
                                   f"{cfg.rows} (the kernel tracks {ops.TICKET_SLOTS})")
        return True, ""


class Tiled(_Lattice):
    """The tiled kernel, up to :data:`MAX_TRITON_ROWS` rows a launch (the caller chunks): takes
    any ``tetra48`` or ``planes14`` call left."""

    name = "tiled"
    layouts = frozenset({"tetra48", "planes14"})


# ------------------------------------------------------------------------------ the other ops


class TritonInt4Matvec(_Triton):
    name = "triton-int4-matvec"
    op = "matvec"
    layouts = frozenset({"int4"})
    impl = "leechq.kernels.triton.ops:{layout}_matvec"

    @classmethod
    def _shape_ok(cls, req: Request) -> tuple[bool, str]:
        if not 1 <= req.rows <= MAX_TRITON_ROWS:
            return False, f"{cls.name}: {req.rows} activation rows (takes 1..{MAX_TRITON_ROWS})"
        if req.d_in % 8 or (req.group and req.group % 8):
            return False, f"{cls.name}: d_in {req.d_in} / group {req.group} not a multiple of 8"
        return True, ""


class TritonInt8Matvec(TritonInt4Matvec):
    name = "triton-int8-matvec"
    layouts = frozenset({"int8"})


class TritonRotate(_Triton):
    name = "triton-rotate"
    op = "rotate"
    layouts = frozenset({"rotation"})
    impl = "leechq.kernels.triton.ops_rotate:rotate"

    @classmethod
    def _shape_ok(cls, req: Request) -> tuple[bool, str]:
        if req.odd > 64:
            return False, f"{cls.name}: odd factor k={req.odd} > 64"
        pow2 = req.d_in // max(req.odd, 1)
        if pow2 > 1 << 14:
            return False, f"{cls.name}: Hadamard size {pow2} > 16384"
        return True, ""


class TritonInt4Embedding(_Triton):
    name = "triton-int4-embedding"
    op = "embedding"
    layouts = frozenset({"int4"})
    impl = "leechq.kernels.triton.ops:{layout}_embedding"


class TritonInt8Embedding(TritonInt4Embedding):
    name = "triton-int8-embedding"
    layouts = frozenset({"int8"})


class _Reference(Kernel):
    backend = "reference"


def _ref(op: str, layout: str, *also: str) -> type[Kernel]:
    """The reference entry of ``op`` on ``layout`` (and the layouts ``also`` it reads too)."""
    attr = "rotate" if op == "rotate" else f"{layout}_{op}"
    name = "reference-rotate" if op == "rotate" else f"reference-{layout}-{op}"
    return type(f"Reference_{attr}", (_Reference,),
                {"name": name, "op": op, "layouts": frozenset({layout, *also}),
                 "impl": f"leechq.kernels.reference:{attr}"})


KERNELS: list[type[Kernel]] = [
    GemmF16,
    DenseCopy,
    Int8,
    M1,
    Tiled,
    TritonInt4Matvec,
    TritonInt8Matvec,
    TritonRotate,
    TritonInt4Embedding,
    TritonInt8Embedding,
    _ref("matvec", "tetra48", "tetra64"),
    _ref("matvec", "planes14"),
    _ref("matvec", "int4"),
    _ref("matvec", "int8"),
    _ref("rotate", "rotation"),
    _ref("embedding", "int4"),
    _ref("embedding", "int8"),
]
"""Every kernel entry, best first: the first that can implement a :class:`Request` runs it."""


# ---------------------------------------------------------------------------------- choosing

_MEMO: dict[tuple[Request, str | None], type[Kernel]] = {}
_MEMO_ENV: list[tuple[str, str]] = [("", "")]
_GENERATION = [0]
"""Bumped whenever choices may change (the memo dropped, an entry refused): callers that keep
what they derived from a choice key it on :func:`generation`."""
_REFUSED: dict[Request, dict[str, str]] = {}
"""Per request, the entries :func:`refuse` marked unusable (name → reason)."""


def _env() -> tuple[str, str]:
    return (os.environ.get("LEECHQ_DISABLE_KERNELS", ""), os.environ.get("TRITON_INTERPRET", ""))


def _disabled() -> set[str]:
    return {s.strip() for s in os.environ.get("LEECHQ_DISABLE_KERNELS", "").split(",")
            if s.strip()}


def clear_memo() -> None:
    """Forget every memoized choice and every :func:`refuse` mark (tests that patch a rule call
    it; a change of ``LEECHQ_DISABLE_KERNELS`` or ``TRITON_INTERPRET`` drops the choices by
    itself)."""
    _MEMO.clear()
    _REFUSED.clear()
    _GENERATION[0] += 1


def generation() -> int:
    """A counter that changes whenever a memoized choice may no longer hold (``clear_memo``,
    ``refuse``, a new ``LEECHQ_DISABLE_KERNELS`` or ``TRITON_INTERPRET``): a caller that caches
    what it derived from :func:`choose` (e.g. ``ops.matvec_path``'s launch groups) keys it on
    this."""
    _check_env()
    return _GENERATION[0]


def _check_env() -> None:
    if _MEMO_ENV[0] != _env():
        _MEMO.clear()
        _MEMO_ENV[0] = _env()
        _GENERATION[0] += 1


def refuse(name: str, req: Request, reason: str) -> None:
    """Mark the entry ``name`` unusable for ``req`` (e.g. its kernel failed its first-use check
    on the device) so that :func:`choose` passes it over with ``reason``; the caller warns."""
    _REFUSED.setdefault(req, {})[name] = f"{name}: {reason}"
    for key in [k for k in _MEMO if k[0] == req]:
        del _MEMO[key]
    _GENERATION[0] += 1


def _matches(k: type[Kernel], names: Iterable[str], layout: str) -> bool:
    return any(n in (k.name, k.family(layout), k.backend) for n in names)


def usable(k: type[Kernel], req: Request) -> tuple[bool, str]:
    """``k.can_implement(req)`` unless ``LEECHQ_DISABLE_KERNELS`` disables ``k`` or
    :func:`refuse` marked it for ``req`` (then False with that reason)."""
    if _matches(k, _disabled(), req.layout):
        return False, f"{k.name}: disabled by LEECHQ_DISABLE_KERNELS"
    if _REFUSED and k.name in _REFUSED.get(req, {}):
        return False, _REFUSED[req][k.name]
    return k.can_implement(req)


def choose(req: Request, prefer: str | None = None,
           skip: frozenset[str] = frozenset()) -> type[Kernel]:
    """The first entry of :data:`KERNELS` that can implement ``req``.

    Args:
        req: the request.
        prefer: None, or restrict the table to the entries it names: a backend ("triton",
            "reference"), an entry's name (e.g. "m1") or family (e.g. "triton-tetra48-matvec").
            "auto" is None.
        skip: entry names to pass over for this call only, not memoized (a kernel whose
            first-use check cannot run now, under a CUDA-graph capture). While
            ``torch.compile`` traces, the memo is not used (the choice is made in the trace).

    Raises:
        KernelUnavailable: none can; the message lists every entry's reason for this op.
        InvalidInput: ``prefer`` names nothing in the table.
    """
    if prefer == "auto":
        prefer = None
    memo = not skip and not torch.compiler.is_compiling()  # traced: chosen while tracing
    if memo:
        _check_env()
        if (req, prefer) in _MEMO:
            return _MEMO[(req, prefer)]
    table = KERNELS
    if prefer is not None:
        table = [k for k in KERNELS if _matches(k, (prefer,), req.layout)]
        if not table:
            raise InvalidInput(f"prefer={prefer!r} names no backend, kernel or family of the "
                               "dispatch table")
    reasons = []
    for k in table:
        if k.op != req.op or req.layout not in k.layouts:
            continue
        if k.name in skip:
            reasons.append(f"{k.name}: skipped for this call")
            continue
        ok, why = usable(k, req)
        if ok:
            if memo and not (req.device.type == "cuda" and torch.cuda.is_initialized()
                             and torch.cuda.is_current_stream_capturing()):
                _MEMO[(req, prefer)] = k  # not under a capture: a check may not have run yet
            return k
        reasons.append(why)
    if not reasons:
        reasons.append(f"no entry serves op {req.op!r} on layout {req.layout!r}")
    raise KernelUnavailable(f"no kernel for {req.op} of {req.rows} rows of {req.layout} on "
                            f"{req.device}" + (f" (prefer {prefer})" if prefer else "") + ": "
                            + "; ".join(reasons))


# ------------------------------------------------------------------------------ linear-layer plans


@dataclass
class LinearPlan:
    """A record packed for one kernel, callable as ``plan(x) -> y`` (x [..., d_in], bias excluded).

    The attribute set matches :class:`leechq.nn.fused.FusedPlan`, so ``nn`` can use either.

    Attributes:
        kernel_name: the selected matvec kernel.
        run: ``run(x2d) -> y2d`` on [M, d_in] activations (already rotated for lattice records);
            any M (chunks of 8 rows for the Triton matvecs; a 16-bit lattice layer's many rows in
            one GEMM or float16-copy call where the table says so).
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
                preference: str | None = None) -> LinearPlan:
    """Pack ``record`` (a ``QuantizedWeight`` or an ``Int4Weight``) for the best kernel on
    ``device``.

    Tetra-coded matrices → ``tetra48``, ball-coded → ``planes14``, int4 → the int4 matvec. The
    layer is chosen for (one row, ``device``) by :func:`choose` (``preference``: its ``prefer``);
    a Triton lattice layer runs ``ops.tetra48_matvec`` / ``ops.planes14_matvec``, which take
    each call's path from the table; in a float16 / bfloat16 layer, rows the table gives to
    ``gemm-f16`` or ``dense-f16`` take that product instead (:func:`_many_rows`).
    ``kernel_name`` is the entry's family (``triton-tetra48-matvec``, ``reference-int4-matvec``,
    …).

    Raises:
        KernelUnavailable: no kernel can (the message lists why).
    """
    from leechq.formats.quantized_weight import Int4Weight, QuantizedWeight

    device = torch.device(device)
    if isinstance(record, Int4Weight):
        req = Request("int4", 1, device, dtype, d_out=record.d_out, d_in=record.d_in,
                      group=record.group)
        k = choose(req, preference)
        w = Int4Weight(record.d_out, record.d_in, record.qweight.to(device),
                       record.scales.to(device), record.biases.to(device), record.group)
        fn = k.function("int4")
        rows = MAX_TRITON_ROWS if k.backend == "triton" else 1 << 30
        return LinearPlan(k.family("int4"), _chunked(lambda x: fn(x.float(), w), rows, dtype),
                          None, record.d_out, record.d_in, dtype,
                          {"qweight": w.qweight, "scales": w.scales, "biases": w.biases})
    if not isinstance(record, QuantizedWeight):
        raise InvalidInput(f"plan_linear takes a QuantizedWeight or Int4Weight, got {type(record)}")
    layout = {"tetra": "tetra48", "ball": "planes14"}.get(record.codebook)
    if layout is None:
        raise KernelUnavailable(f"no served layout for codebook {record.codebook!r}")
    k = choose(Request(layout, 1, device, dtype, n_blocks=record.d_in // 24, d_out=record.d_out,
                       d_in=record.d_in, tail_cols=record.d_in % 24), preference)
    from leechq.formats.layouts import get as get_layout

    packed = get_layout(layout).pack(record).to(device)
    fn = k.function(layout)
    rows = MAX_TRITON_ROWS if k.backend == "triton" else 1 << 30
    rotate = None
    if record.rotation is not None:
        rk = choose(Request("rotation", 1, device, dtype, op="rotate", d_in=record.d_in,
                            odd=record.rotation.odd), preference)
        rot_fn = rk.function("rotation")
        tables = record.rotation
        if rk.backend == "triton":
            from leechq.kernels.triton.ops_rotate import DeviceRotation

            dev_rot = DeviceRotation.from_tables(tables, device)
            rotate = lambda x: rot_fn(x.contiguous(), dev_rot)  # noqa: E731
        else:
            rotate = lambda x: rot_fn(x.contiguous(), tables)  # noqa: E731
    tensors = {n: getattr(packed, n) for n in ("row_scales", "row_centroids", "tail")}
    tensors["records" if layout == "planes14" else "words"] = (
        packed.records if layout == "planes14" else packed.words)
    box = {"w": packed}
    run = _chunked(lambda x: fn(x.float(), box["w"]), rows, dtype)
    if k.backend == "triton" and dtype in (torch.float16, torch.bfloat16):
        run = _many_rows(run, box, device, dtype)
    return LinearPlan(k.family(layout), run, rotate, record.d_out, record.d_in, dtype, tensors,
                      packed=box)


MANY_ROW_ENTRIES = ("gemm-f16", "dense-f16")
"""The table's entries that take all of a call's rows in one many-row product."""


def many_row_entry(req: Request) -> str | None:
    """The entry of :data:`MANY_ROW_ENTRIES` the table gives ``req``'s rows to (a caller that
    can take either product: ``req.dense_copy`` True), or None where a lattice matvec keeps
    them."""
    name = choose(req).name
    return name if name in MANY_ROW_ENTRIES else None


def many_row_product(entry: str, x: torch.Tensor, w: Any,
                     out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``y = W x`` for the rows ``entry`` (of :data:`MANY_ROW_ENTRIES`) serves, from natural
    column order: ``out_dtype`` [M, d_out] from x [M, d_in] (float32 or 16-bit; rotated basis)
    and a packed lattice record ``w`` — ``gemm-f16``: the float16 tensor-core GEMM
    (``ops.matmul_gemm``); ``dense-f16``: a float16 copy and cuBLAS
    (``ops.tetra48_matmul_dense`` / ``ops.planes14_matmul_dense``)."""
    from leechq.kernels.triton import ops

    if entry == "gemm-f16":
        return ops.matmul_gemm(x, w, out_dtype=out_dtype)
    dense = ops.planes14_matmul_dense if w.layout == "planes14" else ops.tetra48_matmul_dense
    return dense(x.float(), w).to(out_dtype)


def _many_rows(matvec: Callable[[torch.Tensor], torch.Tensor], box: dict[str, Any],
               device: torch.device, dtype: torch.dtype
               ) -> Callable[[torch.Tensor], torch.Tensor]:
    """A 16-bit layer's ``run``: rows the table gives to a many-row entry
    (:func:`many_row_product`) in one call — the precision of the 16-bit model itself —, the
    others through ``matvec`` (the lattice matvec in chunks of :data:`MAX_TRITON_ROWS`)."""

    def run(x: torch.Tensor) -> torch.Tensor:
        m = int(x.shape[0])
        if m >= min(GEMM_MIN_ROWS, DENSE_MIN_ROWS):
            w = box["w"]
            entry = many_row_entry(Request(w.layout, m, device, dtype, n_blocks=w.n_blocks,
                                           dense_copy=True, d_out=w.d_out, d_in=w.d_in,
                                           tail_cols=w.tail_cols))
            if entry is not None:
                return many_row_product(entry, x.contiguous(), w, dtype)
        return matvec(x)

    return run
