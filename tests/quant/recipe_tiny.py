"""Helpers of the recipe tests: a tiny random model quantized with the stand-in codebook.

Shared by test_row_scales.py, test_sensitivity.py and test_recipe.py. No download; seconds on a CPU.
"""

from __future__ import annotations

import copy
import functools
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from leechq_tiny import tiny_model
from standin_codebook import register

from leechq.config import QuantConfig

VOCAB = 96


def windows(n: int, seq: int = 24, seed: int = 0) -> torch.Tensor:
    """Random token windows int64 [n, seq] of the tiny vocabulary."""
    return torch.randint(0, VOCAB, (n, seq), generator=torch.Generator().manual_seed(seed))


def config(**kw: Any) -> QuantConfig:
    """A stand-in-codebook config for 4 calibration windows of 24 tokens on the CPU."""
    base: dict[str, Any] = dict(
        codebook=register(), calib_windows=4, calib_window_len=24, calib_batch=2, device="cpu"
    )
    base.update(kw)
    return QuantConfig(**base)


def quantize_fn(model: Any, calib: torch.Tensor, cfg: QuantConfig) -> Any:
    """``run_recipe``'s encoder: the models-layer glue without a progress bar."""
    from leechq.models.quantize import quantize_model_in_place

    return quantize_model_in_place(model, calib, cfg, progress=False)


@functools.cache
def _quantized(arch: str, seed: int) -> tuple[Any, Any, Any]:
    reference = tiny_model(arch, seed=seed)
    student = copy.deepcopy(reference)
    enc = quantize_fn(student, windows(4, seed=seed + 100), config())
    return reference, student, enc


def quantized(arch: str = "llama", seed: int = 0) -> tuple[Any, Any, Any]:
    """``(reference, student, encoding)``: a tiny model and its stand-in quantization (fresh
    copies of a cached run, so tests may modify them)."""
    return copy.deepcopy(_quantized(arch, seed))


def logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


class _Shifted(torch.nn.Embedding):
    """An embedding whose forward does more than a lookup (tuning cannot compose it)."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return super().forward(ids) + 1.0


def shift_embedding(model: Any) -> None:
    """Replace ``model.model.embed_tokens`` by a shifted embedding sharing its weight (a tied head
    stays tied) and its ``embed_scale``."""
    old = model.model.embed_tokens
    new = _Shifted(*old.weight.shape)
    new.weight = old.weight
    if hasattr(old, "embed_scale"):
        new.embed_scale = old.embed_scale
    model.model.embed_tokens = new
