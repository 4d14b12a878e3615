"""Fused lattice projection groups of the serving model: one rotation, one launch per group.

q/k/v and gate/up concatenated by rows (one segmented launch) and the activation rotated once per
shared input (docs/kernels.md), on top of the kernels of :mod:`leechq.kernels.triton.ops`:

1. the group's input ``x [M, d_in]`` is rotated and laid out in the *prepared* activation layout
   the lattice matvec reads (one rotation launch that writes that layout; unrotated groups use the
   preparation kernel alone), into a buffer that persists per (device, width, M);
2. one ``tetra48`` matvec per part (8 activation rows per launch) writes its rows into one float32
   output ``y [M, Σ d_out]``. A group built from records (:meth:`LatticeGroup.from_records`) is a
   single part: the members' words, scales, gain pairs and tails concatenated by rows. A group built
   from already finalized ``LeechqLinear`` modules (:meth:`LatticeGroup.from_modules`, e.g. a model
   from ``leechq.load``) concatenates them the same way and then re-points each member's plan to
   its row slice of the concatenated tensors: one launch for the group, one copy in memory, and the
   members keep computing exactly what they did.

On that matvec path the serving model also hands a group the *pre-op* that makes its input
(:meth:`LatticeGroup.forward_add_norm`: the residual add and RMSNorm before q|k|v and gate|up;
:meth:`LatticeGroup.forward_silu_mul`: the SwiGLU before down), and the rotation launch computes it
on the fly (``ops.norm_rotate`` / ``ops.silu_mul_rotate``): one launch instead of two, the input
never written out.

Up to 16 rows run the lattice matvec in one int8 tensor-core launch (8 per launch group
elsewhere). With ``M ≥ DENSE_MIN_ROWS`` rows (prompts, batches above 16) the group rotates
once in natural order (the norm or SwiGLU fused into that launch) and multiplies a float16
dequantized copy of each part on cuBLAS (``ops.tetra48_matmul_dense``): one decode per call
instead of one per 16 rows.

The output stays float32: the compiled pieces that consume it (:mod:`leechq.serve.model`) narrow it
inside their own fused kernel. A group computes exactly what its members compute (rows partition
``y``).

Ball-coded matrices (``planes14``) group the same way (:class:`LatticeGroup` with Planes14 parts):
one rotation into the prepared layout of the Planes14 kernel, one matvec launch group per call
(the ``m1`` kernel's row groups, 3..16 rows on the int8 tensor-core kernel, or the tiled kernel
where ``m1`` does not serve), the same pre-ops; from ``DENSE_MIN_ROWS`` rows a float16
dequantized copy on cuBLAS (``ops.planes14_matmul_dense``, unless its first-use check
failed), below that the matvec up to 16 rows at a time. ``TetraGroup`` is the
class's earlier name (it served Tetra only).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
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
them all; :meth:`LatticeGroup._call_rows`)."""

CACHED_ROWS = 64
"""Prepared buffers are kept for row counts up to this (decode batches); larger ones are
transient."""

_PREPARED: dict[tuple[str, int, int], torch.Tensor] = {}
_RECORDS: dict[tuple[str, int, int], tuple[torch.Tensor, torch.Tensor]] = {}
"""The int8 kernel's activation-record buffers a rotation writes, per (device, width, rows):
zeroed once; the rows a rotation of that row count does not run stay zero."""


@dataclass(frozen=True)
class GroupExecution:
    """How a :class:`LatticeGroup` computes (the counterpart of ``LeechqLinear.execution``)."""

    path: str = "fused"
    kernel: str = "triton-tetra48-matvec"
    members: int = 1


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


LAYOUTS = {"tetra": "tetra48", "ball": "planes14"}
"""The served layout of each codebook a group can hold."""


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


