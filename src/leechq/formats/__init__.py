"""Layer 2: representations and serialization (canonical quantized weights, artifacts, served layouts)."""
