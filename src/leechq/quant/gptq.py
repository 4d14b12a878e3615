"""Block GPTQ over 24-column groups with shape–gain coding, and the int4 path.

Implements docs/quantizer.md §5 exactly (and docs/quantizer.md §4, §6):

* the weights are rotated ``W' = W Qᵀ`` (Q applied to every row) in f64;
* row scales ``s_i`` are computed once on the full rotated row (tail included) and frozen; the
  coder's per-matrix parameters (gain centroids) are fitted on ``W'`` *before* the loop (pitfall
  P5);
* left → right over 24-column groups Q: every row's block of the group is coded in a batched coder
  call (the hot path), ``E = v − q`` against the *compensated* values, ``X = E·U_QQ⁻¹``, ``W'[:, R]
  −= X·U[Q, R]`` for all later columns R (tail included);
* the ``d_in mod 24`` tail columns are never quantized but absorb every correction, then are rounded
  to f32 in the rotated basis (``KeepExact``) so that the file and the evaluated model agree (P13);
* there is no retraction (a no-op for gain-reset coding, and it would cancel any gain code,
  docs/quantizer.md §5, pitfall P3 of its §9).

Speed (one GPU must quantize an 8B model in minutes): :func:`gptq_quantize_many` runs the loops of
several matrices (all linears of a transformer block) concurrently, gathering the current column
group of every matrix due into ONE coder call per global step (:func:`schedule`); the loop makes no
host syncs on an accelerator; the ball's labels are computed once per matrix at the end (the loop
only needs points and gains); and on an accelerator the error feedback uses GPTQ's lazy batch
updates (matrix products, ``propagation="lazy"``).

Bit-exactness. With ``propagation="exact"`` (the CPU default) the update ``E·(U_QQ⁻¹·U[Q, R])`` is
written as explicit element-wise f64 multiplies and adds in a fixed order (no BLAS reduction whose
order could depend on the number of rows), so the batched loop, the concurrent loop and the per-row
reference :func:`gptq_quantize_reference` agree bit for bit. The lazy path sums the same correction
in another order through matrix products whose blocking may depend on the row count: it agrees with
the exact path to rounding (tested: tight tolerance, equal codes on seeded examples), not bit for
bit, and on an accelerator the reductions inside the encoders are not promised to be batch
invariant either. Whatever the path, the evaluated blocks are rebuilt from the stored codes with
the decoder's own f64 sequence, so the record always decodes to exactly the evaluated weights
(P13), and a run is deterministic for a given device, model and configuration (resume gives the
same bytes).

The int4 path (:func:`quantize_int4`) keeps a matrix as the published ``int4g128`` record in the
natural basis: round-to-nearest of the original tensor (the recipe, docs/quantizer.md §7),
or optionally column-wise GPTQ against the natural-basis Hessian with the group scales frozen.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from leechq.codebooks import shape_gain
from leechq.codebooks.base import BLOCK
from leechq.errors import InvalidInput, UnsupportedShape
from leechq.formats.quantized_weight import Int4Weight, QuantizedWeight
from leechq.formats.rotation import RotationTables, apply_rotation, apply_rotation_transpose
from leechq.quant.coders import BlockCoder, row_scales

PROPAGATIONS = ("auto", "exact", "lazy")
"""Error-feedback paths: "exact" element-wise (row-batch invariant), "lazy" matrix products over
windows, "auto" = exact on the CPU, lazy elsewhere."""
DEFAULT_WINDOW = 384
"""Columns per lazy window (16 groups of 24): corrections inside the window are applied at each
step, the rest of the matrix is corrected once per window by one matrix product."""


@dataclass
class GPTQResult:
    """One coded matrix.

    Attributes:
        coder: name of the coder that produced it.
        lattice: whether ``labels``/``gains`` are codebook codes (a :class:`QuantizedWeight`).
        weight_rot: float64 [d_out, d_in], the evaluated matrix in the rotated basis (coded blocks
            as reconstructed in exact f64 order, tail rounded to f32).
        labels: int64 [d_out, n_blocks].
        gains: uint8 [d_out, n_blocks].
        row_scales: float64 [d_out].
        centroids: float64 [K].
        rotation: the rotation tables (effective seed), or None.
    """

    coder: str
    lattice: bool
    weight_rot: torch.Tensor
    labels: torch.Tensor
    gains: torch.Tensor
    row_scales: torch.Tensor
    centroids: torch.Tensor
    rotation: RotationTables | None

    @property
    def d_out(self) -> int:
        return int(self.weight_rot.shape[0])

    @property
    def d_in(self) -> int:
        return int(self.weight_rot.shape[1])

    def to_quantized_weight(self) -> QuantizedWeight:
        """The canonical record (only for lattice coders)."""
        if not self.lattice:
            raise InvalidInput(f"coder {self.coder!r} does not produce lattice codes")
        nb = self.d_in // BLOCK
        return QuantizedWeight(
            codebook=self.coder,
            d_out=self.d_out,
            d_in=self.d_in,
            labels=self.labels.cpu(),
            gains=self.gains.cpu(),
            row_scales=self.row_scales.cpu(),
            centroids=self.centroids.cpu(),
            tail=self.weight_rot[:, nb * BLOCK :].to(torch.float32).cpu().contiguous(),
            rotation=self.rotation,
        )

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The natural-basis matrix the pipeline evaluates: un-rotate in f64, narrow to f32 once.

        Computed on the device of ``weight_rot`` (the un-rotation is element-wise f64 adds and
        multiplies in a fixed order, so every IEEE device gives the same bits). For a lattice coder
        this equals ``to_quantized_weight().dequantize()`` bit for bit (P13).
        """
        w = self.weight_rot
        if self.rotation is not None:
            w = apply_rotation_transpose(w, self.rotation)
        return w.to(torch.float32).to(dtype)


