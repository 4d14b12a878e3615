"""Facts read off model modules that several layers need (no torch import of its own)."""

from __future__ import annotations

from typing import Any

from leechq.errors import ArtifactError


def embedding_scale(module: Any) -> float:
    """The factor a (scaled) word-embedding module multiplies its rows by: transformers' Gemma
    embeddings keep it as ``scalar_embed_scale`` (a float) and the ``embed_scale`` buffer; 1.0 for a
    plain embedding (or None).

    Raises:
        ArtifactError: the module has an ``embed_scale`` whose value cannot be read (meta device).
    """
    scalar = getattr(module, "scalar_embed_scale", None)
    if scalar is not None:
        return float(scalar)
    buf = getattr(module, "embed_scale", None)
    if buf is None:
        return 1.0
    if hasattr(buf, "item"):  # a tensor
        if buf.device.type == "meta":
            raise ArtifactError(f"cannot read the embedding scale of {type(module).__name__} "
                                "on the meta device")
        return float(buf.item())
    return float(buf)
