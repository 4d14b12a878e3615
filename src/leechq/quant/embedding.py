"""A token embedding table coded on the lattice (``embedding_encoding = "lattice"``).

A lookup table has no input statistics, so every coordinate of a row weighs the same: the table
is coded like a projection whose Hessian is the identity — rotated, each 24-column block coded by
the configured codebook and gain bits (shape–gain, row scales and gain centroids fitted as for a
projection, docs/quantizer.md), with no error feedback (GPTQ with an identity Hessian has none).
The rotation is the first block's attention-input rotation (``rotation_seed(0, 0, base)``): the
embedding's width is that input's, so the artifact stores one table for both.

Measured (qwen2.5-coder-0.5b, every other tensor the reference's, ``benchmarks/
table_sensitivity.py``): the embedding at 2.16 b/w costs KL +0.013 / +0.030 nats over the 4-bit
table (4.5 b/w); a head (or a tied table, which is the head too) costs four to ten times as much,
so only an untied embedding is coded this way.
"""

from __future__ import annotations

import torch

from leechq.config import QuantConfig
from leechq.errors import InvalidInput
from leechq.formats.quantized_weight import QuantizedWeight
from leechq.formats.rotation import generate_rotation, rotation_seed
from leechq.quant.gptq import gptq_quantize
from leechq.quant.layerwise import make_coder, resolve_device


def encode_embedding(weight: torch.Tensor, config: QuantConfig,
                     name: str = "embedding", progress: bool = False) -> QuantizedWeight:
    """Code a token embedding table on the lattice.

    Args:
        weight: float [vocab, dim] (the table as the model stores it; any float dtype, any device).
        config: the encoder configuration (codebook, gain bits, centroid iterations, rotation,
            tail policy, device).
        name: the table's name, for error messages.
        progress: a tqdm bar over the table's 24-column groups, with a time estimate (coding a
            151 936-row table takes minutes on a CPU).

    Returns:
        The canonical record (CPU tensors): ``d_out = vocab``, ``d_in = dim``.

    Raises:
        InvalidInput: not a 2-D float table, a non-finite entry, or a control codebook.
        UnsupportedShape: ``dim`` below one block, or not a multiple of 24 under
            ``tail_policy="refuse"``.
    """
    if not isinstance(weight, torch.Tensor):
        raise InvalidInput(f"{name}: expected a tensor, got {type(weight).__name__}")
    coder = make_coder(config)
    if not getattr(coder, "lattice", False):
        raise InvalidInput(f"{name}: codebook {config.codebook!r} does not produce lattice codes")
    dim = int(weight.shape[1])
    rotation = (generate_rotation(dim, rotation_seed(0, 0, config.rotation_seed))
                if config.rotate else None)
    device = resolve_device(config.device)
    w = weight.detach().to(device=device)  # gptq checks the shape, dtype and finiteness
    from leechq.utils.progress import stage_bar

    with stage_bar(f"lattice {name}", dim // 24, "column groups", progress) as bar:
        result = gptq_quantize(w, None, coder, rotation, config.tail_policy, name,
                               on_step=bar.update)
    return result.to_quantized_weight()
