"""CUDA-graph capture of the decode step (docs/architecture.md §3; issue 6).

The decode step is a closure over static buffers (token, slot, caches, sampler values) that reads
and writes only those buffers and never synchronises with the host, so one captured graph replays
every token of a generation. Capture follows the documented recipe: warm up on a side stream (kernel
selection, ``torch.compile`` and Triton JIT happen there), then record. Warm-up executes the step,
so the caller passes ``restore`` to put its small state buffers back afterwards; cache slots written
by the warm-up are rewritten before anything reads them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from leechq.errors import InvalidInput


class CapturedStep:
    """A step function captured in a CUDA graph; calling it replays the graph.

    Args:
        step: the step (reads/writes static buffers only; no host synchronisation).
        restore: puts the state buffers back after the warm-up runs.
        pool: a memory pool handle shared with other graphs of the same engine (or None).
        warmup: eager runs on a side stream before capture (≥ 1; compilation happens in the first).
    """

    def __init__(
        self,
        step: Callable[[], Any],
        restore: Callable[[], None],
        pool: Any = None,
        warmup: int = 2,
    ) -> None:
        if not torch.cuda.is_available():
            raise InvalidInput("CUDA graphs need a CUDA device; this process has none")
        if warmup < 1:
            raise InvalidInput(f"CUDA-graph capture needs at least one warm-up run, got {warmup}")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                step()
        torch.cuda.current_stream().wait_stream(side)
        restore()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            step()
        restore()
        torch.cuda.synchronize()

    def __call__(self) -> None:
        self.graph.replay()


def graph_pool() -> Any:
    """A fresh memory-pool handle for graphs that may share memory (they never run concurrently)."""
    return torch.cuda.graph_pool_handle()
