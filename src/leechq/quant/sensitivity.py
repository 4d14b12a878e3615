"""Per-matrix sensitivity on calibration text, and the greedy int4 choice under a bit budget.

Implements the selection side of docs/quantizer.md §7 (step 3 of the full-model
recipe: "store the matrices that lose most in int4, paid for by 4-bit embedding tables"). The
reference chose its int4 sets (v_proj; v/o/down of a layer range) by hand from MMLU A/Bs; here the
choice is measured and recorded:

* **sensitivity** (:func:`measure_swaps`): with the model in a base state (e.g. every projection on
  the lattice), one matrix at a time is swapped to an alternative dense weight (e.g. its int4
  decode) and the mean KL(teacher ‖ model) over fixed *calibration* windows is measured. The
  probes are batched: several candidates share one forward, each on its own copy of the windows
  (a forward hook recomputes that copy's rows of the candidate's module with the swapped weight),
  so the model's weights are never modified. ``gain = KL(base) − KL(swapped)`` is the
  output-error reduction of that one change, with every other matrix as it will be served
  ("restore" mode). The same function measures the converse ("isolate" mode: base = the
  reference, swap = the lattice decode, and ``−gain`` is the KL one quantized matrix causes).
  Never run it on the evaluation split. With a checkpoint (:class:`MeasurementCheckpoint`) the
  measurements so far survive a kill and a second run measures only the rest.
* **selection** (:func:`select_under_budget`): greedy by ``gain / extra_bits`` (extra served bits
  of the int4 record over the lattice one), skipping non-positive gains, until the budget is spent.
  Gains are treated as additive — an approximation the held-out evaluation of the chosen set checks.

Everything here is model-agnostic: a model is any ``nn.Module`` whose matrices are reachable by
name and hold a ``weight`` tensor, called on ``int64 [B, T]`` ids (see
:func:`leechq.quant.row_scales.model_logits`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from leechq.errors import ArtifactError, InvalidInput
from leechq.quant.row_scales import _atomic_bytes, kl_loss, model_logits
from leechq.utils.progress import stage_bar

log = logging.getLogger("leechq.quant")


@dataclass(frozen=True)
class SwapMeasurement:
    """The effect of swapping one matrix.

    Attributes:
        name: module name.
        kl_base: mean KL(teacher ‖ model) with the base weights.
        kl_swapped: the same with only this matrix swapped.
        seconds: time of the measurement.
    """

    name: str
    kl_base: float
    kl_swapped: float
    seconds: float

    @property
    def gain(self) -> float:
        """``kl_base − kl_swapped`` (positive: the swap lowers the output error)."""
        return self.kl_base - self.kl_swapped


@dataclass(frozen=True)
class Candidate:
    """One matrix that may change representation.

    Attributes:
        name: module name.
        gain: measured benefit of the change (KL nats; larger is better).
        extra_bits: served bits the change adds (may be scaled by the caller, e.g. for projected
            full-depth accounting).
        weights: the matrix's parameter count (for reports).
    """

    name: str
    gain: float
    extra_bits: float
    weights: int

    @property
    def efficiency(self) -> float:
        """Gain per extra bit (``inf`` for a free change with a positive gain)."""
        if self.extra_bits <= 0:
            return float("inf") if self.gain > 0 else float("-inf")
        return self.gain / self.extra_bits


@dataclass
class Selection:
    """The result of :func:`select_under_budget`.

    Attributes:
        chosen: names in the order they were taken.
        budget_bits: the budget.
        spent_bits: extra bits of the chosen changes.
        predicted_gain: sum of their gains (additive model).
        skipped_nonpositive: candidates whose measured gain was ≤ 0.
        rejected_over_budget: positive candidates that did not fit.
    """

    chosen: list[str]
    budget_bits: float
    spent_bits: float
    predicted_gain: float
    skipped_nonpositive: list[str]
    rejected_over_budget: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        """One line: what was taken, and why the rest was not (gain ≤ 0, or over the budget)."""
        return (f"{len(self.chosen)} taken, {len(self.skipped_nonpositive)} with gain <= 0 "
                f"skipped, {len(self.rejected_over_budget)} over the budget; "
                f"{self.spent_bits / 1e6:.2f} of {self.budget_bits / 1e6:.2f} Mbit spent")


def teacher_logits_cache(
    teacher: Any, windows: torch.Tensor, batch: int = 1
) -> list[torch.Tensor]:
    """Teacher logits of every batch of ``windows``, kept on the CPU in float32.

    Memory: ``N·T·V·4`` bytes; keep the sensitivity set small.
    """
    out = []
    with torch.no_grad():
        for start in range(0, windows.shape[0], batch):
            out.append(model_logits(teacher, windows[start : start + batch]).float().cpu())
    return out


def _users(model: nn.Module, param: torch.Tensor) -> list[nn.Module]:
    """Every module of ``model`` whose ``weight`` is ``param`` (a tied head and its embedding)."""
    return [m for _, m in model.named_modules(remove_duplicate=False)
            if getattr(m, "weight", None) is param]


def _row_hook(rows: slice, weight: torch.Tensor) -> Callable[..., torch.Tensor]:
    """A forward hook that recomputes rows ``rows`` of a Linear/Embedding output with ``weight``."""

    def hook(module: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> torch.Tensor:
        x = args[0][rows]
        if isinstance(module, nn.Embedding):
            alt = F.embedding(x, weight, module.padding_idx)
        else:
            alt = F.linear(x, weight, getattr(module, "bias", None))
        out = out.clone()
        out[rows] = alt.to(out.dtype)
        return out

    return hook


def _layer_stack(model: nn.Module) -> tuple[str, nn.ModuleList] | None:
    """The model's longest ``nn.ModuleList`` (its decoder layers), or None."""
    best: tuple[str, nn.ModuleList] | None = None
    for name, m in model.named_modules():
        if isinstance(m, nn.ModuleList) and len(m) > (len(best[1]) if best else 1):
            best = (name, m)
    return best


