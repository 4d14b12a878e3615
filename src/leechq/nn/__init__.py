"""Layer 4: torch modules (the quantized linear and module replacement)."""
