"""The recipe's step 3 (docs/quantizer.md §7): the token embedding and output head tables.

A group-affine 4- or 8-bit table per stored table (a tied head is the embedding's, stored once),
made from the dense tensor; or, with ``lattice_embedding``, an untied embedding coded on the
lattice (:mod:`leechq.quant.embedding`) that the student evaluates from the start of the recipe.
:mod:`leechq.quant.recipe` runs the step; this module owns what the tables are and how a model is
made to evaluate them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from leechq.errors import InvalidInput
from leechq.formats.artifact import GroupAffine
from leechq.formats.quantized_weight import QuantizedWeight

if TYPE_CHECKING:
    from leechq.quant.recipe_spec import Recipe


def table_records(
    raw: Mapping[str, torch.Tensor | GroupAffine],
    tied: Mapping[str, str],
    recipe: Recipe,
    embed_name: str,
    head_name: str | None,
) -> dict[str, GroupAffine]:
    """The group-affine tables step 3 stores: name → :class:`GroupAffine`.

    A head tied to the embedding is an alias in ``tied`` and is not a separate table.

    Raises:
        InvalidInput: the embedding (or an untied head the recipe quantizes) is not a dense raw
            tensor.
    """
    out: dict[str, GroupAffine] = {}
    wanted = [(embed_name, recipe.embedding_bits)]
    if head_name is not None and head_name not in tied:
        wanted.append((head_name, recipe.head_bits))
    for name, bits in wanted:
        if bits is None:
            continue
        t = raw.get(name)
        if isinstance(t, GroupAffine):
            t = ga_source(t)
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise InvalidInput(f"table {name!r} is not a 2-D raw tensor of the model")
        out[name] = GroupAffine.quantize(t, bits, recipe.table_group)
    return out


def ga_source(t: torch.Tensor | GroupAffine) -> torch.Tensor:
    """The dense float32 tensor a table is quantized from (a stored table: its decode)."""
    return t.dequantize(torch.float32) if isinstance(t, GroupAffine) else t.to(torch.float32)


def apply_tables(model: nn.Module, tables: Mapping[str, GroupAffine]) -> None:
    """Make ``model`` evaluate the stored tables (a tied head follows by sharing)."""
    for name, ga in tables.items():
        param = model.get_parameter(name)
        with torch.no_grad():
            param.copy_(ga.dequantize(torch.float32).to(param.dtype))


def check_lattice_table(model: nn.Module, embed_name: str, head_name: str | None,
                        config: Any) -> None:
    """Refuse, before any work, a lattice-coded embedding that ``model`` or the encoder
    ``config`` cannot take: an embedding (tensor ``embed_name``) that is not an ``nn.Embedding``,
    more than one gain bit (the served layouts' width), or a head (tensor ``head_name``) tied to
    the table — the table would be the head too, where the lattice costs four to ten times the
    KL of a 4-bit table (:mod:`leechq.quant.embedding`)."""
    owner = embed_name.rpartition(".")[0]
    module = model.get_submodule(owner)
    if not isinstance(module, nn.Embedding):
        raise InvalidInput(f"a lattice-coded embedding needs an nn.Embedding at {owner}, got "
                           f"{type(module).__name__}")
    if config.gain_bits > 1:
        raise InvalidInput(f"a lattice-coded embedding serves one gain bit; the encoder config "
                           f"has {config.gain_bits}")
    try:
        head = model.get_parameter(head_name) if head_name is not None else None
    except AttributeError:
        head = None
    if head is not None and (head is module.weight or head.data_ptr() == module.weight.data_ptr()):
        raise InvalidInput(
            f"a lattice-coded embedding must be untied; {head_name} is tied to it (one table "
            f"serves both): use a 4- or 8-bit embedding")


def apply_lattice(student: nn.Module, raw: dict[str, Any],
                  decoded: Mapping[str, torch.Tensor]) -> None:
    """Make ``student`` evaluate the lattice-coded tables, given decoded (float32, tensor name →
    [vocab, dim]), and keep the decode in ``raw`` (a dense 2-D tensor: the row-scale and tuning
    steps leave it as it is)."""
    for name, dense in decoded.items():
        raw[name] = dense
        param = student.get_parameter(name)
        with torch.no_grad():
            param.copy_(dense.to(param.dtype))


def encoding_of(bits: int | None) -> str:
    return {None: "keep", 8: "int8", 4: "int4"}[bits]


def split_lattice_tables(model: nn.Module, records: Mapping[str, Any]
                         ) -> tuple[dict[str, Any], dict[str, QuantizedWeight]]:
    """``(the projections' records, the lattice-coded tables by tensor name)``: a recipe result
    records a lattice-coded embedding under its module's name beside the projections; the steps
    that train records (row scales, tuning) take the projections only."""
    linear: dict[str, Any] = {}
    tables: dict[str, QuantizedWeight] = {}
    for name, rec in records.items():
        if isinstance(model.get_submodule(name), nn.Embedding):
            tables[f"{name}.weight"] = rec
        else:
            linear[name] = rec
    return linear, tables

