"""Layer 1: codebooks over the lattice core, selected by name.

``leechq.codebooks.get("ball")`` returns the Λ24(12) ball codebook (47-bit v1 index,
docs/codebooks.md §2); ``get("tetra")`` returns the Tetra codebook (docs/codebooks.md). Both satisfy
:class:`leechq.codebooks.base.Codebook`. Instances are built lazily on first ``get``.
"""

from __future__ import annotations

from leechq.codebooks.base import BLOCK, Codebook
from leechq.registry import Registry

REGISTRY: Registry[Codebook] = Registry("codebook")


def get(name: str) -> Codebook:
    """Return the codebook registered under ``name`` ("ball" or "tetra")."""
    _register_builtins()
    return REGISTRY.get(name)


def names() -> list[str]:
    """Names of the available codebooks."""
    _register_builtins()
    return REGISTRY.names()


_registered = False


def _register_builtins() -> None:
    global _registered
    if _registered:
        return
    _registered = True
    import importlib

    for module, name, factory in (
        ("leechq.codebooks.ball", "ball", "BallCodebook"),
        ("leechq.codebooks.tetra", "tetra", "TetraCodebook"),
    ):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:  # a codebook module not written yet
            if exc.name != module:
                raise
            continue
        REGISTRY.register(name, getattr(mod, factory))


__all__ = ["BLOCK", "REGISTRY", "Codebook", "get", "names"]
