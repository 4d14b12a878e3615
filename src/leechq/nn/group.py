"""Projections that read one input, outputs concatenated: :class:`LeechqGroup`.

The one module for q|k|v, gate|up (and a single projection that should run the same way), in
``nn`` and in the serving model (``leechq.serve`` builds its blocks from it). A group is an ordered
list of *segments* whose outputs are concatenated along the last dimension:

* at most one **fused lattice run**: packed records of one lattice layout (``tetra48``,
  ``tetra64`` or ``planes14``) that share one input rotation, concatenated by rows into one
  record (docs/kernels.md): the activation is rotated once and one matvec launch group covers all
  their rows;
* **member modules** computed one by one (an int4 ``LeechqLinear``, a module on the dense
  reference path, which needs no rotation, or a further group of another layout or rotation).

A group computes exactly what its members compute: the rows of its output are the rows of the
members, in order.

The fused run works on top of the kernels of :mod:`leechq.kernels.triton.ops` (and the
rotations of :mod:`leechq.kernels.triton.ops_rotate`):

1. the input ``x [M, d_in]`` is rotated and laid out in the *prepared* activation layout the
   lattice matvec reads (one rotation launch that writes that layout; unrotated runs use the
   preparation kernel alone), into a buffer that persists per (device, width, M);
2. one matvec per part (8 activation rows per launch) writes its rows into one float32 output
   ``y [M, Σ d_out]``. A group built from records (:meth:`LeechqGroup.from_records`) holds one
   part: the records' words, scales, gain pairs and tails concatenated by rows. A group built from
   finalized ``LeechqLinear`` modules (:meth:`LeechqGroup.from_modules`, e.g. a model from
   ``leechq.load``) concatenates them the same way and then re-points each member's plan to its row
   slice of the concatenated tensors: one launch for the group, one copy in memory, and the
   members keep computing exactly what they did.

On that matvec path the serving model also hands a group the *pre-op* that makes its input
(:meth:`LeechqGroup.forward_add_norm`: the residual add and RMSNorm before q|k|v and gate|up;
:meth:`LeechqGroup.forward_silu_mul`: the SwiGLU before down), and the rotation launch computes it
on the fly (``ops_rotate.norm_rotate`` / ``ops_rotate.silu_mul_rotate``): one launch instead of
two, the input never written out. Only a group that is one rotated fused run does this
(:meth:`fuses_pre_ops`).

The dispatch table (``kernels.select.KERNELS``) picks each call's path by its row count. On a
GPU a Tetra run takes ``m1`` for one or two rows; from ``tuning.GEMM_MIN_ROWS`` to
``GEMM_MAX_ROWS`` rows the float16 tensor-core GEMM (``ops.matmul_gemm_ordered``: the rotation
writes the activation in the copy's column order, norm or SwiGLU fused into it, and each weight
block is decoded once per launch); above that (long prompts) a float16 dequantized copy of each
part on cuBLAS (``ops.matmul_dense_ordered``). Ball-coded runs (``planes14``) take the same
float16 GEMM for 3..64 rows and, above, the float16 copy (``ops.planes14_matmul_dense``, unless
its first-use check failed); one or two rows the ``m1`` kernel's row groups, and the tiled kernel
where ``m1`` does not serve.

The fused run's output is float32 (the compiled pieces that consume it, :mod:`leechq.serve.model`,
narrow it inside their own fused kernel); member outputs of another dtype are widened to float32
before the concatenation. Every step of ``forward`` keeps the same tensors from call to call (the
prepared buffers persist), so a serving step built from groups can be captured in a CUDA graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from typing import Any

import numpy as np
import torch
from torch import nn

from leechq.errors import InvalidInput, KernelUnavailable
from leechq.formats.quantized_weight import QuantizedWeight
from leechq.formats.rotation import RotationTables

KERNEL_ROWS = 8
"""Activation rows per matvec call (the kernels take 1..8; the many-row ``m1`` runs them two or
four per launch) — except where every part runs the int8 tensor-core kernel for all the rows
(``ops.imma_default``: up to ``ops.IMMA_ROWS`` = 16 rows in one call, each decoded block meeting
them all; :meth:`LeechqGroup._call_rows`)."""

CACHED_ROWS = 64
"""Prepared buffers are kept for row counts up to this (decode batches); larger ones are
transient."""

_PREPARED: dict[tuple[str, int, int], torch.Tensor] = {}
_RECORDS: dict[tuple[str, int, int], tuple[torch.Tensor, torch.Tensor]] = {}
"""The int8 kernel's activation-record buffers a rotation writes, per (device, width, rows):
zeroed once; the rows a rotation of that row count does not run stay zero."""


def _prepared_buffer(device: torch.device, n_blocks: int, m_rows: int) -> torch.Tensor:
    """A zero-filled float32 prepared-activation buffer for ``m_rows`` rows of ``n_blocks`` blocks.

    Buffers of small row counts are shared by every group of that width (groups run one after the
    other on one stream, and every call rewrites all data slots; pad slots stay zero).
    """
    from leechq.kernels import reference as ref

    shape = (ref.prepared_rows(m_rows), ref.prepared_width(n_blocks))
    if m_rows > CACHED_ROWS:
        return torch.zeros(shape, dtype=torch.float32, device=device)
    key = (str(device), n_blocks, m_rows)
    buf = _PREPARED.get(key)
    if buf is None:
        buf = torch.zeros(shape, dtype=torch.float32, device=device)
        _PREPARED[key] = buf
    return buf


def _call_sizes(m: int, step: int) -> set[int]:
    """The distinct row counts of the calls that cover ``m`` rows ``step`` at a time."""
    return {min(step, m - i) for i in range(0, m, step)}


def same_rotation(a: RotationTables | None, b: RotationTables | None) -> bool:
    """Whether two rotations are the same matrix (both None, or equal width, signs and Q_odd)."""
    if a is None or b is None:
        return a is None and b is None
    return bool(
        a.n == b.n and np.array_equal(a.signs, b.signs) and np.array_equal(a.small, b.small)
    )


def _matvec_kernel(layout: str) -> str:
    """The family of the Triton matvec entries that read ``layout`` (``kernels.select.KERNELS``;
    e.g. ``triton-tetra48-matvec``)."""
    from leechq.kernels.select import KERNELS

    return next(k.family(layout) for k in KERNELS
                if k.backend == "triton" and k.op == "matvec" and layout in k.layouts)


def layout_for(codebook: str) -> str | None:
    """The layout a group packs records of ``codebook`` into (``formats.layouts.for_codebook``),
    or None for a codebook no lattice layout holds."""
    from leechq.formats import layouts

    lay = layouts.for_codebook(codebook)
    return None if lay is None else lay.name


def fused_kernels_available(d_out: int, d_in: int, odd: int, device: torch.device,
                            layout: str = "tetra48") -> str | None:
    """None when the Triton matvec of ``layout`` (and the rotation, for ``odd`` > 0) serve this
    shape on ``device``; otherwise the reason."""
    from leechq.kernels.select import Request, choose

    try:
        k = choose(Request(layout, KERNEL_ROWS, device, n_blocks=d_in // 24, d_out=d_out,
                           d_in=d_in, tail_cols=d_in % 24))
        if k.backend != "triton":
            return f"the {layout} matvec on {device} is {k.name}, not a fused kernel"
        if odd:
            r = choose(Request("rotation", 1, device, op="rotate", d_in=d_in, odd=odd))
            if r.backend != "triton":
                return f"the rotation on {device} is {r.name}, not a fused kernel"
    except KernelUnavailable as exc:
        return str(exc)
    return None


@dataclass(frozen=True)
class PackedRun:
    """A fused lattice run before it becomes part of a group: ``parts`` (packed records of one
    layout, on one device, all ``d_in`` wide), their shared input ``rotation`` (or None), the
    float ``bias`` of their rows [Σ d_out] (or None) and the number of matrices they hold
    (``members``, for accounting; 0: one per part)."""

    parts: tuple[Any, ...]
    rotation: RotationTables | None
    bias: torch.Tensor | None = None
    members: int = 0


_FUSED = -1
"""The fused run's place in :attr:`LeechqGroup.segments` (members are indices ≥ 0)."""


