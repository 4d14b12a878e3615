"""End-to-end tuning: every continuous parameter of a quantized model trained by KL to the teacher.

The codes never change (lattice labels and gain indices, int4 and table nibbles/bytes); what is
trained is every number stored next to them, each through a multiplicative factor (init 1) or an
offset (init 0) so that one learning rate fits all of them:

============  ====================================================  ==========================
group         composition (trainable in brackets)                   folded back as
============  ====================================================  ==========================
row_scales    ``W = Qᵀ [[λ] ⊙ c_G ⊙ U, T]`` per lattice row         ``σ_row ← λ·σ_row`` (f64)
centroids     ``c_k ← [γ_k]·c_k`` per lattice matrix                 ``centroids ← γ·c`` (f64)
int4          ``s ← s0·[ρ]``, ``b ← b0 + s0·[δ]`` per int4 group     f16 scale and bias
tables        the same for the 4/8-bit embedding / head tables      f16 scale and bias
norms         ``w ← w0·[ν]`` for every RMSNorm/LayerNorm weight      the raw tensor's dtype
biases        ``b ← [b]`` for the biases of quantized linears        the raw tensor's dtype
============  ====================================================  ==========================

In the rotated basis a lattice block of gain index ``k`` is ``c_k`` times its decode with that
centroid set to 1 (``U``), and the tail ``T`` follows the blocks; the weight is their un-rotation
``W = Qᵀ [[λ] ⊙ c_G ⊙ U, T]`` (:func:`leechq.quant.composed.lattice_factors`), which is the
record's decode when every factor is 1 (row-scale training, :mod:`leechq.quant.row_scales`, is the
case "λ only").

Memory: a quantized linear or table is a composed module (:mod:`leechq.quant.composed`) whose
weight is composed from its factors in the forward and *recomposed* in the backward (a group-affine
one a chunk of rows at a time), so no weight-sized tensor is kept for the backward; the frozen
parts are buffers in the compute dtype, one copy of each weight whatever the number of centroids
(:func:`tune_memory_bytes`).

The teacher runs every step by default (``teacher_topk`` 0): the loss is the KL over the full
vocabulary. With ``teacher_topk`` = k > 0 it runs once, before training instead: its distribution
over each training position is cached as its top-``k`` log-probabilities plus the log of the
remaining mass (docs/decisions.md says why that is not the default). The loss on cached positions
is the KL between the two distributions *coarsened to k+1 outcomes* (the k teacher tokens and
"anything else"): a lower bound of the full KL (data processing), exact when the teacher's mass
outside its top k is zero. How much mass lies outside the top k depends on the model (the result
records its mean, ``teacher_rest_mass``): on a near-uniform teacher (the random test models) the
coarse objective can mislead, so check that figure before relying on a small k. The held-out
monitor always uses the full-vocabulary KL.

Stopping: the held-out monitor windows (never trained on) are scored every ``monitor_every`` steps;
the best state (the untouched start included) is kept and restored at the end, and ``patience``
evaluations without improvement stop the run. A budget is a step count or seconds of training (a
probe times a step; the one-off teacher logits and composing come on top). The run is resumable:
parameters, optimizer state, history and the monitor's best state are committed atomically every
``checkpoint_every`` steps; a killed run continues from the last commit to the same result.

Precision: f32 master factors; on CUDA the forward runs under bf16 autocast with bf16 frozen
parts, on the CPU in f32. After training the factors are folded into new records / raw tensors and
the model is set to evaluate exactly their decode (what the artifact stores).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from leechq.codebooks.base import BLOCK
from leechq.errors import InvalidInput
from leechq.formats.artifact import GroupAffine
from leechq.formats.quantized_weight import Int4Weight, QuantizedWeight
from leechq.quant.composed import GROUPS, Attached, attach, detach, fold, set_raw
from leechq.quant.row_scales import (
    ConfigDict,
    RowScaleCheckpoint,
    batch_indices,
    is_int,
    kl_loss,
    learning_rate,
    model_logits,
    set_module_weights,
    training_checks,
)
from leechq.utils.progress import stage_bar

log = logging.getLogger("leechq.quant")


@dataclass(frozen=True)
class TuneConfig(ConfigDict):
    """Settings of one tuning run.

    Attributes:
        steps: optimizer steps; 0 = set from ``time_budget_s`` after a probe.
        time_budget_s: wall-clock budget of the training when ``steps == 0``: the first monitor
            score, the probe, the steps and their monitor scores (the teacher's logits and
            composing the model come before it: on a CPU they take minutes whatever the budget).
        lr: peak AdamW learning rate of every factor.
        warmup_steps, final_lr_fraction: linear warm-up, then cosine to this fraction of ``lr``.
        weight_decay, betas: AdamW settings (decay 0: the factors have no natural zero).
        batch: training windows per step.
        temperature: KL temperature τ (the loss is ×τ²).
        kl_chunk: positions per f32 log-softmax chunk.
        seed: seed of the window order.
        groups: which parameter groups train (a subset of :data:`GROUPS`).
        teacher_topk: cached teacher log-probabilities per position (0 = the full teacher online).
        monitor_every: score the held-out monitor every this many steps.
        patience: stop after this many monitor scores without a new best (0 = never early).
        probe_steps: timed forward+backward steps without an update (``steps == 0``).
        checkpoint_every: commit every this many steps (0 = at the end only).
    """

    steps: int = 0
    time_budget_s: float = 600.0
    lr: float = 3e-4
    warmup_steps: int = 20
    final_lr_fraction: float = 0.1
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    batch: int = 2
    temperature: float = 1.0
    kl_chunk: int = 256
    seed: int = 0
    groups: tuple[str, ...] = GROUPS
    teacher_topk: int = 0
    monitor_every: int = 10
    patience: int = 0
    probe_steps: int = 3
    checkpoint_every: int = 25

    def __post_init__(self) -> None:
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        object.__setattr__(self, "groups", tuple(self.groups))
        unknown = sorted(set(self.groups) - set(GROUPS))
        checks = [
            *training_checks(self),
            (not unknown, f"unknown groups {unknown}; choices {list(GROUPS)}"),
            (bool(self.groups), "groups must not be empty"),
            (is_int(self.teacher_topk) and self.teacher_topk >= 0, "teacher_topk must be >= 0"),
            (is_int(self.monitor_every) and self.monitor_every >= 1, "monitor_every >= 1"),
            (is_int(self.patience) and self.patience >= 0, "patience must be >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidInput(f"TuneConfig: {message}")




DEFAULT_TUNE_STEPS = 600
"""Steps of the full recipe's tuning step unless the user sets a budget (with the training text
that ``leechq quantize`` takes by default, as many windows as the steps read: 1 200 of 512 tokens).
Measured (smollm2-135m, 2.70 b/param, H100, 32 768 tokens of the five-domain default calibration,
16 × 512 held-out windows per set, the full teacher; docs/decisions.md): on the ball codebook,
100 steps on 600 windows took the docs' perplexity ratio to ×1.215 and the unseen domain's to
×1.719, 300 steps on the same windows to ×1.149 and ×1.640 (paired 95 % intervals of 100 minus 300
steps +0.055…+0.077 and +0.062…+0.098), 600 steps on 1 200 windows to ×1.121 and ×1.592 (a
separate run on the same held-out windows), the monitor keeping the last step each time. On
Tetra, one full result tuned for 600, 300 and 900 steps: ×1.112 and ×1.601 at 600; 300 minus 600
steps +0.013…+0.025 and +0.028…+0.054; 900 minus 600 steps −0.012…−0.003 and −0.007…+0.009, so
steps past 600 gain a little in the calibration's domains and nothing on the unseen one. 300 steps
on 64 windows gained in-domain only: more steps pay with more text, not on the same windows again.
The cost is linear in the steps: 600 took 309 s (ball) and 173 s (Tetra) on that GPU, about 2 s a
step at Qwen3-8B shape."""


def tune_settings(steps: int = DEFAULT_TUNE_STEPS, seconds: float = 0.0) -> TuneConfig | None:
    """The full recipe's tuning settings for a budget: ``seconds > 0`` trains for that long,
    else ``steps`` steps; None when both are 0 (no tuning).

    The other settings are the measured run's (:data:`DEFAULT_TUNE_STEPS`): peak lr 2e-3, a tenth
    of the steps of warm-up, the held-out monitor scored ten times (every 10 steps under a time
    budget).

    Raises:
        InvalidInput: a negative budget.
    """
    if steps < 0 or seconds < 0:
        raise InvalidInput(f"tuning budget must be >= 0, got {steps} steps and {seconds:g} s")
    if seconds > 0:
        return TuneConfig(steps=0, time_budget_s=float(seconds), lr=2e-3, warmup_steps=10,
                          monitor_every=10)
    if steps == 0:
        return None
    tenth = max(1, steps // 10)
    return TuneConfig(steps=steps, lr=2e-3, warmup_steps=tenth, monitor_every=tenth)


TRANSIENT_WEIGHT_COPIES = 6
"""Float32 copies of the largest composed weight (the head or the embedding table of an LLM) that
one step may keep alive at once, in :func:`tune_memory_bytes`. Fitted on Qwen3-8B shapes at 12 and
36 layers and 1 024 and 2 048 tokens per step (H100, ``benchmarks/tune_memory.py``,
``benchmarks/results/tune-memory-qwen3-8b-*-h100-2026-12-06.json``: 5.3 copies, rounded up) when
a table's backward recomposed the whole weight under autograd. Tables now compose
:data:`leechq.quant.composed.ROW_CHUNK` rows at a time (on the CPU a head-sized table's step
peaks 0.3 f32 weights above its start instead of 4.0), so this is an upper bound until the GPU
peak is measured again."""

ACTIVATION_BYTES = 3.5
"""Bytes per token per input and output feature of every linear (the head's output features are
the logits) that a step keeps for its backward, in :func:`tune_memory_bytes`: 2.9–3.1 measured on
the same runs, rounded up."""


def tune_memory_bytes(model: nn.Module, on_cuda: bool, tokens: int = 1024) -> int:
    """Upper estimate of the peak bytes tuning needs on its device for a model shaped like
    ``model``, training on ``tokens`` tokens per step (``batch`` × window length).

    The larger of two moments:

    * **placed**: the student in float32 and the teacher in the compute dtype (bfloat16 on CUDA,
      float32 on the CPU), as the recipe places them before composing;
    * **training**: on CUDA each dense weight of the student leaves for the CPU as its composed
      twin arrives (:func:`leechq.quant.composed.attach`), so the student's linear and table
      weights count as their frozen parts (one compute-dtype copy of every linear and embedding
      weight plus an int32 gain index per 24 linear weights); on the CPU both stay. On top, a
      step's transients: :data:`TRANSIENT_WEIGHT_COPIES` float32 copies of the largest weight,
      and :data:`ACTIVATION_BYTES` per token per input and output feature of every linear (the
      head's output features are the logits).

    On Qwen3-8B shapes the estimate lay 6–9 % above the peaks measured before the tables'
    row-chunked backward (``benchmarks/tune_memory.py``; the constants' notes), which lowered
    them. Not counted: gradients of the (vector-sized) factors and the optimizer state. A mixture
    of experts counts every expert's activations, more than a step keeps.

    Args:
        model: the dense model (or one of the same shapes); a tied tensor counts once.
        on_cuda: the compute dtype is bfloat16 and the dense weights are parked (else float32,
            kept).
        tokens: tokens per training step (``TuneConfig.batch`` × the windows' length).
    """
    width = 2 if on_cuda else 4
    params = sum(p.numel() for p in model.parameters())
    weights = {id(m.weight): m.weight for m in model.modules() if isinstance(m, nn.Embedding)}
    tables = sum(w.numel() for w in weights.values())  # a tied head is its embedding's table
    linear = features = 0
    largest = max((w.numel() for w in weights.values()), default=0)
    for m in model.modules():
        if isinstance(m, nn.Linear):
            features += m.in_features + m.out_features
            largest = max(largest, m.weight.numel())
            if id(m.weight) not in weights:
                weights[id(m.weight)] = m.weight
                linear += m.weight.numel()
    frozen = (linear + tables) * width + linear // BLOCK * 4
    teacher = params * width
    placed = params * 4 + teacher
    dense_left = (params - linear - tables) * 4 if on_cuda else params * 4
    transient = TRANSIENT_WEIGHT_COPIES * 4 * largest + int(tokens * ACTIVATION_BYTES * features)
    training = dense_left + frozen + teacher + transient
    return max(placed, training) if on_cuda else training


# --------------------------------------------------------------------------------------------------
# the teacher, cached


@dataclass
class TeacherCache:
    """The teacher's distribution over every position of a set of windows.

    Attributes:
        logp: float32 [N, T, k] top-k log-probabilities at temperature τ (descending).
        index: int64 [N, T, k] their token ids.
        rest: float32 [N, T] log of the mass outside the top k (unused when k equals the vocab).
        vocab: the vocabulary size.
    """

    logp: torch.Tensor
    index: torch.Tensor
    rest: torch.Tensor
    vocab: int

    @property
    def k(self) -> int:
        return int(self.logp.shape[-1])


@torch.no_grad()
def cache_teacher(teacher: Any, windows: torch.Tensor, topk: int, temperature: float = 1.0,
                  amp: Any = nullcontext, bar: Any = None) -> TeacherCache:
    """Run ``teacher`` once over ``windows`` (int64 [N, T]) and keep its top-``topk`` log-probs
    (``bar``: a tqdm bar advanced by one per window, or None)."""
    logp, index, rest = [], [], []
    vocab = 0
    for i in range(windows.shape[0]):
        with amp():
            logits = model_logits(teacher, windows[i : i + 1])[0].float()
        vocab = int(logits.shape[-1])
        lp = torch.log_softmax(logits / temperature, dim=-1)
        k = min(topk, vocab)
        vals, idx = lp.topk(k, dim=-1)
        logp.append(vals.cpu())
        index.append(idx.cpu())
        if k < vocab:
            rest.append(lp.scatter(-1, idx, float("-inf")).logsumexp(-1).cpu())
        else:
            rest.append(torch.full(lp.shape[:-1], float("-inf")))
        if bar is not None:
            bar.update(1)
    return TeacherCache(torch.stack(logp), torch.stack(index), torch.stack(rest), vocab)


def topk_kl_loss(cache: TeacherCache, rows: list[int], student_logits: torch.Tensor, *,
                 temperature: float = 1.0, chunk: int = 256) -> torch.Tensor:
    """Mean over positions of ``τ²·KL`` between the teacher and the student coarsened to the
    teacher's top-k tokens plus "the rest" (exact when k equals the vocabulary).

    Args:
        cache: the teacher cache; ``rows`` selects its windows (one per batch row).
        student_logits: [B, T, V] (B = len(rows)).

    Returns:
        A 0-dim float32 tensor (nats per position).
    """
    b, t, v = student_logits.shape
    if v != cache.vocab or len(rows) != b or cache.logp.shape[1] != t:
        raise InvalidInput(
            f"student logits {list(student_logits.shape)} do not match the teacher cache "
            f"({len(rows)} windows x {cache.logp.shape[1]} positions, vocab {cache.vocab})"
        )
    dev = student_logits.device
    lp_all = cache.logp[rows].to(dev)
    idx_all = cache.index[rows].to(dev)
    rest_all = cache.rest[rows].to(dev)
    exact = cache.k >= cache.vocab
    total = student_logits.new_zeros((), dtype=torch.float32)
    for s in range(0, t, chunk):
        e = min(t, s + chunk)
        ls = torch.log_softmax(student_logits[:, s:e].float() / temperature, dim=-1)
        lp, idx = lp_all[:, s:e], idx_all[:, s:e]
        total = total + (lp.exp() * (lp - ls.gather(-1, idx))).sum()
        if not exact:
            lr = rest_all[:, s:e]
            lq_rest = ls.scatter(-1, idx, float("-inf")).logsumexp(-1)
            total = total + (lr.exp() * (lr - lq_rest)).sum()
    return total * (temperature * temperature) / (b * t)


# --------------------------------------------------------------------------------------------------
# training


def run_identity(config: TuneConfig, records: Mapping[str, Any], raw: Mapping[str, Any],
                 windows: torch.Tensor, monitor: torch.Tensor | None) -> str:
    """sha256 of the configuration (minus budget/probe/checkpoint settings), the stored numbers
    the run starts from and the data."""
    h = hashlib.sha256()
    cfg = config.to_dict()
    for key in ("time_budget_s", "probe_steps", "checkpoint_every"):
        cfg.pop(key)
    h.update(json.dumps(cfg, sort_keys=True).encode())

    def put(t: torch.Tensor) -> None:
        h.update(t.detach().cpu().contiguous().numpy().tobytes())

    for name in sorted(records):
        rec = records[name]
        h.update(f"{name}|{type(rec).__name__}|".encode())
        if isinstance(rec, QuantizedWeight):
            put(rec.row_scales)
            put(rec.centroids)
            put(rec.labels[:, :1])
        else:
            put(rec.scales)
            put(rec.biases)
    for name in sorted(raw):
        t = raw[name]
        h.update(f"{name}|".encode())
        put(t.scales if isinstance(t, GroupAffine) else t.float())
    for ids in (windows, monitor):
        if ids is not None:
            put(ids.to(torch.int64))
    return h.hexdigest()[:32]


@dataclass
class TuneResult:
    """What :func:`tune_model` returns.

    Attributes:
        records, raw: the trained records and raw tensors (only the ones the run changed).
        total_steps: the run's planned steps; steps: steps taken (fewer when stopped early).
        resumed_from: steps taken from a checkpoint.
        best_step: the step whose state was kept (0 = the untouched start).
        stopped_early: the monitor's patience ran out.
        monitor_kl_before, monitor_kl_best: held-out KL of the start and of the kept state.
        monitor_kl_after: held-out KL of the folded model (what the artifact evaluates).
        monitor_history: ``[step, kl]`` of every monitor score.
        loss_history: training loss per step (nats per position; top-k coarsened when cached).
        parameters: trainable numbers by group.
        seconds, seconds_per_step, teacher_seconds: wall times of this call.
        probe: the probe's timing when the budget was in seconds.
        teacher_rest_mass: mean teacher probability outside the cached top k (None: not cached).
    """

    records: dict[str, Any]
    raw: dict[str, Any]
    total_steps: int
    steps: int
    resumed_from: int
    best_step: int
    stopped_early: bool
    monitor_kl_before: float | None
    monitor_kl_best: float | None
    monitor_kl_after: float | None
    monitor_history: list[list[float]]
    loss_history: list[float]
    parameters: dict[str, int]
    seconds: float
    seconds_per_step: float
    teacher_seconds: float
    probe: dict[str, float] = field(default_factory=dict)
    teacher_rest_mass: float | None = None

    def summary(self) -> dict[str, Any]:
        """JSON-ready summary (no tensors)."""
        hist = self.loss_history
        k = max(1, len(hist) // 10)
        return {
            "total_steps": self.total_steps, "steps": self.steps,
            "resumed_from": self.resumed_from, "best_step": self.best_step,
            "stopped_early": self.stopped_early,
            "monitor_kl_before": self.monitor_kl_before,
            "monitor_kl_best": self.monitor_kl_best,
            "monitor_kl_after": self.monitor_kl_after,
            "monitor_history": self.monitor_history,
            "train_kl_first_decile": sum(hist[:k]) / k if hist else None,
            "train_kl_last_decile": sum(hist[-k:]) / k if hist else None,
            "parameters": dict(self.parameters), "seconds": self.seconds,
            "seconds_per_step": self.seconds_per_step, "teacher_seconds": self.teacher_seconds,
            "probe": dict(self.probe), "teacher_rest_mass": self.teacher_rest_mass,
        }


def _group_of(name: str, att: Attached) -> str:
    owner, _, pname = name.partition(":")
    if owner in att.norms:
        return "norms"
    if pname == "bias":
        return "biases"
    if pname == "lam":
        return "row_scales"
    if pname == "gamma":
        return "centroids"
    mod = att.linears.get(owner) or att.embeddings.get(owner)
    return mod.kind if mod is not None else "other"


def tune_model(
    student: nn.Module,
    teacher: Any,
    records: Mapping[str, QuantizedWeight | Int4Weight],
    raw: Mapping[str, Any],
    windows: torch.Tensor,
    config: TuneConfig,
    *,
    monitor_windows: torch.Tensor | None = None,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    keep_checkpoint: bool = False,
    progress: bool = True,
    on_step: Callable[[int, float], None] | None = None,
) -> TuneResult:
    """Tune every continuous parameter of ``student`` by KL to ``teacher`` (module docstring).

    On return the student evaluates exactly the decode of the returned records and raw tensors.

    Args:
        student: the quantized model (its quantized linears and tables hold the stored decode);
            it runs on the device it lives on (bf16 autocast there on CUDA, f32 on the CPU).
        teacher: the reference model (same vocabulary). With ``teacher_topk > 0`` it is only
            used before training (its cache) and this function drops its reference then.
        records: module name → record (every quantized linear of ``student``).
        raw: every other stored tensor (tables as :class:`GroupAffine`, norms and biases dense).
        windows: int64 [N, T] training windows (calibration text).
        config: the settings.
        monitor_windows: int64 [M, T'] held-out windows (never trained on) that decide the kept
            state and early stopping; None trains to the budget and keeps the last state.
        checkpoint_dir: resumable run directory (removed after success unless
            ``keep_checkpoint``).
        progress: tqdm bars (stderr, with time estimates) for the teacher logits, composing the
            trainable model, the timing probe and the training steps.
        on_step: ``on_step(step, loss)`` after each optimizer step (tests).

    Returns:
        :class:`TuneResult`.
    """
    started = time.perf_counter()
    if windows.dim() != 2 or windows.dtype != torch.int64 or windows.shape[0] < 1:
        raise InvalidInput(
            f"tuning windows must be int64 [N >= 1, T], got {windows.dtype} {list(windows.shape)}"
        )
    if not records:
        raise InvalidInput("tune_model: no quantized records to tune")
    p0 = next(iter(student.parameters()), None)
    device = p0.device if p0 is not None else torch.device("cpu")
    on_cuda = device.type == "cuda"
    compute_dtype = torch.bfloat16 if on_cuda else torch.float32

    def amp() -> Any:
        return torch.autocast("cuda", dtype=torch.bfloat16) if on_cuda else nullcontext()

    student.requires_grad_(False)
    identity = run_identity(config, records, raw, windows, monitor_windows)
    ckpt = RowScaleCheckpoint(checkpoint_dir, identity) if checkpoint_dir is not None else None

    t0 = time.perf_counter()
    n_monitor = 0 if monitor_windows is None else int(monitor_windows.shape[0])
    n_teacher = (int(windows.shape[0]) if config.teacher_topk else 0) + n_monitor
    monitor_logits: list[torch.Tensor] = []
    shown = progress and n_teacher > 0
    with stage_bar("tune: teacher logits", n_teacher, "window", shown) as tbar:
        cache = (cache_teacher(teacher, windows, config.teacher_topk, config.temperature, amp,
                               bar=tbar)
                 if config.teacher_topk else None)
        for i in range(n_monitor):
            with torch.no_grad(), amp():
                monitor_logits.append(
                    model_logits(teacher, monitor_windows[i : i + 1]).float().cpu())
            tbar.update(1)
    teacher_seconds = time.perf_counter() - t0
    if cache is not None:
        teacher = None  # cached: the caller's placed copy can be freed during training

    @torch.no_grad()
    def score() -> float:
        total = 0.0
        for i, t_logits in enumerate(monitor_logits):
            with amp():
                s_logits = model_logits(student, monitor_windows[i : i + 1])
            total += float(kl_loss(t_logits, s_logits, temperature=config.temperature,
                                   chunk=config.kl_chunk))
        return total / len(monitor_logits)

    def loss_of(step: int) -> torch.Tensor:
        rows = batch_indices(windows.shape[0], step, config.batch, config.seed)
        ids = windows[rows]
        with amp():
            s_logits = model_logits(student, ids)
        if cache is not None:
            return topk_kl_loss(cache, rows, s_logits, temperature=config.temperature,
                                chunk=config.kl_chunk)
        with torch.no_grad(), amp():
            t_logits = model_logits(teacher, ids)
        return kl_loss(t_logits, s_logits, temperature=config.temperature, chunk=config.kl_chunk)

    n_tables = sum(isinstance(t, GroupAffine) for t in raw.values())
    with stage_bar("tune: composing the model", len(records) + n_tables, "matrix",
                   progress) as abar:
        att = attach(student, records, raw, config.groups, device, compute_dtype, bar=abar)
    probe: dict[str, float] = {}
    try:
        params = att.parameters()
        counts: dict[str, int] = {}
        for name, p in params.items():
            g = _group_of(name, att)
            counts[g] = counts.get(g, 0) + p.numel()
        nonneg = [p for n, p in params.items() if n.endswith((":lam", ":gamma"))]
        optimizer = torch.optim.AdamW(list(params.values()), lr=config.lr, betas=config.betas,
                                      weight_decay=config.weight_decay)

        def snapshot() -> dict[str, torch.Tensor]:
            return {n: p.detach().cpu().clone() for n, p in params.items()}

        def restore(values: Mapping[str, torch.Tensor]) -> None:
            with torch.no_grad():
                for n, v in values.items():
                    params[n].copy_(v.to(params[n].device))

        history: list[float] = []
        monitor_hist: list[list[float]] = []
        budget_start = time.perf_counter()  # the teacher's logits and composing come before it
        start_step, total_steps = 0, config.steps or None
        since_best, stopped = 0, False
        best: dict[str, Any] = {"step": 0, "kl": None, "params": None}
        if ckpt is not None and ckpt.step > 0:
            payload = ckpt.load()
            restore(payload["params"])
            optimizer.load_state_dict(payload["optimizer"])
            history, monitor_hist = list(payload["history"]), list(payload["monitor"])
            best, since_best = dict(payload["best"]), int(payload["since_best"])
            stopped = bool(payload["stopped"])
            start_step, total_steps = ckpt.step, ckpt.total_steps
            log.info("tune: resuming at step %d of %s", start_step, total_steps)
        elif monitor_logits:
            best = {"step": 0, "kl": score(), "params": snapshot()}
            monitor_hist.append([0, best["kl"]])
        monitor_before = monitor_hist[0][1] if monitor_hist else None

        if total_steps is None:  # probe: forward+backward without an update
            t_probe = time.perf_counter()
            with stage_bar("tune: timing probe", config.probe_steps, "step", progress) as pbar:
                for k in range(config.probe_steps):
                    loss_of(k).backward()
                    optimizer.zero_grad(set_to_none=True)
                    pbar.update(1)
            per = (time.perf_counter() - t_probe) / config.probe_steps
            left = config.time_budget_s - (time.perf_counter() - budget_start)
            # a monitor score costs about its windows' forwards: budget it in
            score_cost = per * 0.4 * len(monitor_logits) / max(1, config.batch)
            total_steps = max(1, int(left / max(1e-9, per + score_cost / config.monitor_every)))
            probe = {"seconds_per_step": per, "steps_from_budget": float(total_steps)}
            log.info("tune: probe %.3f s/step -> %d steps", per, total_steps)

        bar = stage_bar("tune", total_steps, "step", progress, initial=start_step)
        t_loop = time.perf_counter()
        done = start_step
        try:
            for step in range(start_step, total_steps):
                if stopped:
                    break
                for group in optimizer.param_groups:
                    group["lr"] = learning_rate(step, total_steps, config)
                loss = loss_of(step)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                with torch.no_grad():  # a row scale or a centroid cannot be negative
                    for p in nonneg:
                        p.clamp_(min=0.0)
                history.append(float(loss.detach()))
                if on_step is not None:
                    on_step(step, history[-1])
                done = step + 1
                if monitor_logits and (done % config.monitor_every == 0 or done == total_steps):
                    kl = score()
                    monitor_hist.append([done, kl])
                    if kl < best["kl"]:
                        best = {"step": done, "kl": kl, "params": snapshot()}
                        since_best = 0
                    else:
                        since_best += 1
                        stopped = bool(config.patience) and since_best >= config.patience
                if ckpt is not None and (done == total_steps or stopped or (
                        config.checkpoint_every and done % config.checkpoint_every == 0)):
                    ckpt.commit(done, total_steps, {
                        "params": snapshot(), "optimizer": optimizer.state_dict(),
                        "history": history, "monitor": monitor_hist, "best": best,
                        "since_best": since_best, "stopped": stopped,
                    })
                bar.update(1)
                post = {"kl": f"{history[-1]:.4f}"}
                if best["kl"] is not None:
                    post["held_out_best"] = f"{best['kl']:.4f}@{best['step']}"
                bar.set_postfix(post)
        finally:
            bar.close()
        per_step = (time.perf_counter() - t_loop) / max(1, done - start_step)
        if best["params"] is not None:
            restore(best["params"])
        new_records, new_raw = fold(att, records, raw)
    finally:
        detach(student, att)
    set_module_weights(student, new_records)
    set_raw(student, new_raw)
    after = score() if monitor_logits else None
    if ckpt is not None and not keep_checkpoint:
        ckpt.remove()
    return TuneResult(
        records=new_records, raw=new_raw, total_steps=total_steps, steps=done,
        resumed_from=start_step, best_step=int(best["step"]) if monitor_logits else done,
        stopped_early=stopped, monitor_kl_before=monitor_before,
        monitor_kl_best=best["kl"], monitor_kl_after=after, monitor_history=monitor_hist,
        loss_history=history, parameters=counts, seconds=time.perf_counter() - started,
        seconds_per_step=per_step, teacher_seconds=teacher_seconds, probe=probe,
        teacher_rest_mass=None if cache is None else float(cache.rest.exp().mean()),
    )
