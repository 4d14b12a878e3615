"""Row-scale training: fit one multiplier per output row of every lattice matrix by KL to a teacher.

Implements docs/quantizer.md §7 (step 2 of the full-model recipe; zero bits). The codes,
gains, centroids, tails and rotations of every lattice record stay frozen — the decoder is a table
lookup and never sees a gradient. Per lattice matrix a vector ``λ ∈ R^{d_out}`` (init 1) scales only
the *lattice columns* of each row, never the tail::

    y = λ ⊙ (x Lᵀ) + x Tᵀ + b

where ``L`` is the natural-basis decode of the lattice blocks alone (tail columns zeroed in the
rotated basis before un-rotation) and ``T`` the natural-basis decode of the tail alone; ``L + T`` is
the record's decode. This is the spec's ``λ ⊙ (x Pᵀ) + (1 − λ) ⊙ (tail term)`` with ``P = L + T``.

Loss: ``KL(teacher ‖ student)`` on the full next-token distribution at every position, temperature
``τ`` (×τ²), mean over positions, computed in f32 chunks of positions. Optimizer: AdamW (weight
decay 0 by default), linear warm-up to the peak learning rate, then cosine decay to a fraction of it
(:func:`learning_rate`). λ is kept ≥ 0 after every step (a row scale cannot be negative).

Write-back (:func:`fold_row_scales`): ``σ_row ← f64(λ)·σ_row`` in f64 — the stored f64 scale is what
the decoder multiplies (``c_g·σ_row``), so the artifact is exact for the folded scale; rows with
``λ == 1.0`` exactly keep their scale bit for bit, so an all-ones result reproduces the file. The
model evaluated afterwards must be the decode of the folded records (:func:`set_module_weights`),
not the training-time product ``λ·L`` (they differ by f32 rounding).

Training is resumable: :class:`RowScaleCheckpoint` commits λ, the optimizer state and the step
atomically every ``checkpoint_every`` steps under an identity (configuration, records, data); a run
with another identity is refused.

This module is model-agnostic (layer ``quant``): a model is any ``torch.nn.Module`` whose lattice
linears are reachable by name (``model.get_submodule``) and that maps ``int64 [B, T]`` ids to logits
(``model(input_ids=..., use_cache=False).logits`` for transformers models, ``model(ids)``
otherwise).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from leechq.codebooks.base import BLOCK
from leechq.errors import ArtifactError, InvalidInput
from leechq.formats.quantized_weight import Int4Weight, QuantizedWeight
from leechq.formats.rotation import apply_rotation_transpose
from leechq.utils.progress import stage_bar

log = logging.getLogger("leechq.quant")

# --------------------------------------------------------------------------------------------------
# configuration


class ConfigDict:
    """``to_dict`` / ``from_dict`` of a frozen training-config dataclass (tuples become lists)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field."""
        out = dataclasses.asdict(self)  # type: ignore[call-overload]
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Any:
        """Inverse of :meth:`to_dict` (unknown keys are an error)."""
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - names)
        if unknown:
            raise InvalidInput(f"{cls.__name__}: unknown keys {unknown}")
        return cls(**dict(data))


def training_checks(c: Any) -> list[tuple[bool, str]]:
    """The (ok, message) checks of the settings every KL training run shares (steps, budget,
    schedule, AdamW, batch, loss, probe, checkpoints)."""
    return [
        (is_int(c.steps) and c.steps >= 0, "steps must be >= 0"),
        (c.time_budget_s > 0, "time_budget_s must be > 0"),
        (c.lr > 0, "lr must be > 0"),
        (is_int(c.warmup_steps) and c.warmup_steps >= 0, "warmup_steps must be >= 0"),
        (0.0 <= c.final_lr_fraction <= 1.0, "final_lr_fraction must be in [0, 1]"),
        (c.weight_decay >= 0, "weight_decay must be >= 0"),
        (len(c.betas) == 2 and all(0 <= b < 1 for b in c.betas), "betas in [0, 1)"),
        (is_int(c.batch) and c.batch >= 1, "batch must be >= 1"),
        (c.temperature > 0, "temperature must be > 0"),
        (is_int(c.kl_chunk) and c.kl_chunk >= 1, "kl_chunk must be >= 1"),
        (is_int(c.probe_steps) and c.probe_steps >= 1, "probe_steps must be >= 1"),
        (is_int(c.checkpoint_every) and c.checkpoint_every >= 0, "checkpoint_every must be >= 0"),
    ]


@dataclass(frozen=True)
class RowScaleConfig(ConfigDict):
    """Settings of one row-scale training run (defaults: the reference's, docs/quantizer.md §7).

    Attributes:
        steps: optimizer steps; 0 = set from ``time_budget_s`` after a probe.
        time_budget_s: wall-clock budget used when ``steps == 0`` (the reference: 7,200 s).
        lr: peak learning rate (3e-4).
        warmup_steps: linear warm-up steps (100).
        final_lr_fraction: the cosine decays to this fraction of ``lr`` (0.1).
        weight_decay: AdamW weight decay (0).
        betas: AdamW betas.
        batch: windows per step (2 windows of 1024 tokens in the reference).
        temperature: KL temperature τ (1); the loss is multiplied by τ².
        kl_chunk: positions per f32 log-softmax chunk of the loss.
        seed: seed of the window order.
        probe_steps: forward+backward steps without an update that time a step (``steps == 0``).
        checkpoint_every: commit a checkpoint every this many steps (0 = only at the end).
    """

    steps: int = 0
    time_budget_s: float = 7200.0
    lr: float = 3e-4
    warmup_steps: int = 100
    final_lr_fraction: float = 0.1
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    batch: int = 2
    temperature: float = 1.0
    kl_chunk: int = 256
    seed: int = 0
    probe_steps: int = 6
    checkpoint_every: int = 50

    def __post_init__(self) -> None:
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        checks = training_checks(self)
        for ok, message in checks:
            if not ok:
                raise InvalidInput(f"RowScaleConfig: {message}")


def is_int(value: object) -> bool:
    """An int that is not a bool (a JSON-loaded config field)."""
    return isinstance(value, int) and not isinstance(value, bool)


def learning_rate(step: int, total_steps: int, config: Any) -> float:
    """Learning rate of optimizer step ``step`` (0-based) of ``total_steps``.

    ``config`` is any settings object with ``lr``, ``warmup_steps`` and ``final_lr_fraction``
    (:class:`RowScaleConfig`, :class:`leechq.quant.tune.TuneConfig`).

    Linear warm-up ``lr·(step+1)/warmup`` over the first ``warmup_steps`` steps, then a cosine from
    ``lr`` down to ``final_lr_fraction·lr`` reached at the last step.
    """
    peak = config.lr
    warm = min(config.warmup_steps, total_steps)
    if step < warm:
        return peak * (step + 1) / warm
    floor = config.final_lr_fraction * peak
    span = total_steps - warm - 1
    progress = 1.0 if span <= 0 else min(1.0, (step - warm) / span)
    return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


# --------------------------------------------------------------------------------------------------
# the loss and the model call


def model_logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    """Logits [B, T, V] of ``model`` on ids int64 [B, T] (moved to the model's device).

    transformers models (objects with a ``config``) are called as ``model(input_ids=ids,
    use_cache=False)``; other callables as ``model(ids)``.
    """
    device = next((p.device for p in model.parameters()), None) if hasattr(model, "parameters") \
        else None
    if device is None:
        buffers = list(model.buffers()) if hasattr(model, "buffers") else []
        device = buffers[0].device if buffers else torch.device("cpu")
    ids = ids.to(device)
    is_hf = hasattr(model, "config") and hasattr(model, "forward")
    out = model(input_ids=ids, use_cache=False) if is_hf else model(ids)
    logits = out if isinstance(out, torch.Tensor) else getattr(out, "logits", None)
    if logits is None and isinstance(out, (tuple, list)) and out:
        logits = out[0]
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or \
            tuple(logits.shape[:2]) != tuple(ids.shape):
        raise InvalidInput(
            f"model returned {type(out).__name__}; expected logits [B, T, V] for ids "
            f"{tuple(ids.shape)}"
        )
    return logits


def kl_loss(
    teacher_logits: torch.Tensor,
    student_logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk: int = 256,
) -> torch.Tensor:
    """Mean over all positions of ``τ²·KL(softmax(t/τ) ‖ softmax(s/τ))``, differentiable in ``s``.

    Args:
        teacher_logits: [B, T, V] (no gradient needed).
        student_logits: [B, T, V], same shape.
        temperature: τ.
        chunk: positions per f32 log-softmax chunk (bounds the f32 temporaries).

    Returns:
        A 0-dim float32 tensor (nats per position).
    """
    if teacher_logits.shape != student_logits.shape:
        raise InvalidInput(
            f"teacher logits {tuple(teacher_logits.shape)} and student logits "
            f"{tuple(student_logits.shape)} differ in shape (same vocabulary required)"
        )
    b, t, _v = student_logits.shape
    teacher_logits = teacher_logits.to(student_logits.device)
    total = student_logits.new_zeros((), dtype=torch.float32)
    for s in range(0, t, chunk):
        e = min(t, s + chunk)
        lt = torch.log_softmax(teacher_logits[:, s:e].float() / temperature, dim=-1)
        ls = torch.log_softmax(student_logits[:, s:e].float() / temperature, dim=-1)
        total = total + (lt.exp() * (lt - ls)).sum()
    return total * (temperature * temperature) / (b * t)


# --------------------------------------------------------------------------------------------------
# the trainable module


def split_decode(record: QuantizedWeight) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Natural-basis decode of the lattice blocks alone and of the tail alone.

    Returns:
        ``(L float32 [d_out, d_in], T float32 [d_out, d_in] or None when there is no tail)``; in
        f64, ``L + T`` is the record's decode before its narrowing to f32.
    """
    rot = record.dequantize_rotated()
    cut = record.n_blocks * BLOCK
    lattice = rot.clone()
    lattice[:, cut:] = 0.0
    tail = None
    if record.tail_cols:
        tail = torch.zeros_like(rot)
        tail[:, cut:] = rot[:, cut:]
    if record.rotation is not None:
        lattice = apply_rotation_transpose(lattice, record.rotation)
        if tail is not None:
            tail = apply_rotation_transpose(tail, record.rotation)
    return lattice.to(torch.float32), (None if tail is None else tail.to(torch.float32))


class RowScaledLinear(nn.Module):
    """``y = λ ⊙ (x Lᵀ) + x Tᵀ + b`` with a trainable f32 ``λ`` [d_out] (initialized to 1).

    Attributes:
        lattice_weight: buffer [d_out, d_in] (compute dtype), the lattice part of the decode.
        tail_weight: buffer [d_out, d_in] or None, the tail part.
        bias: buffer [d_out] or None.
        scale: ``nn.Parameter`` float32 [d_out], λ.
    """

    def __init__(
        self,
        record: QuantizedWeight,
        bias: torch.Tensor | None,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        lattice, tail = split_decode(record)
        self.in_features, self.out_features = record.d_in, record.d_out
        self.register_buffer("lattice_weight", lattice.to(device=device, dtype=dtype))
        self.register_buffer(
            "tail_weight", None if tail is None else tail.to(device=device, dtype=dtype)
        )
        self.register_buffer(
            "bias", None if bias is None else bias.detach().to(device=device, dtype=dtype)
        )
        self.scale = nn.Parameter(torch.ones(record.d_out, device=device, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # λ is an f32 master parameter; under bf16 compute its effect is visible once it moves by
        # more than bf16's 2^-8 relative step (the reference trains thousands of steps in bf16).
        y = F.linear(x, self.lattice_weight) * self.scale.to(x.dtype)
        if self.tail_weight is not None:
            y = y + F.linear(x, self.tail_weight)
        if self.bias is not None:
            y = y + self.bias
        return y


def _module_place(module: nn.Module) -> tuple[torch.device, torch.dtype]:
    for t in list(module.parameters()) + list(module.buffers()):
        if t is not None and t.is_floating_point():
            return t.device, t.dtype
    return torch.device("cpu"), torch.float32


def _swap(model: nn.Module, name: str, new: nn.Module) -> nn.Module:
    parent_name, _, leaf = name.rpartition(".")
    try:
        parent = model.get_submodule(parent_name) if parent_name else model
        old = getattr(parent, leaf)
    except AttributeError as exc:
        raise InvalidInput(f"the model has no module {name!r}") from exc
    setattr(parent, leaf, new)
    return old


def attach_row_scales(
    model: nn.Module, records: Mapping[str, QuantizedWeight]
) -> tuple[dict[str, RowScaledLinear], dict[str, nn.Module]]:
    """Replace each named lattice linear of ``model`` by a :class:`RowScaledLinear` (λ = 1).

    The wrapper lives on the replaced module's device and dtype and keeps its bias.

    Returns:
        ``(wrappers, originals)`` by name; pass ``originals`` to :func:`detach_row_scales`.
    """
    wrappers: dict[str, RowScaledLinear] = {}
    originals: dict[str, nn.Module] = {}
    try:
        for name, rec in records.items():
            if not isinstance(rec, QuantizedWeight):
                raise InvalidInput(f"{name}: row scales are trained on lattice records only")
            module = model.get_submodule(name)
            device, dtype = _module_place(module)
            if dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
                dtype = torch.float32
            bias = getattr(module, "bias", None)
            wrapper = RowScaledLinear(rec, bias, device, dtype)
            originals[name] = _swap(model, name, wrapper)
            wrappers[name] = wrapper
    except BaseException:
        detach_row_scales(model, originals)
        raise
    return wrappers, originals


def detach_row_scales(model: nn.Module, originals: Mapping[str, nn.Module]) -> None:
    """Put the original modules back (inverse of :func:`attach_row_scales`)."""
    for name, module in originals.items():
        _swap(model, name, module)


def fold_row_scales(
    records: Mapping[str, QuantizedWeight], factors: Mapping[str, torch.Tensor]
) -> dict[str, QuantizedWeight]:
    """New records with ``σ_row ← f64(λ)·σ_row`` (f64 product; ``λ == 1.0`` rows untouched).

    Args:
        records: the lattice records.
        factors: name → λ float32 [d_out] (finite, ≥ 0); names absent from ``factors`` are kept.

    Returns:
        name → record (the unchanged ones are the same objects).

    Raises:
        InvalidInput: a factor of the wrong shape, non-finite or negative.
    """
    out: dict[str, QuantizedWeight] = {}
    for name, rec in records.items():
        lam = factors.get(name)
        if lam is None:
            out[name] = rec
            continue
        lam64 = lam.detach().to(device="cpu", dtype=torch.float64).reshape(-1)
        if lam64.numel() != rec.d_out:
            raise InvalidInput(f"{name}: {lam64.numel()} row factors for d_out={rec.d_out}")
        if not bool(torch.isfinite(lam64).all()) or bool((lam64 < 0).any()):
            raise InvalidInput(f"{name}: row factors must be finite and non-negative")
        scales = torch.where(lam64 == 1.0, rec.row_scales, lam64 * rec.row_scales)
        out[name] = dataclasses.replace(rec, row_scales=scales)
    return out


def set_module_weights(
    model: nn.Module, records: Mapping[str, QuantizedWeight | Int4Weight],
    decode_device: torch.device | str | None = None,
) -> None:
    """Make the named linears of ``model`` evaluate exactly the decode of ``records``.

    ``nn.Linear``-like modules get ``weight ← decode`` (cast to their dtype); modules that hold a
    record themselves (``set_record`` + ``finalize``, i.e. :class:`leechq.nn.linear.LeechqLinear`)
    get the record and are finalized again on their device and dtype. A lattice record is decoded
    on ``decode_device`` (default: the weight's device; the bits are the same on every device,
    :meth:`QuantizedWeight.dequantize_rotated`), an int4 record on the host.
    """
    for name, rec in records.items():
        module = model.get_submodule(name)
        if hasattr(module, "set_record") and hasattr(module, "finalize"):
            execution = getattr(module, "execution", None)
            module.set_record(rec)
            if execution is not None:
                module.finalize(execution.device, execution.dtype)
            continue
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.Tensor):
            raise InvalidInput(f"module {name} has no weight tensor to set")
        if isinstance(rec, QuantizedWeight):
            dense = rec.dequantize(torch.float32, device=decode_device or weight.device)
        else:
            dense = rec.dequantize(torch.float32)
        if tuple(dense.shape) != tuple(weight.shape):
            raise InvalidInput(
                f"{name}: record decodes to {list(dense.shape)}, the module holds "
                f"{list(weight.shape)}"
            )
        with torch.no_grad():
            weight.copy_(dense.to(device=weight.device, dtype=weight.dtype))


# --------------------------------------------------------------------------------------------------
# checkpoints


def _atomic_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class RowScaleCheckpoint:
    """A resumable training directory.

    Layout: ``step_NNNNNN.pt`` (λ by name, the AdamW state, the loss history) and ``state.json``
    (identity, committed step, total steps; written last — the commit point). Only the latest step
    file is kept.

    Args:
        directory: created if missing.
        identity: the run identity; a directory holding another identity is refused.
    """

    def __init__(self, directory: str | os.PathLike[str], identity: str) -> None:
        self.dir = Path(directory)
        self.identity = identity
        self.dir.mkdir(parents=True, exist_ok=True)
        self.state: dict[str, Any] = {"identity": identity, "step": 0, "total_steps": None}
        path = self.dir / "state.json"
        if path.exists():
            try:
                state = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError) as exc:
                raise ArtifactError(f"row-scale checkpoint {path} is unreadable: {exc}") from exc
            if state.get("identity") != identity:
                raise InvalidInput(
                    f"row-scale checkpoint {self.dir} belongs to another run (identity "
                    f"{state.get('identity')!r}, this run {identity!r}): the configuration, "
                    "records or data changed; use a new checkpoint directory"
                )
            self.state = state

    @property
    def step(self) -> int:
        """Committed optimizer steps."""
        return int(self.state["step"])

    @property
    def total_steps(self) -> int | None:
        """The run's step count (fixed by the first run; None before any commit)."""
        total = self.state.get("total_steps")
        return None if total is None else int(total)

    def load(self) -> dict[str, Any]:
        """The committed payload: ``{"scales": {name: λ}, "optimizer": ..., "history": [...]}``."""
        path = self.dir / f"step_{self.step:06d}.pt"
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # corrupt or missing: name the file
            raise ArtifactError(f"row-scale checkpoint file {path} is unreadable: {exc}") from exc

    def commit(self, step: int, total_steps: int, payload: dict[str, Any]) -> None:
        """Write ``payload`` for ``step`` committed steps, then advance ``state.json``."""
        import io

        buf = io.BytesIO()
        torch.save(payload, buf)
        _atomic_bytes(self.dir / f"step_{step:06d}.pt", buf.getvalue())
        previous = self.step
        self.state.update({"step": step, "total_steps": total_steps})
        _atomic_bytes(
            self.dir / "state.json", json.dumps(self.state, indent=1, sort_keys=True).encode()
        )
        old = self.dir / f"step_{previous:06d}.pt"
        if previous != step and old.exists():
            old.unlink()

    def remove(self) -> None:
        """Delete the directory (after a successful run)."""
        shutil.rmtree(self.dir, ignore_errors=True)


def run_identity(
    config: RowScaleConfig, records: Mapping[str, QuantizedWeight], windows: torch.Tensor
) -> str:
    """sha256 of the configuration (minus the time budget), the records' row scales and the data."""
    h = hashlib.sha256()
    cfg = config.to_dict()
    cfg.pop("time_budget_s")
    cfg.pop("probe_steps")
    cfg.pop("checkpoint_every")
    h.update(json.dumps(cfg, sort_keys=True).encode())
    for name in sorted(records):
        rec = records[name]
        h.update(f"{name}|{rec.d_out}|{rec.d_in}|".encode())
        h.update(rec.row_scales.detach().cpu().contiguous().numpy().tobytes())
        h.update(rec.labels[:, :1].detach().cpu().contiguous().numpy().tobytes())
    ids = windows.detach().cpu().to(torch.int64).contiguous()
    h.update(str(tuple(ids.shape)).encode())
    h.update(ids.numpy().tobytes())
    return h.hexdigest()[:32]


# --------------------------------------------------------------------------------------------------
# training


@dataclass
class RowScaleResult:
    """What :func:`train_row_scales` returns.

    Attributes:
        records: the folded lattice records (name → record).
        factors: name → λ float32 [d_out] (CPU).
        steps: optimizer steps of the run (total, resumed ones included).
        resumed_from: steps taken from a checkpoint.
        seconds: wall time of this call (probe included).
        seconds_per_step: mean wall time per optimizer step in this call.
        probe: ``{"seconds_per_step", "first_kl", "peak_memory_bytes"}`` when a probe ran.
        loss_history: training KL per step (nats per position; streaming data — not a held-out
            gauge, pitfall 6.4.12).
        monitor_kl_before, monitor_kl_after: mean KL on the fixed monitor windows (None if none).
        tokens: training tokens seen (all steps).
    """

    records: dict[str, QuantizedWeight]
    factors: dict[str, torch.Tensor]
    steps: int
    resumed_from: int
    seconds: float
    seconds_per_step: float
    probe: dict[str, float] = field(default_factory=dict)
    loss_history: list[float] = field(default_factory=list)
    monitor_kl_before: float | None = None
    monitor_kl_after: float | None = None
    tokens: int = 0

    def summary(self) -> dict[str, Any]:
        """JSON-ready summary (no per-row arrays): steps, times, KL gauges, λ statistics."""
        lam = torch.cat([f.reshape(-1).to(torch.float64) for f in self.factors.values()]) \
            if self.factors else torch.zeros(0, dtype=torch.float64)
        hist = self.loss_history
        k = max(1, len(hist) // 10)
        return {
            "steps": self.steps,
            "resumed_from": self.resumed_from,
            "tokens": self.tokens,
            "seconds": self.seconds,
            "seconds_per_step": self.seconds_per_step,
            "probe": dict(self.probe),
            "train_kl_first_decile": sum(hist[:k]) / k if hist else None,
            "train_kl_last_decile": sum(hist[-k:]) / k if hist else None,
            "monitor_kl_before": self.monitor_kl_before,
            "monitor_kl_after": self.monitor_kl_after,
            "matrices": len(self.factors),
            "rows": int(lam.numel()),
            "lambda_mean": float(lam.mean()) if lam.numel() else None,
            "lambda_std": float(lam.std()) if lam.numel() > 1 else None,
            "lambda_min": float(lam.min()) if lam.numel() else None,
            "lambda_max": float(lam.max()) if lam.numel() else None,
            "rows_changed": int((lam != 1.0).sum()),
        }


def _window_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g)


def batch_at(windows: torch.Tensor, step: int, batch: int, seed: int) -> torch.Tensor:
    """The windows of optimizer step ``step``: a seeded permutation per epoch, ``batch`` at a time.

    Deterministic in (windows, step, batch, seed), so a resumed run sees the same data.
    """
    return windows[batch_indices(windows.shape[0], step, batch, seed)]


def batch_indices(n: int, step: int, batch: int, seed: int) -> list[int]:
    """Indices into ``n`` windows of optimizer step ``step`` (the rule of :func:`batch_at`)."""
    idx = []
    for k in range(step * batch, (step + 1) * batch):
        epoch, pos = divmod(k, n)
        idx.append(int(_window_order(n, seed, epoch)[pos]))
    return idx


@torch.no_grad()
def mean_kl(
    student: Any,
    teacher: Any,
    windows: torch.Tensor,
    *,
    batch: int = 1,
    temperature: float = 1.0,
    chunk: int = 256,
    teacher_logits: list[torch.Tensor] | None = None,
) -> float:
    """Mean over windows and positions of KL(teacher ‖ student) (:func:`kl_loss`), no gradient.

    ``teacher_logits`` (one tensor per batch, as produced by the same batching) skips the teacher.
    """
    total, count = 0.0, 0
    for i, start in enumerate(range(0, windows.shape[0], batch)):
        ids = windows[start : start + batch]
        t_logits = teacher_logits[i] if teacher_logits is not None else model_logits(teacher, ids)
        loss = kl_loss(t_logits, model_logits(student, ids), temperature=temperature, chunk=chunk)
        total += float(loss) * ids.shape[0]
        count += ids.shape[0]
    return total / max(1, count)


def train_row_scales(
    student: nn.Module,
    teacher: Any,
    records: Mapping[str, QuantizedWeight | Int4Weight],
    windows: torch.Tensor,
    config: RowScaleConfig,
    *,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    monitor_windows: torch.Tensor | None = None,
    keep_checkpoint: bool = False,
    on_step: Callable[[int, float], None] | None = None,
    progress: bool = False,
) -> RowScaleResult:
    """Train λ of every lattice record of ``student`` against ``teacher``; fold it back.

    On return the student's lattice linears hold the decode of the folded records (the artifact's
    exact weights); int4 records in ``records`` are left alone (no λ, docs/quantizer.md §7).

    Args:
        student: the quantized model; its modules named in ``records`` are its lattice linears
            (weights equal to the records' decode), everything else is frozen.
        teacher: the reference model (same vocabulary), on the device of its choice.
        records: name → record; only :class:`QuantizedWeight` entries are trained.
        windows: int64 [N, T] training windows (calibration text, never the evaluation split).
        config: the training settings.
        checkpoint_dir: resumable run directory; removed after success unless ``keep_checkpoint``.
        monitor_windows: int64 [M, T'] fixed windows on which KL is measured before and after.
        keep_checkpoint: keep the checkpoint directory after success.
        on_step: called as ``on_step(step, loss)`` after each optimizer step (tests).
        progress: tqdm bars (stderr, with time estimates) for the timing probe and the steps.

    Returns:
        :class:`RowScaleResult`.
    """
    started = time.perf_counter()
    lattice = {n: r for n, r in records.items() if isinstance(r, QuantizedWeight)}
    if not lattice:
        raise InvalidInput("train_row_scales: no lattice records to train")
    if windows.dim() != 2 or windows.dtype != torch.int64 or windows.shape[0] < 1:
        raise InvalidInput(
            f"training windows must be int64 [N >= 1, T], got {windows.dtype} "
            f"{list(windows.shape)}"
        )
    student.requires_grad_(False)
    result_probe: dict[str, float] = {}
    identity = run_identity(config, lattice, windows)
    ckpt = RowScaleCheckpoint(checkpoint_dir, identity) if checkpoint_dir is not None else None

    wrappers, originals = attach_row_scales(student, lattice)
    try:
        monitor_before = (
            mean_kl(student, teacher, monitor_windows, batch=config.batch,
                    temperature=config.temperature, chunk=config.kl_chunk)
            if monitor_windows is not None else None
        )
        params = [wrappers[n].scale for n in sorted(wrappers)]
        optimizer = torch.optim.AdamW(
            params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay
        )
        history: list[float] = []
        start_step = 0
        total_steps = config.steps or None
        if ckpt is not None and ckpt.step > 0:
            payload = ckpt.load()
            with torch.no_grad():
                for name, lam in payload["scales"].items():
                    wrappers[name].scale.copy_(lam.to(wrappers[name].scale.device))
            optimizer.load_state_dict(payload["optimizer"])
            history = list(payload["history"])
            start_step = ckpt.step
            total_steps = ckpt.total_steps
            log.info("row scales: resuming at step %d of %s", start_step, total_steps)

        def loss_of(step: int) -> torch.Tensor:
            ids = batch_at(windows, step, config.batch, config.seed)
            with torch.no_grad():
                t_logits = model_logits(teacher, ids)
            s_logits = model_logits(student, ids)
            return kl_loss(t_logits, s_logits, temperature=config.temperature,
                           chunk=config.kl_chunk)

        if total_steps is None:
            # Probe: time forward+backward without an update (λ stays exactly 1).
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            first = None
            with stage_bar("row scales: timing probe", config.probe_steps, "step",
                           progress) as pbar:
                for k in range(config.probe_steps):
                    loss = loss_of(k)
                    loss.backward()
                    optimizer.zero_grad(set_to_none=True)
                    first = float(loss.detach()) if first is None else first
                    pbar.update(1)
            per_step = (time.perf_counter() - t0) / config.probe_steps
            remaining = config.time_budget_s - (time.perf_counter() - started)
            total_steps = max(1, int(remaining / max(per_step, 1e-9)))
            result_probe = {
                "seconds_per_step": per_step,
                "first_kl": float(first if first is not None else float("nan")),
                "peak_memory_bytes": float(torch.cuda.max_memory_allocated())
                if torch.cuda.is_available() else 0.0,
                "steps_from_budget": float(total_steps),
            }
            log.info("row scales: probe %.3f s/step → %d steps", per_step, total_steps)

        bar = stage_bar("row scales", total_steps, "step", progress, initial=start_step)
        t_loop = time.perf_counter()
        for step in range(start_step, total_steps):
            lr = learning_rate(step, total_steps, config)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss = loss_of(step)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                for p in params:
                    p.clamp_(min=0.0)
            history.append(float(loss.detach()))
            if on_step is not None:
                on_step(step, history[-1])
            bar.update(1)
            bar.set_postfix(kl=f"{history[-1]:.4f}")
            done = step + 1
            if ckpt is not None and (
                done == total_steps
                or (config.checkpoint_every and done % config.checkpoint_every == 0)
            ):
                ckpt.commit(done, total_steps, {
                    "scales": {n: w.scale.detach().cpu().clone() for n, w in wrappers.items()},
                    "optimizer": optimizer.state_dict(),
                    "history": history,
                })
        bar.close()
        loop_steps = total_steps - start_step
        per_step = (time.perf_counter() - t_loop) / max(1, loop_steps)
        factors = {n: w.scale.detach().cpu().clone() for n, w in wrappers.items()}
    finally:
        detach_row_scales(student, originals)
    folded = fold_row_scales(lattice, factors)
    set_module_weights(student, folded)
    monitor_after = (
        mean_kl(student, teacher, monitor_windows, batch=config.batch,
                temperature=config.temperature, chunk=config.kl_chunk)
        if monitor_windows is not None else None
    )
    if ckpt is not None and not keep_checkpoint:
        ckpt.remove()
    return RowScaleResult(
        records=folded,
        factors=factors,
        steps=total_steps,
        resumed_from=start_step,
        seconds=time.perf_counter() - started,
        seconds_per_step=per_step,
        probe=result_probe,
        loss_history=history,
        monitor_kl_before=monitor_before,
        monitor_kl_after=monitor_after,
        tokens=total_steps * config.batch * int(windows.shape[1]),
    )
