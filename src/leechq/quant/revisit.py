"""A discrete pass over the lattice codes: re-encode blocks toward a KL-gradient step.

Tuning (:mod:`leechq.quant.tune`) trains every continuous number next to the codes; this pass
revisits the codes themselves, in the spirit of PV-tuning's linearized code step:

1. :func:`weight_gradients`: the gradient ``G = ∂KL/∂W`` of the mean KL(teacher ‖ student) over
   calibration windows, for each lattice matrix's weight as the student evaluates it (hooks on the
   modules' inputs and outputs: ``G = Σ gᵀ x``; nothing else is trained).
2. :func:`revisit_record`: in the record's rotated basis (``G_V = Q G`` row by row, the adjoint of
   the un-rotation), each block's target is its current value moved against the gradient,
   ``t = v − step · σ_row · g / r`` with ``r`` the root mean square of the matrix's block
   gradient norms (so ``step`` is the typical move in row-scale units), and is coded again with the matrix's own row scale and
   centroids (:class:`leechq.quant.coders.ShapeGainCoder`: nearest direction, gain by the norm
   rule). A block takes its new code only where the change ``Δ`` lowers the linearized loss
   (``g · Δ < 0``); row scales, centroids and the tail are unchanged, so the record keeps its
   size and format.
3. :func:`revisit_codes`: one gradient, several step sizes; the monitor windows' KL picks the
   best, the unchanged records (step 0) included, so the pass never makes the monitor worse.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from leechq.codebooks.base import BLOCK
from leechq.errors import InvalidInput
from leechq.formats.quantized_weight import QuantizedWeight
from leechq.formats.rotation import apply_rotation
from leechq.quant.coders import ShapeGainCoder
from leechq.quant.row_scales import kl_loss, mean_kl, model_logits, set_module_weights

DEFAULT_STEPS = (0.1, 0.2, 0.4)
"""Step sizes tried: a block of the matrix's rms gradient norm moves by ``step`` row scales
(:func:`revisit_record`)."""


def weight_gradients(
    student: nn.Module,
    teacher_logits: Sequence[torch.Tensor],
    windows: torch.Tensor,
    names: Sequence[str],
    *,
    on_window: Callable[[int], None] | None = None,
) -> dict[str, torch.Tensor]:
    """``∂/∂W`` of the mean KL(teacher ‖ student) over ``windows``, for the named modules.

    Args:
        student: the quantized model; each named module maps ``x [..., d_in] → y [..., d_out]``
            linearly in its weight (``y = x Wᵀ + b``), e.g. ``nn.Linear`` or a dense-path
            :class:`leechq.nn.linear.LeechqLinear`.
        teacher_logits: one float [1, T, V] tensor per window.
        windows: int64 [N, T] token ids.
        names: module names of ``student``.
        on_window: called with the window index after each backward pass (progress).

    Returns:
        ``{name: float64 [d_out, d_in]}`` on the CPU, the gradient of the mean over windows.
    """
    if len(teacher_logits) != windows.shape[0]:
        raise InvalidInput(f"{len(teacher_logits)} teacher logits for {windows.shape[0]} windows")
    grads: dict[str, torch.Tensor] = {}
    handles = []

    def hook(name: str) -> Callable[..., None]:
        def fn(module: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> None:
            x = args[0].detach()

            def acc(g: torch.Tensor) -> None:
                gw = g.reshape(-1, g.shape[-1]).double().T @ x.reshape(-1, x.shape[-1]).double()
                grads[name] = grads[name] + gw.cpu() if name in grads else gw.cpu()

            if out.requires_grad:
                out.register_hook(acc)
        return fn

    def start(module: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> torch.Tensor:
        # the embedding's output is the leaf the graph grows from (no parameter needs a gradient)
        return out.detach().requires_grad_(True)

    try:
        emb = student.get_input_embeddings() if hasattr(student, "get_input_embeddings") else None
        if emb is None:
            raise InvalidInput("the student has no input embedding to start the gradient from")
        handles.append(emb.register_forward_hook(start))
        for name in names:
            handles.append(student.get_submodule(name).register_forward_hook(hook(name)))
        n = windows.shape[0]
        with torch.enable_grad():
            for i in range(n):
                ids = windows[i : i + 1]
                loss = kl_loss(teacher_logits[i], model_logits(student, ids)) / n
                loss.backward()
                if on_window is not None:
                    on_window(i)
    finally:
        for h in handles:
            h.remove()
    missing = [n for n in names if n not in grads]
    if missing:
        raise InvalidInput(f"no gradient reached {missing[:3]} (is the module used?)")
    return grads


def revisit_record(
    record: QuantizedWeight, grad: torch.Tensor, step: float, coder: ShapeGainCoder,
    *, chunk: int = 1 << 16,
) -> tuple[QuantizedWeight, float]:
    """One linearized code step for a lattice record (the module docstring, step 2).

    Args:
        record: the matrix; its codebook must be ``coder``'s.
        grad: float [d_out, d_in], ``∂loss/∂W`` in the unrotated basis (as the model holds W).
        step: the move of a block whose gradient norm is the matrix's rms, in row scales (> 0).
        coder: the codebook's shape–gain coder (its gain bits are the record's).
        chunk: blocks coded per call.

    Returns:
        ``(record, fraction of blocks that took a new code)``.
    """
    if coder.name != record.codebook:
        raise InvalidInput(f"coder codebook {coder.name!r} against record {record.codebook!r}")
    if tuple(grad.shape) != (record.d_out, record.d_in):
        raise InvalidInput(f"gradient {list(grad.shape)} for a [{record.d_out}, {record.d_in}] "
                           "record")
    if not (step > 0 and math.isfinite(step)):
        raise InvalidInput(f"step must be a positive number, got {step}")
    g = grad.to(torch.float64)
    if record.rotation is not None:
        g = apply_rotation(g, record.rotation)
    nb = record.n_blocks
    cut = nb * BLOCK
    gb = g[:, :cut].reshape(-1, BLOCK)
    rms = float(gb.pow(2).sum(dim=1).mean().sqrt())  # rms of the block gradient norms
    if rms == 0.0:
        return record, 0.0
    v = record.dequantize_rotated()[:, :cut].reshape(-1, BLOCK)
    sigma = record.row_scales.repeat_interleave(nb)
    target = v - (step / rms) * sigma[:, None] * gb
    labels = record.labels.reshape(-1).clone()
    gains = record.gains.reshape(-1).clone()
    changed = 0
    for s in range(0, v.shape[0], chunk):
        sl = slice(s, s + chunk)
        codes = coder.code(target[sl], sigma[sl], record.centroids)
        delta = codes.values - v[sl]
        take = ((gb[sl] * delta).sum(dim=1) < 0) & (delta != 0).any(dim=1)
        if not bool(take.any()):
            continue
        idx = take.nonzero()[:, 0]
        new_labels = (codes.labels[idx] if codes.labels is not None
                      else coder.labels_of(codes.points[idx]))
        labels[s + idx] = new_labels.to(torch.int64)
        gains[s + idx] = codes.gains[idx].to(torch.uint8)
        changed += int(idx.numel())
    new = dataclasses.replace(record, labels=labels.reshape(record.d_out, nb),
                              gains=gains.reshape(record.d_out, nb))
    return new, changed / max(1, v.shape[0])


@dataclass
class RevisitResult:
    """What :func:`revisit_codes` chose.

    Attributes:
        records: the records the student now evaluates (the input's where step 0 won).
        step: the chosen step (0.0: no code changed).
        monitor_kl: ``{step: monitor KL}`` for every step tried, 0.0 being the unchanged records.
        changed: ``{step: fraction of blocks with a new code}``.
    """

    records: dict[str, QuantizedWeight]
    step: float
    monitor_kl: dict[float, float] = field(default_factory=dict)
    changed: dict[float, float] = field(default_factory=dict)


def revisit_codes(
    student: nn.Module,
    records: Mapping[str, QuantizedWeight],
    teacher_logits: Sequence[torch.Tensor],
    windows: torch.Tensor,
    monitor_logits: Sequence[torch.Tensor],
    monitor: torch.Tensor,
    *,
    steps: Sequence[float] = DEFAULT_STEPS,
    progress: Callable[[str], None] | None = None,
) -> RevisitResult:
    """The discrete pass (the module docstring): one gradient over ``windows``, every step size
    in ``steps`` applied to every lattice record, the monitor's KL choosing; ``student`` is left
    evaluating the chosen records (:func:`leechq.quant.row_scales.set_module_weights`).

    Args:
        student: the quantized model, evaluating ``records`` (dense weights or LeechqLinear).
        records: ``{module name: QuantizedWeight}``; other kinds are left alone.
        teacher_logits / windows: the gradient's windows (int64 [N, T]) and the teacher's logits,
            one [1, T, V] tensor per window.
        monitor_logits / monitor: held-out windows of the calibration text (never in
            ``windows``) and the teacher's logits on them.
        steps: positive step sizes (:func:`revisit_record`).
        progress: called with a line of text after each stage.
    """
    lattice = {n: r for n, r in records.items() if isinstance(r, QuantizedWeight)}
    if not lattice:
        raise InvalidInput("no lattice record to revisit")
    if any(not (s > 0) for s in steps):
        raise InvalidInput(f"steps must be positive, got {list(steps)}")
    say = progress or (lambda _msg: None)
    codebooks = {r.codebook for r in lattice.values()}
    gain_bits = {r.gain_bits for r in lattice.values()}
    if len(codebooks) != 1 or len(gain_bits) != 1:
        raise InvalidInput(f"records mix codebooks {sorted(codebooks)} / gain bits "
                           f"{sorted(gain_bits)}")
    coder = ShapeGainCoder(codebooks.pop(), gain_bits.pop())
    student.eval()
    base_kl = mean_kl(student, None, monitor, teacher_logits=list(monitor_logits))
    say(f"monitor KL {base_kl:.5f} before")
    grads = weight_gradients(student, teacher_logits, windows, list(lattice))
    say(f"gradients of {len(grads)} matrices over {windows.shape[0]} windows")
    result = RevisitResult(records=dict(lattice), step=0.0, monitor_kl={0.0: base_kl},
                           changed={0.0: 0.0})
    best = base_kl
    total = sum(r.d_out * r.n_blocks for r in lattice.values())
    for step in steps:
        trial, moved = {}, 0.0
        for name, rec in lattice.items():
            trial[name], frac = revisit_record(rec, grads[name], step, coder)
            moved += frac * rec.d_out * rec.n_blocks
        set_module_weights(student, trial)
        kl = mean_kl(student, None, monitor, teacher_logits=list(monitor_logits))
        result.monitor_kl[step], result.changed[step] = kl, moved / total
        say(f"step {step}: {100 * moved / total:.2f} % of blocks recoded, monitor KL {kl:.5f}")
        if kl < best:
            best, result.step, result.records = kl, step, trial
    set_module_weights(student, result.records)
    return result
