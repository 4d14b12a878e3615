"""A discrete pass over the codes of a tuned model: every lattice matrix re-encoded toward a target
one step down the loss's gradient, kept only where the held-out monitor agrees.

End-to-end tuning (:mod:`leechq.quant.tune`) trains every stored continuous number with the codes
fixed. This pass revisits the codes themselves (the "V step" of PV-tuning, here with the encoder
as the projection):

1. **Gradient and Hessians.** On ``batches × batch`` calibration windows, the KL to the teacher is
   back-propagated to every lattice linear's dense weight (``G`` [d_out, d_in]) while the same
   forwards accumulate each linear's input second moments ``H = (1/N) Σ x xᵀ`` (the student's own
   activations).
2. **Target.** ``T = W − η · (rms W / rms D) · D`` with ``D = G·H_λ⁻¹`` (``H_λ`` damped as the
   encoder damps): the layer-local Newton direction, scaled so that ``η`` is the step's size
   relative to the weights' (one ``η`` for every matrix).
3. **Re-encode.** Block GPTQ (:func:`leechq.quant.gptq.gptq_quantize_many`) codes ``T`` with the
   record's own (tuned) row scales and centroids and the factor of ``H``: each block's rounding
   error is compensated in the later columns, as in the first encode. At ``η = 0`` the target is
   the present decode and the codes come back unchanged.
4. **Choice.** Each ``η`` of ``steps`` is a trial; the monitor's held-out KL decides, and the pass
   keeps the best trial only when it beats the model as it came (otherwise the records are
   returned unchanged).

Only the lattice matrices' blocks and tails change (int4 matrices and tables pass through); the
row scales and centroids stay as tuned, so the caller may tune them again afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from leechq.errors import InvalidInput
from leechq.formats.quantized_weight import QuantizedWeight
from leechq.formats.rotation import apply_rotation_transpose
from leechq.quant.coders import ShapeGainCoder
from leechq.quant.gptq import GPTQJob, gptq_quantize_many
from leechq.quant.hessian import HessianAccumulator, capture_inputs, damp, prepare_factor
from leechq.quant.row_scales import (
    ConfigDict,
    batch_indices,
    is_int,
    kl_loss,
    model_logits,
    set_module_weights,
)
from leechq.utils.progress import stage_bar


@dataclass(frozen=True)
class CodeStepConfig(ConfigDict):
    """Settings of one discrete pass.

    Attributes:
        batches, batch: the gradient and Hessians come from ``batches`` steps of ``batch``
            windows.
        steps: the relative step sizes ``η`` tried (each re-encodes every lattice matrix).
        damping: relative Hessian damping λ (the encoder's default).
        group: matrices per concurrent GPTQ call.
        temperature, kl_chunk: the KL's temperature and positions per f32 log-softmax chunk.
        seed: seed of the window order.
    """

    batches: int = 16
    batch: int = 2
    steps: tuple[float, ...] = (0.02, 0.06, 0.2)
    damping: float = 0.01
    group: int = 8
    temperature: float = 1.0
    kl_chunk: int = 256
    seed: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", tuple(float(e) for e in self.steps))
        checks = [
            (is_int(self.batches) and self.batches >= 1, "batches must be >= 1"),
            (is_int(self.batch) and self.batch >= 1, "batch must be >= 1"),
            (bool(self.steps) and all(e >= 0 for e in self.steps), "steps must be >= 0"),
            (0.0 < self.damping < 1.0, "damping must be in (0, 1)"),
            (is_int(self.group) and self.group >= 1, "group must be >= 1"),
            (self.temperature > 0, "temperature must be > 0"),
            (is_int(self.kl_chunk) and self.kl_chunk >= 1, "kl_chunk must be >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidInput(f"CodeStepConfig: {message}")


def gradients_and_hessians(student: nn.Module, teacher: Any, names: list[str],
                           windows: torch.Tensor, config: CodeStepConfig,
                           amp: Callable[[], Any] = nullcontext
                           ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``∂KL/∂W`` and the input second moments of the named linears, over the configured batches.

    Args:
        student: the quantized model; each named module has a dense ``weight`` (its decode).
        teacher: the reference model (same vocabulary).
        names: the linears (module names).
        windows: int64 [N, T] calibration windows.
        config: the settings (batches, batch, temperature, seed).
        amp: a context for the forwards (bf16 autocast on CUDA).

    Returns:
        ``(grads, hessians)``: name → float32 [d_out, d_in] (the loss is the mean KL per position
        over all batches) and name → float64 [d_in, d_in] ``(1/N) Σ x xᵀ``, on the student's
        device.
    """
    modules = {n: student.get_submodule(n) for n in names}
    accs = {i: HessianAccumulator(modules[n].weight.shape[1], modules[n].weight.device)
            for i, n in enumerate(names)}
    for m in modules.values():
        m.weight.grad = None
        m.weight.requires_grad_(True)
    try:
        with capture_inputs({i: modules[n] for i, n in enumerate(names)}, accs):
            for k in range(config.batches):
                ids = windows[batch_indices(windows.shape[0], k, config.batch, config.seed)]
                with torch.no_grad(), amp():
                    t_logits = model_logits(teacher, ids)
                with amp():
                    s_logits = model_logits(student, ids)
                loss = kl_loss(t_logits, s_logits, temperature=config.temperature,
                               chunk=config.kl_chunk) / config.batches
                loss.backward()
        grads = {n: m.weight.grad.detach().float() for n, m in modules.items()}
    finally:
        for m in modules.values():
            m.weight.requires_grad_(False)
            m.weight.grad = None
    return grads, {n: accs[i].finalize() for i, n in enumerate(names)}


def natural_decode(record: QuantizedWeight) -> torch.Tensor:
    """The record's decode in the natural basis, float64 [d_out, d_in] (no narrowing)."""
    w = record.dequantize_rotated()
    return w if record.rotation is None else apply_rotation_transpose(w, record.rotation)


def target(weight: torch.Tensor, grad: torch.Tensor, hessian: torch.Tensor, step: float,
           damping: float) -> torch.Tensor:
    """``W − η · (rms W / rms D) · D`` with ``D = G·H_λ⁻¹`` (module docstring), float64.

    Args:
        weight: float64 [d_out, d_in] the present decode (natural basis).
        grad: float [d_out, d_in] the loss's gradient.
        hessian: float64 [d_in, d_in] the input second moments.
        step: ``η`` ≥ 0.
        damping: relative damping λ of ``H``.
    """
    if step == 0:
        return weight
    g = grad.to(device=weight.device, dtype=torch.float64)
    h = damp(hessian.to(device=weight.device, dtype=torch.float64), damping)
    d = torch.linalg.solve(h, g.T).T  # H symmetric: (H⁻¹ Gᵀ)ᵀ = G H⁻¹
    rms_d = torch.sqrt((d * d).mean())
    if not bool(rms_d > 0):
        return weight
    rms_w = torch.sqrt((weight * weight).mean())
    return weight - (step * rms_w / rms_d) * d


def reencode(records: Mapping[str, QuantizedWeight], targets: Mapping[str, torch.Tensor],
             factors: Mapping[str, torch.Tensor], group: int = 8,
             on_matrix: Callable[[], None] | None = None) -> dict[str, QuantizedWeight]:
    """Block GPTQ of each target with its record's row scales, centroids, rotation and codebook.

    Args:
        records: name → the lattice record (its scales, centroids, rotation, codebook).
        targets: name → float64 [d_out, d_in] natural-basis target (on the compute device).
        factors: name → float64 [d_in, d_in] upper factor of the rotated, damped inverse Hessian.
        group: matrices per concurrent call (same codebook and gain bits).
        on_matrix: called after each matrix (a progress bar).

    Returns:
        name → the re-encoded :class:`QuantizedWeight`.
    """
    out: dict[str, QuantizedWeight] = {}
    kinds: dict[tuple[str, int], list[str]] = {}
    for n, rec in records.items():
        kinds.setdefault((rec.codebook, rec.gain_bits), []).append(n)
    for (codebook, gain_bits), names in kinds.items():
        coder = ShapeGainCoder(codebook, gain_bits)
        for i in range(0, len(names), group):
            chunk = names[i:i + group]
            jobs = [GPTQJob(targets[n], factors[n], records[n].rotation, name=n,
                            scales=records[n].row_scales, centroids=records[n].centroids)
                    for n in chunk]
            for n, res in zip(chunk, gptq_quantize_many(jobs, coder), strict=True):
                out[n] = res.to_quantized_weight()
                if on_matrix is not None:
                    on_matrix()
    return out


@dataclass
class CodeStepResult:
    """What :func:`code_step` returns.

    Attributes:
        records: every record passed in, the lattice ones re-encoded by the kept trial (the same
            objects when no trial won).
        monitor_kl_before: the monitor's KL of the model as it came.
        trials: ``{"step", "blocks_changed", "monitor_kl"}`` of every trial.
        kept: the winning trial, or None.
        blocks: lattice blocks of the model.
        seconds: wall time of the pass.
    """

    records: dict[str, Any]
    monitor_kl_before: float
    trials: list[dict[str, float]]
    kept: dict[str, float] | None
    blocks: int
    seconds: float

    def summary(self) -> dict[str, Any]:
        """JSON-ready summary."""
        return {"monitor_kl_before": self.monitor_kl_before, "trials": self.trials,
                "kept": self.kept, "blocks": self.blocks, "seconds": self.seconds}


def code_step(student: nn.Module, teacher: Any, records: Mapping[str, Any],
              windows: torch.Tensor, monitor_windows: torch.Tensor | None,
              config: CodeStepConfig, *, progress: bool = True) -> CodeStepResult:
    """One discrete pass over the lattice records' codes (module docstring).

    On return ``student`` evaluates exactly the decode of the returned records.

    Args:
        student: the quantized model, on its device; every lattice record's module holds a dense
            ``weight`` (its decode).
        teacher: the reference model (same vocabulary).
        records: module name → record (lattice ones are revisited; others pass through).
        windows: int64 [N, T] calibration windows (the gradient's and Hessians').
        monitor_windows: int64 [M, T'] held-out windows (the trials' judge).
        config: the settings.
        progress: a bar over the re-encodes.

    Returns:
        :class:`CodeStepResult`.

    Raises:
        InvalidInput: no monitor windows, or no lattice record.
    """
    if monitor_windows is None or monitor_windows.dim() != 2 or monitor_windows.shape[0] < 1:
        raise InvalidInput("code_step needs held-out monitor windows int64 [M >= 1, T] to judge "
                           "its trials")
    lattice = {n: r for n, r in records.items() if isinstance(r, QuantizedWeight)}
    if not lattice:
        raise InvalidInput("code_step: no lattice records")
    started = time.perf_counter()
    device = next(iter(student.parameters())).device

    def amp() -> Any:
        return (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda"
                else nullcontext())

    mon_teacher = []
    with torch.no_grad():
        for i in range(monitor_windows.shape[0]):
            with amp():
                mon_teacher.append(model_logits(teacher, monitor_windows[i:i + 1]).float().cpu())

    @torch.no_grad()
    def score() -> float:
        total = 0.0
        for i, t_logits in enumerate(mon_teacher):
            with amp():
                s_logits = model_logits(student, monitor_windows[i:i + 1])
            total += float(kl_loss(t_logits, s_logits, temperature=config.temperature,
                                   chunk=config.kl_chunk))
        return total / len(mon_teacher)

    student.requires_grad_(False)
    names = sorted(lattice)
    grads, hessians = gradients_and_hessians(student, teacher, names, windows, config, amp)
    factors = {n: prepare_factor(hessians[n], lattice[n].rotation, config.damping, n)
               for n in names}
    now = {n: natural_decode(lattice[n]).to(device) for n in names}
    before = score()
    n_blocks = sum(r.d_out * r.n_blocks for r in lattice.values())
    trials: list[dict[str, float]] = []
    best: dict[str, Any] = {"kl": before, "trial": None, "records": None}
    with stage_bar("codes: re-encode", len(config.steps) * len(names), "matrix",
                   progress) as bar:
        for step in config.steps:
            targets = {n: target(now[n], grads[n], hessians[n], step, config.damping)
                       for n in names}
            new = reencode(lattice, targets, factors, config.group,
                           on_matrix=lambda: bar.update(1))
            del targets
            changed = sum(int(((new[n].labels != r.labels) | (new[n].gains != r.gains)).sum())
                          for n, r in lattice.items())
            set_module_weights(student, new)
            kl = score()
            trial = {"step": step, "blocks_changed": changed, "monitor_kl": kl}
            trials.append(trial)
            if kl < best["kl"]:
                best = {"kl": kl, "trial": trial, "records": new}
    out = dict(records)
    if best["trial"] is not None:
        out.update(best["records"])
    set_module_weights(student, {n: out[n] for n in names})
    return CodeStepResult(records=out, monitor_kl_before=before, trials=trials,
                          kept=best["trial"], blocks=n_blocks,
                          seconds=time.perf_counter() - started)
