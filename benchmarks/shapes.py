"""Linear-layer shapes of the target models (decode benchmarks; never collected by pytest).

Each model lists its per-layer projections ``(name, d_out, d_in)`` in execution order and the
groups that read one input (q|k|v, gate|up), from the published configs: Qwen3-4B (36 layers, hidden
2560, intermediate 9728, 32 query / 8 KV heads of 128), Qwen3-8B (36 layers, 4096 / 12288, 32 / 8
heads), Qwen3-14B (40 layers, 5120 / 17408, 40 / 8 heads), Llama-3-8B (32 layers, 4096 / 14336,
32 / 8 heads). The output head and embeddings are not part of the 7-per-layer projection pass.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Model:
    """Projection shapes of one decoder model."""

    name: str
    layers: int
    hidden: int
    intermediate: int
    q_heads: int
    kv_heads: int
    head_dim: int = 128

    def linears(self) -> list[tuple[str, int, int]]:
        """One layer's projections ``(name, d_out, d_in)`` in execution order."""
        q = self.q_heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        h, i = self.hidden, self.intermediate
        return [("q", q, h), ("k", kv, h), ("v", kv, h), ("o", h, q), ("gate", i, h), ("up", i, h),
                ("down", h, i)]

    def groups(self) -> list[list[str]]:
        """Projections that read the same input (fused into one launch)."""
        return [["q", "k", "v"], ["o"], ["gate", "up"], ["down"]]

    def n_linears(self) -> int:
        return 7 * self.layers

    def n_params(self) -> int:
        return self.layers * sum(o * i for _, o, i in self.linears())


MODELS = {
    "qwen3-4b": Model("qwen3-4b", 36, 2560, 9728, 32, 8),
    "qwen3-8b": Model("qwen3-8b", 36, 4096, 12288, 32, 8),
    "qwen3-14b": Model("qwen3-14b", 40, 5120, 17408, 40, 8),
    "llama-3-8b": Model("llama-3-8b", 32, 4096, 14336, 32, 8),
}

BATCHES = (1, 8)