def _check_weight(weight: torch.Tensor, name: str) -> None:
    if weight.dim() != 2:
        raise InvalidInput(f"{name}: expected a 2-D weight, got shape {list(weight.shape)}")
    if not weight.is_floating_point():
        raise InvalidInput(f"{name}: weight must be floating point, got {weight.dtype}")
    if not bool(torch.isfinite(weight).all()):
        raise InvalidInput(f"{name}: weight has non-finite values")


def _propagate(
    w: torch.Tensor, err: torch.Tensor, u_qq: torch.Tensor, u_qr: torch.Tensor, start: int
) -> None:
    """Exact propagation: ``W[:, R] −= X·U[Q, R]`` with ``X = E·U_QQ⁻¹``.

    ``M = U_QQ⁻¹·U[Q, R]`` (24 × |R|) is shared by every row; the per-row product ``E·M`` is summed
    over the 24 rows of M in ascending order with element-wise f64 multiplies and adds, so a row's
    result never depends on how many rows are processed together.
    """
    m = torch.linalg.solve_triangular(u_qq, u_qr, upper=True)
    update = err[:, 0:1] * m[0:1, :]
    for j in range(1, err.shape[1]):
        update = update + err[:, j : j + 1] * m[j : j + 1, :]
    w[:, start:] -= update