class LatticeGroup(nn.Module):
    """Lattice matrices that read one input, run as one rotation plus one matvec per part.

    Args:
        parts: ``Tetra48Weight`` or ``Planes14Weight`` records (one layout) on one CUDA device,
            all ``d_in`` wide.
        rotation: the input rotation shared by every part, or None.
        bias: float [Σ d_out] or None.
        members: the matrices the parts hold (default: one per part), for accounting.

    ``forward``: x [..., d_in] (fp16/bf16/fp32) → float32 [..., Σ d_out].
    """

    def __init__(
        self,
        parts: Sequence[Any],
        rotation: RotationTables | None,
        bias: torch.Tensor | None,
        members: int = 0,
    ) -> None:
        super().__init__()
        from leechq.kernels.tables import tetra_kernel_tables
        from leechq.kernels.triton import ops

        if not parts:
            raise InvalidInput("a lattice group needs at least one part")
        self.d_in = parts[0].d_in
        if any(p.d_in != self.d_in for p in parts):
            raise InvalidInput(f"group parts differ in d_in: {[p.d_in for p in parts]}")
        layouts = {_layout_of(p) for p in parts}
        if len(layouts) != 1:
            raise InvalidInput(f"group parts mix layouts: {sorted(layouts)}")
        self.layout = layouts.pop()
        self.parts = list(parts)
        self.execution = GroupExecution(kernel=f"triton-{self.layout}-matvec",
                                        members=members or len(parts))
        self.n_blocks = self.d_in // 24
        self.offsets = np.cumsum([0] + [p.d_out for p in parts]).tolist()
        self.d_out = int(self.offsets[-1])
        device = parts[0].device
        self._ops = ops
        # Tetra: the trio order; Planes14: per call (the m1 kernel's order or natural)
        self.order = tetra_kernel_tables(device).order if self.layout == "tetra48" else None
        if self.layout == "planes14":  # its first-use check now, eagerly, not inside a trace
            ops.planes14_dense_enabled(torch.device(device))
        self.rotation = rotation
        self.rot = None if rotation is None else ops.DeviceRotation.from_tables(rotation, device)
        self.register_buffer(
            "bias", None if bias is None else bias.detach().to(device, torch.float32), False
        )
        # Packed tensors are registered so that memory accounting and .to() see them.
        for i, p in enumerate(parts):
            for name in (_DATA[self.layout], "row_scales", "row_centroids", "tail"):
                self.register_buffer(f"p{i}_{name}", getattr(p, name), persistent=False)

    @classmethod
    def from_records(
        cls,
        records: Sequence[QuantizedWeight],
        biases: Sequence[torch.Tensor | None],
        device: torch.device | str,
    ) -> LatticeGroup:
        """Pack lattice records (one codebook, one shared rotation) and concatenate them by rows:
        one part.

        Raises:
            KernelUnavailable: no fused kernel for this shape on ``device`` (the reason is given).
            InvalidInput: the records are not Tetra or ball, mix them, differ in width or in
                rotation.
        """
        from leechq.formats.layouts import get as get_layout

        device = torch.device(device)
        _check_members(records)
        layout = LAYOUTS[records[0].codebook]
        rot = records[0].rotation
        why = fused_kernels_available(
            sum(r.d_out for r in records), records[0].d_in, 0 if rot is None else rot.odd, device,
            layout,
        )
        if why is not None:
            raise KernelUnavailable(why)
        mod = get_layout(layout)
        packed = _serving_layout(mod.concat_rows([mod.pack(r) for r in records]).to(device))
        return cls([packed], rot, _join_bias(biases, [r.d_out for r in records]), len(records))

    @classmethod
    def from_modules(cls, members: Sequence[nn.Module]) -> LatticeGroup:
        """A group over finalized ``LeechqLinear`` modules running a fused lattice kernel (tetra48
        or planes14, one of them): one part, the members' packed tensors concatenated by rows;
        each member's plan is then re-pointed to its rows of that part (views), so memory holds
        one copy.

        Raises:
            InvalidInput: a member is not a fused lattice ``LeechqLinear``, the codebooks or the
                rotations differ.
        """
        records = [getattr(m, "record", None) for m in members]
        _check_members(records)
        layout = LAYOUTS[records[0].codebook]  # type: ignore[union-attr]
        parts = []
        for m in members:
            plan = getattr(m, "_fused", None)
            name = getattr(plan, "kernel_name", "")
            box = getattr(plan, "packed", None)
            if layout not in name or "triton" not in name or box is None:
                raise InvalidInput(f"{type(m).__name__} does not run the fused {layout} kernel")
            parts.append(box["w"])  # the member's packed record (its host f64 copies included)
        biases = [getattr(m, "bias", None) for m in members]
        cat = _concat_and_share(members, parts) if len(parts) > 1 else parts[0]
        served = _serving_layout(cat)
        if served is not cat:  # the members run on their rows of the served layout, one copy
            _share_rows(members, [m._fused.packed["w"] for m in members], served)
        return cls([served], records[0].rotation,
                   _join_bias(biases, [r.d_out for r in records]), len(records))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ops = self._ops
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.d_in)
        if not x2.is_contiguous():
            x2 = x2.contiguous()
        _, y = self._many_row_products(int(x2.shape[0]), lambda order: (
            None, ops.rotate(x2, self.rot, dense_order=order) if self.rot is not None else x2))
        if y is None:
            y = self._prepared_matvecs(x2, self._fill)[1]
        return y.reshape(*lead, self.d_out)

    def _many_rows(self, m_rows: int) -> str | None:
        """Which many-row path serves ``m_rows`` rows: ``"dense"`` (float16 dequantized copies on
        cuBLAS: ``ops.matmul_dense_ordered`` after a rotation into the copies' column order, or
        ``ops.tetra48_matmul_dense`` / ``ops.planes14_matmul_dense`` for an unrotated group), or
        None where the lattice matvec serves them (:meth:`_matvec_path`)."""
        return None if self._matvec_path(m_rows) else "dense"

    def _matvec_path(self, m_rows: int) -> bool:
        """Whether ``m_rows`` rows run the lattice matvec from the prepared activation rather than
        the float16 dequantized copies: the dispatch table's choice (``kernels.select.KERNELS``;
        ``dense-f16`` takes a group's rows from ``tuning.DENSE_MIN_ROWS``, for Planes14 only
        where its dequantization kernel is enabled)."""
        from leechq.kernels.select import Request, choose

        device = getattr(self.parts[0], _DATA[self.layout]).device
        req = Request(self.layout, m_rows, device, n_blocks=self.n_blocks, dense_copy=True)
        return choose(req).name != "dense-f16"

    def fuses_pre_ops(self, m_rows: int) -> bool:
        """Whether the RMSNorm or SwiGLU that produces this group's input can run inside its
        rotation launch (:meth:`forward_add_norm`, :meth:`forward_silu_mul`) for ``m_rows`` rows: a
        rotated group (on the matvec path the rotation writes the prepared layout, on the
        many-row paths natural order)."""
        return self.rot is not None

    def forward_add_norm(self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                         eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``(r, self(rms_norm(r)))`` with ``r = x + delta`` (``delta`` narrowed to x's dtype;
        ``r`` is ``x`` without ``delta``): the residual add, the norm and the rotation in one
        launch (``ops.norm_rotate``), then the matvecs. x, delta [..., d_in]; weight [d_in].
        Only where :meth:`fuses_pre_ops` holds."""
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.d_in).contiguous()
        d2 = None if delta is None else delta.reshape(-1, self.d_in).contiguous()
        r, y = self._many_row_products(int(x2.shape[0]), lambda order: (
            self._ops.norm_rotate(x2, weight, eps, self.rot, delta=d2, dense_order=order)))
        if y is None:
            (r, _), y = self._prepared_matvecs(x2, lambda x2, xp, order, recs: (
                self._ops.norm_rotate(x2, weight, eps, self.rot, delta=d2, prepared_order=order,
                                      out=xp, records=recs)))
        return r.reshape(x.shape), y.reshape(*lead, self.d_out)

    def forward_silu_mul(self, gate_up: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``self(silu_mul(gate_up, dtype))``: SwiGLU and the rotation in one launch
        (``ops.silu_mul_rotate``), then the matvecs. gate_up [..., 2·d_in] (gate first).
        Only where :meth:`fuses_pre_ops` holds."""
        lead = gate_up.shape[:-1]
        g2 = gate_up.reshape(-1, 2 * self.d_in).contiguous()
        _, y = self._many_row_products(int(g2.shape[0]), lambda order: (
            None, self._ops.silu_mul_rotate(g2, dtype, self.rot, dense_order=order)))
        if y is None:
            _, y = self._prepared_matvecs(g2, lambda g2, xp, order, recs: (
                self._ops.silu_mul_rotate(g2, dtype, self.rot, prepared_order=order, out=xp,
                                          records=recs)))
        return y.reshape(*lead, self.d_out)

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
        if self.layout == "tetra48":
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

        y = torch.empty(m, self.d_out, dtype=torch.float32, device=xp.device)
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
        the rotation launch (``ops.matmul_dense_ordered``: no gather, no conversion, the epilogue
        in one launch); with None float32 in natural order (the input itself for an unrotated
        group), for the natural-order dense products."""
        kind = self._many_rows(m_rows)
        if kind is None:
            return None, None
        ops = self._ops
        if kind == "dense" and self.rot is not None:
            part0 = self.parts[0]
            extra, x16 = rotated(ops.dense_input_order(part0, part0.row_scales.device))
            ys = [ops.matmul_dense_ordered(x16, part) for part in self.parts]
        else:
            matmul = (ops.tetra48_matmul_dense if self.layout == "tetra48"
                      else ops.planes14_matmul_dense)
            extra, xr = rotated(None)
            ys = [matmul(xr, part) for part in self.parts]
        y = ys[0] if len(ys) == 1 else torch.cat(ys, dim=-1)
        if self.bias is not None:
            y = y + self.bias
        return extra, y

    def _fill(self, x2: torch.Tensor, xp: torch.Tensor, order: torch.Tensor,
              recs: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """``Q x`` (or ``x`` for an unrotated group) into the prepared buffer in ``order`` (one
        launch: ``activation.rotate_prepared_kernel`` or the preparation kernel; ``recs``: the
        int8 kernel's activation records the rotation also writes, or None)."""
        if self.rot is not None:
            self._ops.rotate(x2, self.rot, prepared_order=order, out=xp, records=recs)
        else:
            self._ops.prepare_activation(x2, self.n_blocks, order, out=xp)

    def extra_repr(self) -> str:
        return (
            f"layout={self.layout}, d_in={self.d_in}, d_out={self.offsets[1:]}, "
            f"parts={len(self.parts)}, "
            f"rotated={self.rotation is not None}"
        )


def _concat_and_share(members: Sequence[nn.Module], parts: list[Any]) -> Any:
    """One record for the group (rows concatenated: one launch, a larger grid) whose storage the
    members then share: each member's plan is re-pointed to its row slice of the concatenated
    tensors (views), so its old tensors are freed and memory holds one copy."""
    from leechq.formats.layouts import get as get_layout

    cat = get_layout(_layout_of(parts[0])).concat_rows(parts)
    _share_rows(members, parts, cat)
    return cat


def _share_rows(members: Sequence[nn.Module], parts: list[Any], cat: Any) -> None:
    """Re-point each member's plan to its row slice of ``cat`` (the members' records ``parts``
    concatenated, in their layout or in the ``tetra64`` one): views, so memory holds one copy."""
    from dataclasses import replace

    layout = _layout_of(parts[0])
    off = 0
    names = (_DATA[layout], "row_scales", "row_centroids", "tail")
    order = {"t64": cat.t64} if layout == "tetra48" else {}
    for m, p in zip(members, parts, strict=True):
        plan = m._fused
        rows = slice(off, off + p.d_out)
        views = {n: getattr(cat, n)[rows] for n in names}
        plan.packed["w"] = replace(p, **order, **views)
        plan.tensors.update(views)
        off += p.d_out


def _serving_layout(part: Any) -> Any:
    """A group's packed record in the layout it is served in: a Tetra record in the standard
    layout becomes ``tetra64`` where ``ops.t64_serving`` says so (a CUDA device), with its
    shells decoded on the device; anything else as it is."""
    from leechq.kernels.triton import ops

    if (_layout_of(part) != "tetra48" or part.t64
            or not ops.t64_serving(part.device)):
        return part
    from leechq.formats.layouts.tetra64 import to_tetra64

    return to_tetra64(part)


_DATA = {"tetra48": "words", "planes14": "records"}
"""The packed code tensor of each layout."""


def _layout_of(part: Any) -> str:
    return "planes14" if hasattr(part, "records") else "tetra48"


def _check_members(records: Sequence[Any]) -> None:
    for r in records:
        if not isinstance(r, QuantizedWeight) or r.codebook not in LAYOUTS:
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


def group_from_records(
    records: Sequence[Any],
    device: torch.device | str,
    dtype: torch.dtype,
    prefer: str = "auto",
    biases: Sequence[torch.Tensor | None] | None = None,
) -> nn.Module:
    """One module for canonical records that read the same input (q|k|v, gate|up, or one).

    Runs of lattice records of one codebook (Tetra or ball) with one rotation become a
    :class:`LatticeGroup` (packed once, concatenated by rows) when ``prefer`` is not "reference"
    and the fused kernels serve them on ``device``;
    every other record becomes a ``LeechqLinear`` finalized with ``prefer``. Several parts are
    joined by a :class:`~leechq.serve.build.ConcatLinear`.

    Raises:
        KernelUnavailable: ``prefer="fused"`` and some record has no fused kernel on ``device``.
    """
    from leechq.nn.linear import LeechqLinear
    from leechq.serve.build import ConcatLinear

    device = torch.device(device)
    biases = list(biases) if biases is not None else [None] * len(records)
    runs: list[list[int]] = []
    for i, r in enumerate(records):
        prev = runs[-1] if runs else None
        if (
            _lattice(r)
            and prev is not None
            and _lattice(records[prev[0]]) == _lattice(r)
            and same_rotation(records[prev[0]].rotation, r.rotation)
        ):
            prev.append(i)
        else:
            runs.append([i])
    parts: list[nn.Module] = []
    for run in runs:
        recs = [records[i] for i in run]
        if _lattice(recs[0]) and prefer != "reference" and device.type == "cuda":
            try:
                parts.append(LatticeGroup.from_records(recs, [biases[i] for i in run], device))
                continue
            except KernelUnavailable:
                if prefer == "fused":
                    raise
        for i in run:
            mod = LeechqLinear.from_record(records[i], biases[i])
            mod.finalize(device, dtype, prefer=prefer)
            parts.append(mod)
    return parts[0] if len(parts) == 1 else ConcatLinear(parts)


def _lattice(r: Any) -> str | None:
    """The codebook of a lattice record a group can hold ("tetra" or "ball"), else None."""
    return r.codebook if isinstance(r, QuantizedWeight) and r.codebook in LAYOUTS else None


TetraGroup = LatticeGroup
"""The earlier name of :class:`LatticeGroup` (when it served Tetra only)."""
