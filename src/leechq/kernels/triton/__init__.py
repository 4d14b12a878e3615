"""Triton kernels; only modules under this package import triton, and only when a kernel is used.

Modules: ``tetra48`` (fused Tetra decode + matvec, and the no-weights control), ``planes14`` (fused
ball-record decode + matvec), ``activation`` (rotation ``Q x`` and the prepared activation layout),
``intq`` (int4/int8 matvec and embedding rows), ``_bits`` (byte permutes, magic-number floats),
``ops`` (host wrappers with input checks), ``introspect`` (AOT compile + SASS instruction counts).
"""


def available() -> bool:
    """True when triton can be imported (does not import it)."""
    import importlib.util

    return importlib.util.find_spec("triton") is not None