def _setup(
    weight: torch.Tensor,
    u: torch.Tensor | None,
    coder: BlockCoder,
    rotation: RotationTables | None,
    tail_policy: str,
    name: str,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    _check_weight(weight, name)
    d_in = weight.shape[1]
    if d_in < BLOCK:
        raise UnsupportedShape(f"{name}: d_in={d_in} is smaller than one {BLOCK}-column block")
    if d_in % BLOCK and tail_policy == "refuse":
        raise UnsupportedShape(
            f"{name}: d_in={d_in} is not a multiple of {BLOCK} and tail_policy is 'refuse'"
        )
    if tail_policy not in ("keep_exact", "refuse"):
        raise InvalidInput(f"unknown tail_policy {tail_policy!r}")
    if rotation is not None and rotation.n != d_in:
        raise InvalidInput(f"{name}: rotation width {rotation.n} != d_in {d_in}")
    if u is not None:
        if tuple(u.shape) != (d_in, d_in):
            raise InvalidInput(f"{name}: Hessian factor {list(u.shape)} does not match d_in {d_in}")
        u = u.to(device=weight.device, dtype=torch.float64)
    w = weight.detach().to(torch.float64)
    if rotation is not None:
        w = apply_rotation(w, rotation)  # each row r -> Q r, i.e. W' = W Qᵀ
    w = w.contiguous()
    scales = row_scales(w)
    centroids = coder.fit(w, scales).to(device=w.device, dtype=torch.float64)
    return w, u, scales, centroids


def _resolve_propagation(propagation: str, device: torch.device) -> str:
    if propagation not in PROPAGATIONS:
        raise InvalidInput(f"propagation must be one of {PROPAGATIONS}, got {propagation!r}")
    if propagation == "auto":
        return "exact" if device.type == "cpu" else "lazy"
    return propagation


class _Matrix:
    """The loop state of one matrix: its rotated rows (modified in place), codes, and the pending
    corrections of the current lazy window."""

    def __init__(
        self,
        w: torch.Tensor,
        u: torch.Tensor | None,
        scales: torch.Tensor,
        centroids: torch.Tensor,
        coder: BlockCoder,
        propagation: str,
        window: int,
    ):
        rows, d_in = w.shape
        dev = w.device
        self.w, self.u, self.scales, self.centroids = w, u, scales, centroids
        self.rows, self.d_in, self.nb = rows, d_in, d_in // BLOCK
        self.mode = _resolve_propagation(propagation, dev)
        self.window = max(1, window // BLOCK)  # column groups per lazy window
        self.step = 0  # next column group
        self.row_levels = centroids.reshape(1, -1).expand(rows, -1)
        self.deferred = bool(getattr(coder, "defers_labels", False))
        self.labels = (
            None if self.deferred else torch.zeros(rows, self.nb, dtype=torch.int64, device=dev)
        )
        self.gains = torch.zeros(rows, self.nb, dtype=torch.uint8, device=dev)
        # Lattice points (|coordinate| ≤ 14 for the ball, ≤ 10 for Tetra; int16 leaves room), kept
        # to rebuild the evaluated blocks from the codes at the end (P13) and for deferred labels.
        self.points = (
            torch.zeros(rows, self.nb, BLOCK, dtype=torch.int16, device=dev)
            if coder.lattice
            else None
        )
        self.pending = (
            torch.zeros(rows, self.window * BLOCK, dtype=torch.float64, device=dev)
            if self.mode == "lazy" and u is not None
            else None
        )

    def columns(self) -> torch.Tensor:
        """The current (compensated) values of the next column group: float64 [rows, 24]."""
        lo = self.step * BLOCK
        return self.w[:, lo : lo + BLOCK]

    def apply(
        self,
        values: torch.Tensor,
        gains: torch.Tensor,
        labels: torch.Tensor | None,
        points: torch.Tensor | None,
    ) -> None:
        """Store the codes of the next column group and propagate its error."""
        b = self.step
        lo, hi = b * BLOCK, (b + 1) * BLOCK
        q = values.to(device=self.w.device, dtype=torch.float64)
        err = self.w[:, lo:hi] - q
        self.w[:, lo:hi] = q
        self.gains[:, b] = gains.to(self.w.device)
        if self.labels is not None:
            if labels is None:
                raise InvalidInput("the coder returned no labels and does not defer them")
            self.labels[:, b] = labels.to(self.w.device)
        if self.points is not None:
            if points is None:
                raise InvalidInput("a lattice coder must return its points")
            self.points[:, b] = points.to(device=self.w.device, dtype=torch.int16)
        self.step = b + 1
        if self.u is None or hi >= self.d_in:
            return
        if self.mode == "exact":
            # An exactly-zero error (identity control, all-zero rows) has nothing to propagate; the
            # test costs a host sync, so it is only made on the CPU.
            if self.w.device.type != "cpu" or bool(err.any()):
                _propagate(self.w, err, self.u[lo:hi, lo:hi], self.u[lo:hi, hi:], hi)
            return
        self._propagate_lazy(b, err)

    def _propagate_lazy(self, b: int, err: torch.Tensor) -> None:
        """GPTQ's lazy batch update. ``X = E·U_QQ⁻¹`` corrects the rest of the current window of
        column groups at once and is kept; when the window closes, every later column (tail
        included) gets ``Σ_window X·U[Q, R]`` as one matrix product. The same total correction as
        :func:`_propagate` step by step, summed in another order."""
        assert self.pending is not None and self.u is not None
        u, w = self.u, self.w
        lo, hi = b * BLOCK, (b + 1) * BLOCK
        x = torch.linalg.solve_triangular(u[lo:hi, lo:hi], err, upper=True, left=False)
        first = (b // self.window) * self.window
        last = min(first + self.window, self.nb)  # groups [first, last) form the window
        end = last * BLOCK
        if hi < end:
            w[:, hi:end] -= x @ u[lo:hi, hi:end]
        offset = (b - first) * BLOCK
        self.pending[:, offset : offset + BLOCK] = x
        if b + 1 == last and end < self.d_in:
            width = (last - first) * BLOCK
            w[:, end:] -= self.pending[:, :width] @ u[first * BLOCK : end, end:]

    def finish(self, coder: BlockCoder, rotation: RotationTables | None) -> GPTQResult:
        """Codes → result: deferred labels, the evaluated blocks rebuilt from the codes, the tail
        rounded to its storage precision."""
        w, nb = self.w, self.nb
        labels = self.labels
        if self.deferred:
            assert self.points is not None
            labels = coder.labels_of(self.points).to(w.device)  # type: ignore[attr-defined]
        if labels is None:
            labels = torch.zeros(self.rows, nb, dtype=torch.int64, device=w.device)
        if self.points is not None and nb:
            # P13 by construction: the evaluated blocks are the decoder's reconstruction of the
            # stored codes (the loop's own values agree bit for bit; checked in the tests).
            flat = shape_gain.reconstruct(
                self.points.reshape(-1, BLOCK),
                self.gains.reshape(-1),
                self.scales[:, None].expand(-1, nb).reshape(-1),
                self.centroids,
            )
            w[:, : nb * BLOCK] = flat.reshape(self.rows, nb * BLOCK)
        self.points = None
        self.pending = None
        return _finish(w, labels, self.gains, self.scales, self.centroids, coder, rotation)


def _finish(
    w: torch.Tensor,
    labels: torch.Tensor,
    gains: torch.Tensor,
    scales: torch.Tensor,
    centroids: torch.Tensor,
    coder: BlockCoder,
    rotation: RotationTables | None,
) -> GPTQResult:
    nb = w.shape[1] // BLOCK
    # KeepExact: the tail is stored as f32 in the rotated basis, so evaluate exactly that (P13).
    w[:, nb * BLOCK :] = w[:, nb * BLOCK :].to(torch.float32).to(torch.float64)
    return GPTQResult(
        coder=coder.name,
        lattice=coder.lattice,
        weight_rot=w,
        labels=labels,
        gains=gains,
        row_scales=scales,
        centroids=centroids.cpu(),
        rotation=rotation,
    )


def schedule(n_groups: Sequence[int], rows: Sequence[int] | None = None) -> list[list[int]]:
    """Which matrices take a column-group step at each global step of the concurrent loop.

    There are S = max(n_groups) global steps (the longest matrix steps every time). A matrix with
    n groups takes its step b somewhere in the window ``[⌊b·S/n⌋, ⌊(b+1)·S/n⌋)`` — the windows are
    consecutive and non-empty, so its steps stay in order and spread over the whole run — at the
    least-loaded global step of that window (matrices placed heaviest first, ties to the earliest
    step). This evens out the rows per coder call: small calls are latency-bound and large ones
    throughput-bound, so equal calls are the cheapest (Qwen3-8B shapes: 512 calls of 9–16 k rows
    instead of 170 of 39 k and 342 of 4 k). The schedule never changes a matrix's own arithmetic,
    only which rows share a coder call.

    Args:
        n_groups: column groups per matrix.
        rows: rows per matrix (the load of one of its steps); None → 1 each.

    Returns:
        For each global step, the indices of the matrices stepping then (ascending).
    """
    rows = list(rows) if rows is not None else [1] * len(n_groups)
    if len(rows) != len(n_groups):
        raise InvalidInput(f"schedule: {len(n_groups)} matrices but {len(rows)} row counts")
    total = max(n_groups, default=0)
    load = [0] * total
    steps: list[list[int]] = [[] for _ in range(total)]
    for j in sorted(range(len(n_groups)), key=lambda j: (-rows[j] * n_groups[j], j)):
        n = n_groups[j]
        for b in range(n):
            window = range((b * total) // n, ((b + 1) * total) // n)
            at = min(window, key=lambda s: (load[s], s))
            load[at] += rows[j]
            steps[at].append(j)
    return [sorted(step) for step in steps]


def _run(matrices: Sequence[_Matrix], coder: BlockCoder,
         on_step: Callable[[int], None] | None = None) -> None:
    """The concurrent loop of docs/quantizer.md §5: at each global step, one coder call for the next
    column group of
    every matrix due (rows stacked), then each matrix stores its codes and propagates its error;
    ``on_step(column groups coded)`` after each step (a progress bar)."""
    for active in schedule([m.nb for m in matrices], [m.rows for m in matrices]):
        group = [matrices[j] for j in active]
        if len(group) == 1:
            m = group[0]
            v = m.columns().clone()
            codes = coder.code(v, m.scales, m.centroids)
            m.apply(codes.values, codes.gains, codes.labels, codes.points)
            if on_step is not None:
                on_step(1)
            continue
        v = torch.cat([m.columns() for m in group])
        scales = torch.cat([m.scales for m in group])
        levels = torch.cat([m.row_levels for m in group])
        codes = coder.code(v, scales, levels)
        start = 0
        for m in group:
            rows = slice(start, start + m.rows)
            start += m.rows
            m.apply(
                codes.values[rows],
                codes.gains[rows],
                None if codes.labels is None else codes.labels[rows],
                None if codes.points is None else codes.points[rows],
            )
        if on_step is not None:
            on_step(len(group))


@dataclass
class GPTQJob:
    """One matrix for :func:`gptq_quantize_many`.

    Attributes:
        weight: [d_out, d_in] float, natural basis, on the compute device.
        u: float64 [d_in, d_in] upper factor of the damped, rotated inverse Hessian, or None.
        rotation: the input rotation (effective seed), or None.
        tail_policy: "keep_exact" or "refuse".
        name: used in error messages.
    """

    weight: torch.Tensor
    u: torch.Tensor | None
    rotation: RotationTables | None = None
    tail_policy: str = "keep_exact"
    name: str = "weight"


def gptq_quantize_many(
    jobs: Sequence[GPTQJob],
    coder: BlockCoder,
    *,
    propagation: str = "auto",
    window: int = DEFAULT_WINDOW,
    on_step: Callable[[int], None] | None = None,
) -> list[GPTQResult]:
    """Code several matrices with block GPTQ concurrently (docs/quantizer.md §5).

    Every matrix runs its own left → right loop with its own factor, rotation and centroids; at
    each global step (:func:`schedule`) the next column group of every matrix due is coded in ONE
    coder call (the encoders need tens of thousands of blocks per call to be efficient, while one
    matrix offers only ``d_out``). Rows are independent, so on the CPU with exact propagation each
    result equals :func:`gptq_quantize` of that matrix alone, bit for bit.

    Args:
        jobs: the matrices (may mix widths; all on one device).
        coder: the block coder (row-independent).
        propagation: "exact" (element-wise, row-batch invariant; the CPU default), "lazy" (GPTQ's
            lazy batch updates with matrix products over windows of ``window`` columns; the
            accelerator default: agrees with "exact" to rounding, but a matrix product's summation
            order may depend on the number of rows, so bit-exact batch invariance is not promised),
            or "auto".
        window: lazy window width in columns (rounded down to a multiple of 24).
        on_step: called with the number of (matrix, column group) pairs coded after each step
            (a progress bar; the total is the jobs' ``d_in // 24`` summed), or None.

    Returns:
        One :class:`GPTQResult` per job, in order.
    """
    matrices = []
    prepared = []
    for job in jobs:
        w, u, scales, centroids = _setup(
            job.weight, job.u, coder, job.rotation, job.tail_policy, job.name
        )
        prepared.append(job.rotation)
        matrices.append(_Matrix(w, u, scales, centroids, coder, propagation, window))
    _run(matrices, coder, on_step)
    return [m.finish(coder, rot) for m, rot in zip(matrices, prepared, strict=True)]


def gptq_quantize(
    weight: torch.Tensor,
    u: torch.Tensor | None,
    coder: BlockCoder,
    rotation: RotationTables | None = None,
    tail_policy: str = "keep_exact",
    name: str = "weight",
    *,
    propagation: str = "auto",
    window: int = DEFAULT_WINDOW,
    on_step: Callable[[int], None] | None = None,
) -> GPTQResult:
    """Code one matrix with block GPTQ (docs/quantizer.md §5), all rows at once.

    Args:
        weight: [d_out, d_in] float, natural basis (on the compute device).
        u: float64 [d_in, d_in] upper-triangular factor of the damped, *rotated* inverse Hessian
            (``H'⁻¹ = UᵀU``), or None for plain rounding (no error feedback).
        coder: the block coder (e.g. :class:`leechq.quant.coders.ShapeGainCoder`).
        rotation: the input rotation with its effective seed, or None.
        tail_policy: "keep_exact" or "refuse".
        name: the matrix name used in error messages.
        propagation, window, on_step: see :func:`gptq_quantize_many`.

    Returns:
        The coded matrix (:class:`GPTQResult`).
    """
    job = GPTQJob(weight, u, rotation, tail_policy, name)
    return gptq_quantize_many([job], coder, propagation=propagation, window=window,
                              on_step=on_step)[0]


def gptq_quantize_reference(
    weight: torch.Tensor,
    u: torch.Tensor | None,
    coder: BlockCoder,
    rotation: RotationTables | None = None,
    tail_policy: str = "keep_exact",
    name: str = "weight",
) -> GPTQResult:
    """Reference twin of :func:`gptq_quantize`: the same loop run serially, one row at a time, with
    exact (element-wise) propagation.

    On the CPU it agrees with the batched loop bit for bit (rows are independent).
    """
    w, u, scales, centroids = _setup(weight, u, coder, rotation, tail_policy, name)
    nb = w.shape[1] // BLOCK
    labels = torch.zeros(w.shape[0], nb, dtype=torch.int64, device=w.device)
    gains = torch.zeros(w.shape[0], nb, dtype=torch.uint8, device=w.device)
    for i in range(w.shape[0]):
        row = _Matrix(
            w[i : i + 1].clone(), u, scales[i : i + 1], centroids, coder, "exact", DEFAULT_WINDOW
        )
        _run([row], coder)
        res = row.finish(coder, rotation)
        w[i] = res.weight_rot[0]
        labels[i] = res.labels[0]
        gains[i] = res.gains[0]
    return _finish(w, labels, gains, scales, centroids, coder, rotation)


def proxy_loss(delta: torch.Tensor, h: torch.Tensor) -> float:
    """The local GPTQ objective ``Tr(ΔW H ΔWᵀ)`` (float64)."""
    d = delta.to(torch.float64)
    return float(((d @ h.to(torch.float64)) * d).sum())


def _int4_codes(w: torch.Tensor, s32: torch.Tensor, b32: torch.Tensor) -> torch.Tensor:
    """Nearest 4-bit level of f32 values under the exact reconstruction ``f32(s·q) + b``."""
    q = torch.clamp(torch.round((w - b32) / s32), 0, 15)
    cand = torch.stack([torch.clamp(q + d, 0, 15) for d in (-1.0, 0.0, 1.0)])
    err = ((s32 * cand + b32) - w).abs()
    return cand.gather(0, err.argmin(dim=0, keepdim=True))[0]


def quantize_int4(
    weight: torch.Tensor,
    u_natural: torch.Tensor | None = None,
    group: int = 128,
    name: str = "weight",
) -> Int4Weight:
    """An int4 g``group`` record of a natural-basis matrix.

    Args:
        weight: [d_out, d_in] float (d_in even).
        u_natural: None → round-to-nearest of the original tensor (``Int4Weight.quantize``, the
            published recipe); else the float64 upper factor of the damped *natural-basis* inverse
            Hessian, and the codes are chosen column by column with GPTQ error feedback while the
            group scales/offsets stay those of the original tensor.
        group: group size along the row.
        name: used in error messages.
    """
    _check_weight(weight, name)
    base = Int4Weight.quantize(weight.detach().cpu(), group=group)
    if u_natural is None:
        return base
    d_out, d_in = weight.shape
    if tuple(u_natural.shape) != (d_in, d_in):
        raise InvalidInput(
            f"{name}: Hessian factor {list(u_natural.shape)} does not match d_in {d_in}"
        )
    dev = weight.device
    u = u_natural.to(device=dev, dtype=torch.float64)
    col_group = torch.arange(d_in, device=dev) // group
    s32 = base.scales.to(device=dev, dtype=torch.float32)[:, col_group]
    b32 = base.biases.to(device=dev, dtype=torch.float32)[:, col_group]
    w = weight.detach().to(torch.float64).clone()
    codes = torch.empty(d_out, d_in, dtype=torch.uint8, device=dev)
    for j in range(d_in):
        col = w[:, j].to(torch.float32)
        q = _int4_codes(col, s32[:, j], b32[:, j])
        codes[:, j] = q.to(torch.uint8)
        deq = (s32[:, j] * q + b32[:, j]).to(torch.float64)  # f32 multiply, f32 add (no FMA)
        if j + 1 < d_in:
            x = (w[:, j] - deq) / u[j, j]
            w[:, j + 1 :] -= x[:, None] * u[j : j + 1, j + 1 :]
    codes = codes.cpu()
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()
    return Int4Weight(
        d_out=d_out, d_in=d_in, qweight=packed, scales=base.scales, biases=base.biases, group=group
    )
