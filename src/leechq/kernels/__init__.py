"""Layer 3: compute on packed layouts (reference twins in torch, Triton kernels, kernel selection)."""
