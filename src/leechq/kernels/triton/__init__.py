"""Triton kernels; only modules under this package may import triton."""
