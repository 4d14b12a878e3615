"""Test helper: tiny artifacts whose embedding (and untied head) are stored as 4/8-bit group-affine
tables, and the dense model the old loader built from them (every table dequantized)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"


def packed_artifact(
    tmp: Path, arch: str, embed_bits: int, head_bits: int | None = None, group: int = 64
) -> tuple[Path, Any]:
    """A tiny artifact of :func:`leechq_tiny.tiny_model` with a group-affine embedding.

    Args:
        tmp: parent directory.
        arch: "llama"/"qwen2" (tied head), "qwen3" (untied head), or "gemma2"/"gemma3" (tied,
            √dim-scaled embedding; :func:`leechq_tiny.family_model`).
        embed_bits: 4 or 8 for the embedding table.
        head_bits: 4 or 8 for an untied head table; None keeps an untied head dense.
        group: columns per scale/bias group.

    Returns:
        ``(directory, dense model holding the artifact's tensors dequantized)``: the dense model
        is what ``leechq.load`` returned before tables were kept packed.
    """
    from leechq_tiny import family_model, quantize_randomly, tiny_model, tiny_tokenizer

    from leechq.config import QuantConfig
    from leechq.formats.artifact import GroupAffine, read_artifact, write_artifact
    from leechq.models.save import raw_tensors

    dense = family_model(arch) if arch.startswith("gemma") else tiny_model(arch)
    records = quantize_randomly(dense)
    raw, tied = raw_tensors(dense, {})
    raw = {k: v for k, v in raw.items() if not (k.endswith(".weight") and k[:-7] in records)}
    raw[EMBED] = GroupAffine.quantize(raw[EMBED], embed_bits, group)
    if head_bits is not None and HEAD in raw:
        raw[HEAD] = GroupAffine.quantize(raw[HEAD], head_bits, group)
    out = write_artifact(
        tmp / f"{arch}-e{embed_bits}-h{head_bits}",
        base_config=dense.config.to_dict(),
        quant_config=QuantConfig(codebook="tetra", embedding_encoding=f"int{embed_bits}",
                                 int4_modules=("self_attn.v_proj",), embedding_group=group),
        records=records,
        raw=raw,
        tied=tied,
        tokenizer=tiny_tokenizer(),
    )
    dense.load_state_dict(read_artifact(out).dense_state_dict(), strict=True)
    return out, dense.eval()