def _repeat(out: Any, times: int) -> Any:
    if times == 1:
        return out
    if isinstance(out, torch.Tensor):
        return out.repeat(times, *([1] * (out.dim() - 1)))
    return (_repeat(out[0], times), *out[1:])


class _Replay(nn.Module):
    """Stands in for a decoder layer: returns that layer's recorded output for the current batch
    (the probes of a matrix in layer ℓ replay layers 0..ℓ-1, which the swap cannot change)."""

    def __init__(self, layer: nn.Module, outputs: list[Any]) -> None:
        super().__init__()
        object.__setattr__(self, "_layer", layer)
        self.outputs = outputs
        self.batch = 0
        self.times = 1

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:  # attributes the parent model reads (e.g. attention_type)
            return getattr(object.__getattribute__(self, "_layer"), name)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return _repeat(self.outputs[self.batch], self.times)


@torch.no_grad()
def _pass_kl(
    model: nn.Module,
    windows: torch.Tensor,
    cache: list[torch.Tensor],
    batch: int,
    chunk: int,
    group: Sequence[tuple[list[nn.Module], torch.Tensor] | None],
    stack: nn.ModuleList | None = None,
    recorded: list[list[Any]] | None = None,
    skip: int = 0,
) -> list[float]:
    """Mean KL of each entry of ``group`` (None = the model as it is), all in the same forwards:
    the windows are repeated once per entry and each entry's rows see only its own swap.

    With ``stack`` (the decoder layers): ``skip > 0`` replays the first ``skip`` layers from
    ``recorded`` (per layer, per batch); ``skip == 0`` with an empty ``recorded`` records them.
    """
    n_rows = len(group)
    totals = [0.0] * n_rows
    replays: list[_Replay] = []
    record = stack is not None and recorded is not None and skip == 0 and not recorded[0]
    if stack is not None and recorded is not None and skip > 0:
        for j in range(skip):
            replays.append(_Replay(stack[j], recorded[j]))
            stack[j] = replays[-1]
    try:
        for i, start in enumerate(range(0, windows.shape[0], batch)):
            ids = windows[start : start + batch]
            b = ids.shape[0]
            for r in replays:
                r.batch, r.times = i, n_rows
            handles = []
            try:
                for j, entry in enumerate(group):
                    if entry is None:
                        continue
                    users, w = entry
                    for m in users:
                        hook = _row_hook(slice(j * b, (j + 1) * b), w)
                        handles.append(m.register_forward_hook(hook))
                if record:
                    for j, layer in enumerate(stack):
                        handles.append(layer.register_forward_hook(
                            lambda mod, args, out, j=j: recorded[j].append(out)))
                logits = model_logits(model, ids.repeat(n_rows, 1))
            finally:
                for h in handles:
                    h.remove()
            for j in range(n_rows):
                part = logits[j * b : (j + 1) * b]
                totals[j] += float(kl_loss(cache[i], part, chunk=chunk)) * b
    finally:
        for j, r in enumerate(replays):
            stack[j] = object.__getattribute__(r, "_layer")
    return [t / windows.shape[0] for t in totals]


