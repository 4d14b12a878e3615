"""Layer 6: quality evaluation (perplexity, KL divergence, task loaders)."""
