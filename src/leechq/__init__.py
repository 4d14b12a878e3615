"""leechq: Leech-lattice 2-bit weight quantization for LLMs.

Importing this package is cheap: it imports neither torch, triton nor transformers and never
initializes CUDA. Sub-packages (``leechq.lattice``, ``leechq.codebooks``, ...) are imported on first
attribute access.
"""

from __future__ import annotations

import importlib
from typing import Any

from leechq._version import __version__

_SUBPACKAGES = {
    "lattice", "codebooks", "quant", "formats", "data", "kernels", "nn", "models", "serve", "eval",
    "integrations", "cli", "utils", "errors", "registry",
}
_LAZY_ATTRS: dict[str, tuple[str, str]] = {
    # The curated public API (docs/architecture.md §1); each is imported on first access.
    "load": ("leechq.models.load", "load"),
    "quantize_model": ("leechq.models.quantize", "quantize_model"),
    "QuantConfig": ("leechq.config", "QuantConfig"),
    "LeechqLinear": ("leechq.nn.linear", "LeechqLinear"),
}

__all__ = ["__version__", *sorted(_LAZY_ATTRS), *sorted(_SUBPACKAGES)]


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"leechq.{name}")
    if name in _LAZY_ATTRS:
        module, attr = _LAZY_ATTRS[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'leechq' has no attribute {name!r}")