def measure_swaps(
    model: nn.Module,
    teacher: Any,
    windows: torch.Tensor,
    swaps: Mapping[str, torch.Tensor],
    *,
    batch: int | None = None,
    swaps_per_pass: int | None = None,
    max_logit_bytes: int = 1 << 29,
    chunk: int = 256,
    progress: bool = False,
    checkpoint: str | os.PathLike[str] | None = None,
) -> dict[str, SwapMeasurement]:
    """Mean KL to the teacher with each matrix of ``swaps`` swapped in alone.

    The probes are batched: each forward carries ``batch`` windows once per candidate of a group
    of ``swaps_per_pass`` candidates, and a forward hook on each candidate's module (on every
    module sharing its weight: a tied head too) recomputes only that candidate's rows with the
    swapped weight. The model's weights are never modified. The base pass records the output of
    every decoder layer (the model's longest ``nn.ModuleList``); a probe of a matrix in layer ℓ
    replays layers 0..ℓ-1 from that record instead of computing them.

    Args:
        model: the model in its base state (unchanged on return).
        teacher: the reference model.
        windows: int64 [N, T] calibration windows (never the evaluation split).
        swaps: module name → dense weight (shape of that module's weight) to try in its place;
            the module must be an ``nn.Linear`` or ``nn.Embedding``.
        batch: windows per forward (None: all of them).
        swaps_per_pass: candidates per forward (None: as many as keep the logits of one forward
            within ``max_logit_bytes`` in f32, at most 8).
        max_logit_bytes: the logits budget of one forward when ``swaps_per_pass`` is None.
        chunk: positions per KL chunk.
        progress: show a tqdm bar (stderr) with a time estimate, up from the teacher's logits on.
        checkpoint: a JSON file that keeps the measurements made so far, rewritten after every
            pass (:class:`MeasurementCheckpoint`): a run cut off and started again measures only
            the candidates it lacks. The caller names one file per base model, teacher, windows
            and swaps (their identity is the caller's to encode in the name); the file records
            the windows' digest and the candidates and refuses others.

    Returns:
        name → :class:`SwapMeasurement` (same order as ``swaps``); ``seconds`` is the candidate's
        share of its pass. Resumed from ``checkpoint``, every measurement keeps the base KL of the
        first run (the base pass is repeated for its layer record only).
    """
    if windows.dim() != 2 or windows.dtype != torch.int64:
        raise InvalidInput(
            f"windows must be int64 [N, T], got {windows.dtype} {list(windows.shape)}"
        )
    entries: dict[str, tuple[list[nn.Module], torch.Tensor]] = {}
    for name, w in swaps.items():
        module = model.get_submodule(name)
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != tuple(w.shape):
            raise InvalidInput(
                f"swap for {name}: module weight {None if weight is None else list(weight.shape)}"
                f" vs swap {list(w.shape)}"
            )
        users = _users(model, weight)
        bad = [type(m).__name__ for m in users if not isinstance(m, (nn.Linear, nn.Embedding))]
        if bad:
            raise InvalidInput(f"swap for {name}: its weight is used by {bad} (Linear/Embedding "
                               "only)")
        entries[name] = (users, w.to(device=weight.device, dtype=weight.dtype))
    batch = windows.shape[0] if batch is None else max(1, int(batch))
    names = list(entries)
    saved = None if checkpoint is None else MeasurementCheckpoint(checkpoint, windows, names)
    done: dict[str, SwapMeasurement] = {} if saved is None else saved.load()
    # the bar is up from the start: the teacher's logits and the base pass come first
    bar = stage_bar("int4 sensitivity", len(names), "matrix", progress, initial=len(done))
    if len(done) == len(names):  # all of them kept: no pass at all
        bar.close()
        return {n: done[n] for n in names}
    bar.set_postfix_str("teacher logits")
    cache = teacher_logits_cache(teacher, windows, batch)
    if swaps_per_pass is None:
        per_copy = 4 * batch * windows.shape[1] * (cache[0].shape[-1] if cache else 1)
        swaps_per_pass = max(1, min(8, max_logit_bytes // max(1, per_copy)))
    found = _layer_stack(model)
    stack = found[1] if found is not None else None
    recorded: list[list[Any]] | None = [[] for _ in stack] if stack is not None else None

    def layer_of(name: str) -> int:
        if found is None:
            return 0
        head = found[0] + "." if found[0] else ""
        rest = name[len(head):] if name.startswith(head) else ""
        idx = rest.split(".", 1)[0]
        return int(idx) if idx.isdigit() and int(idx) < len(stack) else 0

    layer = {n: layer_of(n) for n in names}
    order = sorted((n for n in names if n not in done),
                   key=lambda n: layer[n])  # groups of similar depth skip the most
    try:
        bar.set_postfix_str("base pass")
        base = _pass_kl(model, windows, cache, batch, chunk, [None], stack, recorded)[0]
        if done:  # resumed: one base for every gain
            base = next(iter(done.values())).kl_base
        for g0 in range(0, len(order), swaps_per_pass):
            group = order[g0 : g0 + swaps_per_pass]
            skip = min(layer[n] for n in group) if stack is not None else 0
            t0 = time.perf_counter()
            kls = _pass_kl(model, windows, cache, batch, chunk, [entries[n] for n in group],
                           stack, recorded, skip)
            share = (time.perf_counter() - t0) / len(group)
            for name, kl in zip(group, kls, strict=True):
                done[name] = SwapMeasurement(name, base, kl, share)
                log.info("sensitivity %s: KL %.5f -> %.5f", name, base, kl)
            if saved is not None:
                saved.save(done)
            bar.set_postfix_str(group[-1])
            bar.update(len(group))
    finally:
        bar.close()
    out = {n: done[n] for n in names}
    return out


class MeasurementCheckpoint:
    """The measurements of one :func:`measure_swaps` run so far, in one JSON file.

    The file holds the windows' digest, the candidate names and, per measured candidate, the base
    KL, its swapped KL and its time. It is replaced atomically (written beside, synced, then
    renamed, as the row-scale checkpoint's files), so a kill leaves the previous pass's state. A
    file of other windows or other candidates is refused.

    Args:
        path: the file (its folder is created).
        windows: the probes' int64 [N, T] windows.
        names: every candidate of the run.
    """

    def __init__(self, path: str | os.PathLike[str], windows: torch.Tensor,
                 names: Sequence[str]) -> None:
        from leechq.quant.calibration import token_digest

        self.path = Path(path)
        self.identity = {"windows": token_digest(windows), "names": sorted(names)}

    def load(self) -> dict[str, SwapMeasurement]:
        """The measurements kept (empty when the file does not exist)."""
        if not self.path.exists():
            return {}
        try:
            state = json.loads(self.path.read_text(encoding="utf-8"))
            same = {k: state[k] for k in self.identity} == self.identity
            done = {n: SwapMeasurement(n, float(b), float(k), float(s))
                    for n, (b, k, s) in state["done"].items()}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ArtifactError(f"sensitivity checkpoint {self.path} is unreadable: {exc}") from exc
        if not same or not set(done) <= set(self.identity["names"]):
            raise InvalidInput(f"sensitivity checkpoint {self.path} holds the measurements of "
                               "other windows or other candidates; remove it or name another")
        return done

    def save(self, done: Mapping[str, SwapMeasurement]) -> None:
        """Replace the file with ``done``."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        state = {**self.identity,
                 "done": {n: [m.kl_base, m.kl_swapped, m.seconds] for n, m in done.items()}}
        _atomic_bytes(self.path, json.dumps(state).encode())


def select_under_budget(candidates: Sequence[Candidate], budget_bits: float) -> Selection:
    """Greedy knapsack: take candidates by decreasing gain per extra bit while they fit.

    Candidates with a non-positive gain are never taken. Ties break by name (deterministic).
    A candidate that does not fit is skipped and cheaper ones are still tried.

    Args:
        candidates: the options.
        budget_bits: extra bits available (≤ 0 takes only free positive changes).

    Returns:
        :class:`Selection`.
    """
    names = [c.name for c in candidates]
    if len(set(names)) != len(names):
        raise InvalidInput("select_under_budget: duplicate candidate names")
    positive = [c for c in candidates if c.gain > 0]
    skipped = sorted(c.name for c in candidates if c.gain <= 0)
    order = sorted(positive, key=lambda c: (-c.efficiency, c.name))
    chosen: list[str] = []
    rejected: list[str] = []
    spent = 0.0
    gain = 0.0
    for c in order:
        if spent + max(0.0, c.extra_bits) <= budget_bits or c.extra_bits <= 0:
            chosen.append(c.name)
            spent += c.extra_bits
            gain += c.gain
        else:
            rejected.append(c.name)
    return Selection(chosen, float(budget_bits), spent, gain, skipped, rejected)