class LeechqGroup(nn.Module):
    """Projections reading one input, outputs concatenated: ``[..., d_in] → [..., Σ d_out]``.

    Args:
        members: modules ``[..., d_in] → [..., d_out_i]`` computed one by one (the segments after
            ``fused`` unless ``fused_at`` says otherwise).
        fused: the fused lattice run, or None.
        fused_at: where the fused run's rows come among the segments (0: first).

    Build it with :meth:`from_modules` (finalized modules), :meth:`from_records` (canonical
    records) or directly from a :class:`PackedRun`. ``forward``: x [..., d_in] (fp16/bf16/fp32) →
    [..., Σ d_out] (float32 when the fused run or mixed member dtypes are involved, else the
    members' dtype).

    Attributes:
        in_features, out_features: ``d_in`` and ``Σ d_out`` (``d_in``, ``d_out`` alike; None
            where a member does not declare its ``in_features`` / ``out_features``).
        members: the member modules (``nn.ModuleList``).
        segments: the output order: ``-1`` for the fused run, ``i`` for ``members[i]``.
        parts, layout, rotation, offsets: the fused run's packed records, their layout name, the
            shared rotation and the row offsets of the parts within the run (empty / None without
            a fused run).
        execution: the fused run's ``Execution`` (path "fused", the kernel, ``members``: the
            matrices it holds), or None without one; members report their own.
    """

    def __init__(self, members: Sequence[nn.Module] = (), fused: PackedRun | None = None,
                 fused_at: int = 0) -> None:
        super().__init__()
        if fused is None and not members:
            raise InvalidInput("LeechqGroup needs at least one member or a fused run")
        self.members = nn.ModuleList(members)
        self.parts: list[Any] = []
        self.layout: str | None = None
        self.rotation: RotationTables | None = None
        self.rot: Any = None
        self.offsets: list[int] = [0]
        self.execution: Any = None
        self.register_buffer("bias", None, persistent=False)
        widths = {int(m.in_features) for m in members if hasattr(m, "in_features")}
        if fused is not None:
            widths.add(self._init_fused(fused))
        if len(widths) > 1:
            raise InvalidInput(f"members of one group must share d_in, got {sorted(widths)}")
        self.in_features = self.d_in = widths.pop() if widths else None
        order = list(range(len(members)))
        if fused is not None:
            if not 0 <= fused_at <= len(members):
                raise InvalidInput(f"fused_at {fused_at} outside 0..{len(members)}")
            order.insert(fused_at, _FUSED)
        self.segments = order
        outs = [getattr(m, "out_features", None) for m in members]
        self.out_features = self.d_out = (
            None if None in outs else self.offsets[-1] + sum(int(o) for o in outs))

    def _init_fused(self, run: PackedRun) -> int:
        """The fused run's state: parts, layout, device rotation, bias and buffers; returns the
        run's ``d_in``."""
        from leechq.formats import layouts
        from leechq.kernels.tables import tetra_kernel_tables
        from leechq.kernels.triton import ops, ops_rotate
        from leechq.nn.linear import Execution

        parts = list(run.parts)
        if not parts:
            raise InvalidInput("a fused lattice run needs at least one part")
        d_in = parts[0].d_in
        if any(p.d_in != d_in for p in parts):
            raise InvalidInput(f"group parts differ in d_in: {[p.d_in for p in parts]}")
        kinds = {layouts.of(p).name for p in parts}
        if len(kinds) != 1:
            raise InvalidInput(f"group parts mix layouts: {sorted(kinds)}")
        self.layout = kinds.pop()
        self.parts = parts
        self.n_blocks = d_in // 24
        self.offsets = np.cumsum([0] + [p.d_out for p in parts]).tolist()
        device = parts[0].device
        self.execution = Execution("fused", str(device), torch.float32,
                                   kernel=_matvec_kernel(self.layout),
                                   members=run.members or len(parts))
        self._ops = ops
        self._rot_ops = ops_rotate
        # Tetra: the trio order; Planes14: per call (the m1 kernel's order or natural)
        self.order = (tetra_kernel_tables(device).order
                      if layouts.get(self.layout).codebook == "tetra" else None)
        if self.layout == "planes14":  # its first-use check now, eagerly, not inside a trace
            ops.planes14_dense_enabled(torch.device(device))
        self.rotation = run.rotation
        self.rot = (None if run.rotation is None
                    else ops_rotate.DeviceRotation.from_tables(run.rotation, device))
        if run.bias is not None:
            self.bias = run.bias.detach().to(device, torch.float32)
        # Packed tensors are registered so that memory accounting and .to() see them.
        data = layouts.get(self.layout).data
        for i, p in enumerate(parts):
            for name in (data, "row_scales", "row_centroids", "tail"):
                self.register_buffer(f"p{i}_{name}", getattr(p, name), persistent=False)
        return d_in

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_modules(cls, members: Sequence[nn.Module]) -> nn.Module:
        """One module for finalized projections that read the same input (in output order).

        The first run of consecutive ``LeechqLinear`` members on a fused lattice kernel of one
        layout with one rotation becomes the group's fused run: their packed tensors concatenated
        by rows, each member's plan re-pointed to its rows of that record (views; memory holds one
        copy, the members keep computing what they did). A further such run becomes a nested
        group; every other member is kept as it is. A single member that is not on a fused
        lattice kernel is returned itself.

        Raises:
            InvalidInput: no members, or members of different ``d_in``.
        """
        if not members:
            raise InvalidInput("LeechqGroup needs at least one member")
        segments: list[Any] = []
        for run in _runs(list(members), fused_layout, _rotation_of):
            if fused_layout(run[0]) is None:
                segments.extend(run)
            else:
                segments.append(_run_from_modules(run))
        return assemble(segments)

    @classmethod
    def from_records(
        cls,
        records: Sequence[Any],
        device: torch.device | str,
        dtype: torch.dtype,
        prefer: str = "auto",
        biases: Sequence[torch.Tensor | None] | None = None,
    ) -> nn.Module:
        """One module for canonical records that read the same input (q|k|v, gate|up, or one).

        Runs of lattice records of one codebook (Tetra or ball) with one rotation are packed once
        and concatenated by rows into a fused run on a CUDA ``device`` (``prefer`` "auto" or
        "fused", where the fused kernels serve them) or anywhere with ``prefer="fused"`` (e.g. the
        CPU under ``TRITON_INTERPRET=1``); every other record becomes a ``LeechqLinear`` finalized
        with ``prefer``. A single such module is returned itself.

        Raises:
            KernelUnavailable: ``prefer="fused"`` and some record has no fused kernel on ``device``.
            InvalidInput: a lattice run mixes widths or rotations (:func:`pack_records`).
        """
        from leechq.nn.linear import LeechqLinear

        device = torch.device(device)
        biases = list(biases) if biases is not None else [None] * len(records)
        fuse = prefer == "fused" or (prefer == "auto" and device.type == "cuda")
        segments: list[Any] = []
        for run in _runs(list(range(len(records))), lambda i: _lattice(records[i]),
                         lambda i: records[i].rotation):
            recs, bs = [records[i] for i in run], [biases[i] for i in run]
            if fuse and _lattice(recs[0]):
                try:
                    segments.append(pack_records(recs, bs, device))
                    continue
                except KernelUnavailable:
                    if prefer == "fused":
                        raise
            for r, b in zip(recs, bs, strict=True):
                mod = LeechqLinear.from_record(r, b)
                mod.finalize(device, dtype, prefer=prefer)
                segments.append(mod)
        return assemble(segments)

    # ------------------------------------------------------------------ forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., d_in] → [..., Σ d_out] (segments in order)."""
        outs = [self._fused_forward(x) if s == _FUSED else self.members[s](x)
                for s in self.segments]
        if len(outs) == 1:
            return outs[0]
        if len({o.dtype for o in outs}) > 1:  # the fused run's float32 beside a module's fp16
            outs = [o.float() for o in outs]
        return torch.cat(outs, dim=-1)

    def fuses_pre_ops(self, m_rows: int) -> bool:
        """Whether the RMSNorm or SwiGLU that produces this group's input can run inside its
        rotation launch (:meth:`forward_add_norm`, :meth:`forward_silu_mul`) for ``m_rows`` rows: a
        group that is one rotated fused run (on the matvec path the rotation writes the prepared
        layout, on the many-row paths natural order)."""
        return self.segments == [_FUSED] and self.rot is not None

    def _fused_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The fused run: x [..., d_in] → float32 [..., its Σ d_out] (bias added)."""
        rot_ops = self._rot_ops
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.d_in)
        if not x2.is_contiguous():
            x2 = x2.contiguous()
        _, y = self._many_row_products(int(x2.shape[0]), lambda order: (
            None, rot_ops.rotate(x2, self.rot, dense_order=order) if self.rot is not None else x2))
        if y is None:
            y = self._prepared_matvecs(x2, self._fill)[1]
        return y.reshape(*lead, self.offsets[-1])

    def _many_rows(self, m_rows: int) -> str | None:
        """Which many-row entry serves ``m_rows`` rows — the dispatch table's choice
        (``kernels.select.many_row_entry``): ``"gemm-f16"`` (the float16 tensor-core GEMM,
        ``ops.matmul_gemm_ordered`` after a rotation into the copies' column order),
        ``"dense-f16"`` (float16 dequantized copies on cuBLAS, ``ops.matmul_dense_ordered``;
        an unrotated group takes either from natural order, ``select.many_row_product``), or
        None where the lattice matvec serves them from the prepared activation."""
        from leechq.kernels.select import Request, many_row_entry

        device = self.parts[0].device
        return many_row_entry(Request(self.layout, m_rows, device, n_blocks=self.n_blocks,
                                      dense_copy=True))

    def forward_add_norm(self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                         eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``(r, self(rms_norm(r)))`` with ``r = x + delta`` (``delta`` narrowed to x's dtype;
        ``r`` is ``x`` without ``delta``): the residual add, the norm and the rotation in one
        launch (``ops_rotate.norm_rotate``), then the matvecs. x, delta [..., d_in]; weight [d_in].
        Only where :meth:`fuses_pre_ops` holds."""
        self._pre_op_check()
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.d_in).contiguous()
        d2 = None if delta is None else delta.reshape(-1, self.d_in).contiguous()
        r, y = self._many_row_products(int(x2.shape[0]), lambda order: (
            self._rot_ops.norm_rotate(x2, weight, eps, self.rot, delta=d2, dense_order=order)))
        if y is None:
            (r, _), y = self._prepared_matvecs(x2, lambda x2, xp, order, recs: (
                self._rot_ops.norm_rotate(x2, weight, eps, self.rot, delta=d2,
                                          prepared_order=order, out=xp, records=recs)))
        return r.reshape(x.shape), y.reshape(*lead, self.offsets[-1])

    def forward_silu_mul(self, gate_up: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``self(silu_mul(gate_up, dtype))``: SwiGLU and the rotation in one launch
        (``ops_rotate.silu_mul_rotate``), then the matvecs. gate_up [..., 2·d_in] (gate first).
        Only where :meth:`fuses_pre_ops` holds."""
        self._pre_op_check()
        lead = gate_up.shape[:-1]
        g2 = gate_up.reshape(-1, 2 * self.d_in).contiguous()
        _, y = self._many_row_products(int(g2.shape[0]), lambda order: (
            None, self._rot_ops.silu_mul_rotate(g2, dtype, self.rot, dense_order=order)))
        if y is None:
            _, y = self._prepared_matvecs(g2, lambda g2, xp, order, recs: (
                self._rot_ops.silu_mul_rotate(g2, dtype, self.rot, prepared_order=order, out=xp,
                                              records=recs)))
        return y.reshape(*lead, self.offsets[-1])

    def _prepared_matvecs(self, inp: torch.Tensor, fill: Any) -> tuple[Any, torch.Tensor]:
        """The matvec path for ``inp``'s ``m`` rows: ``fill(inp, xp, order, recs)`` writes the
        prepared activation ``xp`` in the order the serving kernels read (one launch; with
        ``recs`` not None it also writes the int8 kernel's activation records there,
        :meth:`_rotation_records`), then :meth:`_matvecs`.
        Returns what ``fill`` returned and the float32 [m, Σ d_out] output."""
        m = int(inp.shape[0])
        xp = _prepared_buffer(inp.device, self.n_blocks, m)
        order, plans = self._launch_plan(m, inp.device)
        step = self._call_rows(m, plans)
        recs = self._rotation_records(m, step, plans, inp.device)
        filled = fill(inp, xp, order, recs)
        return filled, self._matvecs(xp, m, step, plans, recs)

    def _on_int8(self, m: int, plans: dict | None = None) -> bool:
        """Whether every part runs calls of ``m`` rows on the int8 kernel (``ops.imma_default``;
        for Planes14 only with ``m1`` plans, which give the activation order it reads)."""
        return (all(self._ops.imma_default(p, m) for p in self.parts)
                and (plans is None or all(plans.values())))

    def _call_rows(self, m: int, plans: dict | None = None) -> int:
        """Activation rows per matvec call for ``m`` rows: up to ``ops.IMMA_ROWS`` (16) where
        every part takes that many on the int8 kernel (:meth:`_on_int8`), else
        :data:`KERNEL_ROWS`."""
        step = min(m, self._ops.IMMA_ROWS)
        return step if m > KERNEL_ROWS and self._on_int8(step, plans) else KERNEL_ROWS

    def _rotation_records(self, m: int, step: int, plans: dict | None, device: torch.device
                          ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Buffers for the rotation to write the int8 kernel's activation records into (one
        launch fewer per input), or None: for a one-group rotation (power-of-two width) whose
        ``m`` rows go in one matvec call (``step``: :meth:`_call_rows`) on the int8 kernel
        (:meth:`_on_int8`)."""
        if (self.rot is None or self.rot.odd != 1 or m > step or not self._on_int8(m, plans)):
            return None
        key = (str(device), self.n_blocks, m)
        if key not in _RECORDS:
            _RECORDS[key] = self._ops.imma_records(self.n_blocks, device, m)
        return _RECORDS[key]

    def _launch_plan(self, m: int, device: torch.device) -> tuple[torch.Tensor, dict | None]:
        """The prepared activation's order for ``m`` rows and, for Planes14, each (part, call
        rows) → its ``m1`` launch groups (``ops.planes14_m1_groups``), or None per entry when any
        call runs the tiled kernel (then all do, 8 rows at a time, from the natural order)."""
        if self.layout != "planes14":
            return self.order, None
        ops = self._ops
        plans = {(j, r): ops.planes14_m1_groups(p, r, device)
                 for j, p in enumerate(self.parts) for r in _call_sizes(m, self._call_rows(m))}
        if all(v is not None for v in plans.values()):
            return ops.planes14_order(device, True), plans
        return (ops.planes14_order(device, False),
                {(j, r): None for j in range(len(self.parts))
                 for r in _call_sizes(m, KERNEL_ROWS)})

    def _matvecs(self, xp: torch.Tensor, m: int, step: int, plans: dict | None = None,
                 recs: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Every part's matvec from the prepared activation ``xp`` (``m`` rows, ``step`` per
        call: :meth:`_call_rows`) into one float32 [m, Σ d_out], plus the bias (``plans``:
        Planes14's, from :meth:`_launch_plan`; ``recs``: the int8 kernel's activation records of
        ``xp``, written by the rotation, when all ``m`` rows go in one call)."""
        from leechq.kernels.reference import prepared_rows

        y = torch.empty(m, self.offsets[-1], dtype=torch.float32, device=xp.device)
        for j, (part, off) in enumerate(zip(self.parts, self.offsets, strict=False)):
            for i in range(0, m, step):
                r = min(step, m - i)
                chunk, out = xp[i : i + prepared_rows(r)], y[i : i + r, off : off + part.d_out]
                if plans is None:
                    self._ops.tetra48_matvec_prepared(chunk, part, r, out=out, acts=recs)
                else:
                    self._ops.planes14_matvec_planned(chunk, part, r, plans[(j, r)], out=out,
                                                      acts=recs)
        if self.bias is not None:
            y = y + self.bias
        return y

    def _many_row_products(self, m_rows: int, rotated: Any) -> tuple[Any, torch.Tensor | None]:
        """The many-row paths for ``m_rows`` rows (:meth:`_many_rows`): ``(extra, y)`` with ``y``
        float32 [m_rows, Σ d_out] (the bias added), or ``(None, None)`` where the matvec serves
        them. ``rotated(order)`` makes the group's input and returns ``(extra, x)`` (``extra``:
        what the pre-op also gives, e.g. ``norm_rotate``'s residual, as :meth:`_prepared_matvecs`
        passes on its fill's result): with an int32 ``order`` (a rotated group on the float16
        copy: ``ops.dense_input_order``) ``x`` is float16 in the copies' column order, written by
        the rotation launch (``ops.matmul_dense_ordered``: no gather, no conversion, one copy of
        all parts and one GEMM; the float16 GEMM: each part writes its columns of ``y``); with
        None float32 in natural order (the input itself for an unrotated group), for the
        natural-order dense products."""
        kind = self._many_rows(m_rows)
        if kind is None:
            return None, None
        ops = self._ops
        if self.rot is None:
            from leechq.kernels.select import many_row_product

            extra, xr = rotated(None)
            ys = [many_row_product(kind, xr, part) for part in self.parts]
            y = ys[0] if len(ys) == 1 else torch.cat(ys, dim=-1)
        else:
            part0 = self.parts[0]
            extra, x16 = rotated(ops.dense_input_order(part0, part0.row_scales.device))
            if kind == "dense-f16":
                y = ops.matmul_dense_ordered(x16, self.parts)
            else:
                y = torch.empty(m_rows, self.offsets[-1], dtype=torch.float32, device=x16.device)
                for part, off in zip(self.parts, self.offsets, strict=False):
                    ops.matmul_gemm_ordered(x16, part, out=y[:, off : off + part.d_out])
        if self.bias is not None:
            y = y + self.bias
        return extra, y

    def _fill(self, x2: torch.Tensor, xp: torch.Tensor, order: torch.Tensor,
              recs: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """``Q x`` (or ``x`` for an unrotated group) into the prepared buffer in ``order`` (one
        launch: ``activation.rotate_prepared_kernel`` or the preparation kernel; ``recs``: the
        int8 kernel's activation records the rotation also writes, or None)."""
        if self.rot is not None:
            self._rot_ops.rotate(x2, self.rot, prepared_order=order, out=xp, records=recs)
        else:
            self._ops.prepare_activation(x2, self.n_blocks, order, out=xp)

    def _pre_op_check(self) -> None:
        if not self.fuses_pre_ops(1):
            raise InvalidInput("a pre-op fuses only into a group that is one rotated fused run "
                               "(see fuses_pre_ops)")

    def extra_repr(self) -> str:
        if self.layout is None:
            return f"d_in={self.d_in}, d_out={self.d_out}"
        return (
            f"layout={self.layout}, d_in={self.d_in}, d_out={self.d_out}, "
            f"fused rows={self.offsets[1:]}, rotated={self.rotation is not None}"
        )


# ---------------------------------------------------------------------------------- building


def fused_layout(m: nn.Module) -> str | None:
    """The layout name (``formats.layouts``) of the packed record a finalized ``LeechqLinear``
    runs on a fused Triton lattice kernel, else None (int4, the dense path, anything else)."""
    ex = getattr(m, "execution", None)
    kernel = getattr(ex, "kernel", None) or ""
    box = getattr(getattr(m, "_fused", None), "packed", None)
    if (getattr(ex, "path", None) != "fused" or "triton" not in kernel or not box
            or _lattice(getattr(m, "record", None)) is None):
        return None
    return getattr(box["w"], "layout", None)


def _lattice(r: Any) -> str | None:
    """The codebook of a lattice record a fused run can hold ("tetra" or "ball"), else None."""
    if isinstance(r, QuantizedWeight) and layout_for(r.codebook) is not None:
        return r.codebook
    return None


def _rotation_of(module: nn.Module) -> RotationTables | None:
    """The input rotation of a module's record."""
    return getattr(getattr(module, "record", None), "rotation", None)


def _runs(items: list[Any], key: Any, rotation: Any) -> list[list[Any]]:
    """Consecutive items with one non-None ``key(item)`` and one ``rotation(item)``, grouped; an
    item whose key is None is a run of its own."""
    runs: list[list[Any]] = []
    for it in items:
        k = key(it)
        prev = runs[-1] if runs else None
        if (k is not None and prev is not None and key(prev[0]) == k
                and same_rotation(rotation(prev[0]), rotation(it))):
            prev.append(it)
        else:
            runs.append([it])
    return runs


def assemble(segments: list[Any]) -> nn.Module:
    """The module for ``segments`` (modules and :class:`PackedRun` values, in output order): a
    lone module itself; else a group whose fused run is the first :class:`PackedRun` (a later
    one becomes a nested group)."""
    runs = [i for i, s in enumerate(segments) if isinstance(s, PackedRun)]
    if not runs and len(segments) == 1:
        return segments[0]
    first = runs[0] if runs else None
    members = [LeechqGroup(fused=s) if isinstance(s, PackedRun) else s
               for i, s in enumerate(segments) if i != first]
    return LeechqGroup(members, fused=None if first is None else segments[first],
                       fused_at=first or 0)


def pack_records(records: Sequence[QuantizedWeight], biases: Sequence[torch.Tensor | None],
                 device: torch.device | str) -> PackedRun:
    """Lattice records of one codebook with one shared rotation, packed once and concatenated by
    rows on ``device`` in the layout they are served in (:func:`serving_layout`): one part.

    Raises:
        KernelUnavailable: no fused kernel for this shape on ``device`` (the reason is given).
        InvalidInput: the records are not Tetra or ball, mix them, differ in width or in
            rotation.
    """
    from leechq.formats import layouts

    device = torch.device(device)
    _check_members(records)
    name = layout_for(records[0].codebook)
    rot = records[0].rotation
    why = fused_kernels_available(
        sum(r.d_out for r in records), records[0].d_in, 0 if rot is None else rot.odd, device,
        name,
    )
    if why is not None:
        raise KernelUnavailable(why)
    lay = layouts.get(name)
    packed = serving_layout(lay.concat_rows([lay.pack(r) for r in records]).to(device))
    return PackedRun((packed,), rot, _join_bias(biases, [r.d_out for r in records]), len(records))


def _run_from_modules(members: Sequence[nn.Module]) -> PackedRun:
    """The fused run of finalized ``LeechqLinear`` modules on one fused lattice kernel: their
    packed records concatenated by rows (served layout), each member's plan re-pointed to its
    rows of that record (views), so memory holds one copy."""
    from leechq.formats import layouts

    records = [getattr(m, "record", None) for m in members]
    _check_members(records)
    parts = []
    for m in members:
        if fused_layout(m) is None:
            raise InvalidInput(f"{type(m).__name__} does not run a fused lattice kernel")
        parts.append(m._fused.packed["w"])  # the member's packed record (host f64 copies too)
    if len({type(p) for p in parts}) != 1:
        raise InvalidInput(f"group members mix layouts: {sorted({p.layout for p in parts})}")
    cat = layouts.of(parts[0]).concat_rows(parts) if len(parts) > 1 else parts[0]
    served = serving_layout(cat)
    if served is not parts[0]:  # the members run on their rows of the one served record
        _share_rows(members, parts, served)
    biases = [getattr(m, "bias", None) for m in members]
    sizes = [r.d_out for r in records]  # type: ignore[union-attr]
    return PackedRun((served,), _rotation_of(members[0]), _join_bias(biases, sizes),
                     len(members))


def _share_rows(members: Sequence[nn.Module], parts: list[Any], cat: Any) -> None:
    """Re-point each member's plan to its row slice of ``cat`` (the members' records ``parts``
    concatenated, in their layout or in the one they are served in): records of ``cat``'s type
    whose tensors are views, so memory holds one copy."""
    from leechq.formats import layouts

    names = (layouts.of(cat).data, "row_scales", "row_centroids", "tail")
    off = 0
    for m, p in zip(members, parts, strict=True):
        plan = m._fused
        rows = slice(off, off + p.d_out)
        views = {n: getattr(cat, n)[rows] for n in names}
        kept = {f.name: getattr(p, f.name) for f in dataclass_fields(p) if f.name not in views}
        plan.packed["w"] = type(cat)(**kept, **views)
        plan.tensors.update(views)
        off += p.d_out


def serving_layout(part: Any) -> Any:
    """A fused run's packed record in the layout it is served in: a ``tetra48`` record becomes
    ``tetra64`` where ``ops.t64_serving`` says so (a CUDA device), with its shells decoded on the
    device; any other record as it is."""
    from leechq.kernels.triton import ops

    if part.layout != "tetra48" or not ops.t64_serving(part.device):
        return part
    from leechq.formats.layouts.tetra64 import to_tetra64

    return to_tetra64(part)


def _check_members(records: Sequence[Any]) -> None:
    for r in records:
        if _lattice(r) is None:
            raise InvalidInput(
                f"group members must be Tetra or ball records, got {type(r).__name__}"
                + (f" ({r.codebook})" if isinstance(r, QuantizedWeight) else ""))
    if len({r.codebook for r in records}) != 1:
        raise InvalidInput(f"group members mix codebooks: {[r.codebook for r in records]}")
    if len({r.d_in for r in records}) != 1:
        raise InvalidInput(f"group members differ in d_in: {[r.d_in for r in records]}")
    if not all(same_rotation(records[0].rotation, r.rotation) for r in records):
        raise InvalidInput("group members must share one input rotation")


def _join_bias(biases: Sequence[torch.Tensor | None], sizes: Sequence[int]) -> torch.Tensor | None:
    if all(b is None for b in biases):
        return None
    parts = [
        b.detach().float() if b is not None else torch.zeros(n)
        for b, n in zip(biases, sizes, strict=True)
    ]
    device = next(b.device for b in biases if b is not None)
    return torch.cat([p.to(device) for p in parts])


__all__ = ["KERNEL_ROWS", "LeechqGroup", "PackedRun", "assemble", "fused_kernels_available",
           "fused_layout", "layout_for", "pack_records", "same_rotation", "serving_layout"]
