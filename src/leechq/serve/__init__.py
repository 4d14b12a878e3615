"""Layer 6: inference (generation loop, static KV cache, CUDA graphs, chat)."""
