"""``leechq.models.save``: write a model holding :class:`LeechqLinear` modules back to an artifact.

The save half of ``models/`` (docs/architecture.md §1) for models that already carry
their records — a model returned by :func:`leechq.models.load.load`, or one whose linears were
replaced by hand. The quantizer writes its artifacts directly through
:func:`leechq.formats.artifact.write_artifact`; this module is the same writer fed from a live
model: every ``LeechqLinear``'s canonical record, every other parameter and persistent buffer as a
raw tensor (in its current dtype), tied heads as aliases, and the base config without
``quantization_config``. Records are stored exactly as held, so ``load → save`` reproduces the
record tensors byte for byte.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from leechq.config import QuantConfig
from leechq.errors import InvalidInput


def model_records(model: torch.nn.Module) -> dict[str, Any]:
    """Module name → canonical record of every :class:`LeechqLinear` in ``model``, and of a
    lattice-coded embedding (:class:`~leechq.nn.lattice_embedding.LatticeEmbedding`).

    Raises:
        InvalidInput: a module has no record (an unloaded placeholder).
    """
    from leechq.nn.lattice_embedding import LatticeEmbedding
    from leechq.nn.linear import LeechqLinear

    out: dict[str, Any] = {}
    for name, module in model.named_modules():
        if isinstance(module, LatticeEmbedding):
            out[name] = module.record()
        elif isinstance(module, LeechqLinear):
            if module.record is None:
                raise InvalidInput(f"{name}: LeechqLinear has no record (placeholder never loaded)")
            out[name] = module.record
    return out


def raw_tensors(
    model: torch.nn.Module, records: dict[str, Any]
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Every stored tensor of ``model`` that is not part of a record, and the tied aliases.

    Returns:
        ``(raw, tied)``: name → CPU tensor (a :class:`GroupAffine` for a packed 4/8-bit embedding
        or head table, under ``<module>.weight``), and alias → target for parameters sharing
        storage (e.g. a tied ``lm_head.weight``).
    """
    from leechq.nn.lattice_embedding import LatticeEmbedding
    from leechq.nn.linear import LeechqLinear

    leechq_prefixes = {name for name, m in model.named_modules()
                       if isinstance(m, (LeechqLinear, LatticeEmbedding))}
    raw: dict[str, Any] = {}
    tied: dict[str, str] = {}
    packed_owners = _packed_tables(model, raw, tied)
    seen: dict[tuple[int, int, tuple[int, ...]], str] = {}
    named = list(model.named_parameters(remove_duplicate=False))
    named += [
        (n, b) for n, b in model.named_buffers(remove_duplicate=False) if _persistent(model, n)
    ]
    for name, tensor in named:
        owner = name.rpartition(".")[0]
        if owner in leechq_prefixes and not name.endswith(".bias"):
            continue  # the record's own state
        if owner in packed_owners:
            continue  # a packed table: written as one group-affine tensor above
        if tensor.device.type == "meta":
            raise InvalidInput(f"{name} is still on the meta device; load the model before saving")
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key in seen and tensor.numel():
            tied[name] = seen[key]
            continue
        seen[key] = name
        raw[name] = tensor.detach().to("cpu").contiguous()
    return raw, tied


def _packed_tables(model: torch.nn.Module, raw: dict[str, Any], tied: dict[str, str]) -> set[str]:
    """Add the packed embedding/head tables (:mod:`leechq.nn.embedding`) of ``model`` to ``raw``
    (as :class:`GroupAffine` under ``<module>.weight``) and a tied head to ``tied``; return the
    names of the modules owning their buffers."""
    from leechq.nn.embedding import PackedEmbedding, PackedHead

    named = list(model.named_modules(remove_duplicate=False))
    owners = {n for n, m in named if isinstance(m, PackedEmbedding)}
    heads = {n: m for n, m in named if isinstance(m, PackedHead)}
    for name, module in named:
        if isinstance(module, PackedEmbedding) and not any(name == f"{h}.table" for h in heads):
            raw[f"{name}.weight"] = module.to_group_affine()
    for name, head in heads.items():
        if head.tied:
            target = next((n for n, m in named if m is head.table and n != f"{name}.table"), None)
            if target is None:
                raise InvalidInput(f"{name}: a tied packed head whose embedding is not in the model")
            tied[f"{name}.weight"] = f"{target}.weight"
        else:
            raw[f"{name}.weight"] = head.table.to_group_affine()
    return owners


def _persistent(model: torch.nn.Module, name: str) -> bool:
    owner, _, leaf = name.rpartition(".")
    module = model.get_submodule(owner) if owner else model
    return leaf not in module._non_persistent_buffers_set


def save(
    model: torch.nn.Module,
    out_dir: str | os.PathLike[str],
    *,
    tokenizer: Any = None,
    quant_config: QuantConfig | None = None,
    provenance: dict[str, Any] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``model`` (with :class:`LeechqLinear` modules) as an artifact directory.

    Args:
        model: a transformers causal LM whose quantized linears are ``LeechqLinear``.
        out_dir: the directory to create.
        tokenizer: saved alongside when given.
        quant_config: the configuration to record (default: the one in
            ``model.config.quantization_config``).
        provenance: free-form JSON stored in the config.
        overwrite: replace an existing directory.

    Returns:
        The directory.
    """
    from leechq.formats.artifact import write_artifact

    records = model_records(model)
    if not records:
        raise InvalidInput("the model holds no LeechqLinear module: nothing quantized to save")
    qc_dict = getattr(model.config, "quantization_config", None)
    if quant_config is None:
        if not isinstance(qc_dict, dict) or "config" not in qc_dict:
            raise InvalidInput("pass quant_config: the model's config records none")
        quant_config = QuantConfig.from_dict(qc_dict["config"])
    raw, tied = raw_tensors(model, records)
    base = model.config.to_dict()
    base.pop("quantization_config", None)
    prov = dict(qc_dict.get("provenance", {})) if isinstance(qc_dict, dict) else {}
    prov.update(provenance or {})
    return write_artifact(
        out_dir,
        base_config=base,
        quant_config=quant_config,
        records=records,
        raw=raw,
        tied=tied,
        tokenizer=tokenizer,
        provenance=prov,
        overwrite=overwrite,
    )
