"""Per-matrix sensitivity on calibration text, and the greedy int4 choice under a bit budget.

Implements the selection side of docs/quantizer.md §7 (step 3 of the full-model
recipe: "store the matrices that lose most in int4, paid for by 4-bit embedding tables"). The
reference chose its int4 sets (v_proj; v/o/down of a layer range) by hand from MMLU A/Bs; here the
choice is measured and recorded:

* **sensitivity** (:func:`measure_swaps`): with the model in a base state (e.g. every projection on
  the lattice), one matrix at a time is swapped to an alternative dense weight (e.g. its int4
  decode), the mean KL(teacher ‖ model) over fixed *calibration* windows is measured, and the
  matrix is swapped back. ``gain = KL(base) − KL(swapped)`` is the output-error reduction of that
  one change, with every other matrix as it will be served ("restore" mode). The same function
  measures the converse ("isolate" mode: base = the reference, swap = the lattice decode, and
  ``−gain`` is the KL one quantized matrix causes). Never run it on the evaluation split.
* **selection** (:func:`select_under_budget`): greedy by ``gain / extra_bits`` (extra served bits
  of the int4 record over the lattice one), skipping non-positive gains, until the budget is spent.
  Gains are treated as additive — an approximation the held-out evaluation of the chosen set checks.

Everything here is model-agnostic: a model is any ``nn.Module`` whose matrices are reachable by
name and hold a ``weight`` tensor, called on ``int64 [B, T]`` ids (see
:func:`leechq.quant.row_scales.model_logits`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from leechq.errors import InvalidInput
from leechq.quant.row_scales import kl_loss, model_logits

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


@torch.no_grad()
def _kl(
    model: Any, windows: torch.Tensor, cache: list[torch.Tensor], batch: int, chunk: int
) -> float:
    total = 0.0
    for i, start in enumerate(range(0, windows.shape[0], batch)):
        ids = windows[start : start + batch]
        total += float(kl_loss(cache[i], model_logits(model, ids), chunk=chunk)) * ids.shape[0]
    return total / windows.shape[0]


def measure_swaps(
    model: nn.Module,
    teacher: Any,
    windows: torch.Tensor,
    swaps: Mapping[str, torch.Tensor],
    *,
    batch: int = 1,
    chunk: int = 256,
    progress: Callable[[int, int, str], None] | None = None,
) -> dict[str, SwapMeasurement]:
    """Mean KL to the teacher with each matrix of ``swaps`` swapped in alone.

    Args:
        model: the model in its base state (left unchanged on return, also on error).
        teacher: the reference model.
        windows: int64 [N, T] calibration windows (never the evaluation split).
        swaps: module name → dense weight [d_out, d_in] to try in place of that module's weight.
        batch: windows per forward.
        chunk: positions per KL chunk.
        progress: called as ``progress(i, n, name)`` before each measurement.

    Returns:
        name → :class:`SwapMeasurement` (same order as ``swaps``).
    """
    if windows.dim() != 2 or windows.dtype != torch.int64:
        raise InvalidInput(
            f"windows must be int64 [N, T], got {windows.dtype} {list(windows.shape)}"
        )
    modules = {}
    for name, w in swaps.items():
        module = model.get_submodule(name)
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != tuple(w.shape):
            raise InvalidInput(
                f"swap for {name}: module weight {None if weight is None else list(weight.shape)}"
                f" vs swap {list(w.shape)}"
            )
        modules[name] = module
    cache = teacher_logits_cache(teacher, windows, batch)
    base = _kl(model, windows, cache, batch, chunk)
    out: dict[str, SwapMeasurement] = {}
    for i, (name, w) in enumerate(swaps.items()):
        if progress is not None:
            progress(i, len(swaps), name)
        weight = modules[name].weight
        saved = weight.detach().clone()
        t0 = time.perf_counter()
        try:
            with torch.no_grad():
                weight.copy_(w.to(device=weight.device, dtype=weight.dtype))
            swapped = _kl(model, windows, cache, batch, chunk)
        finally:
            with torch.no_grad():
                weight.copy_(saved)
        out[name] = SwapMeasurement(name, base, swapped, time.perf_counter() - t0)
        log.info("sensitivity %s: KL %.5f -> %.5f", name, base, swapped)
    return out


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
