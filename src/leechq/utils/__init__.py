"""Small helpers importable from every layer (no torch, triton or transformers at import)."""
