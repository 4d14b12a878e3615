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
    from leechq.quant.recipe import Recipe


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


def check_untied(reference: nn.Module, embed_name: str, head_name: str | None) -> None:
    """Refuse a lattice-coded embedding for a model whose head is the embedding's table."""
    if head_name is None:
        return
    try:
        emb, head = reference.get_parameter(embed_name), reference.get_parameter(head_name)
    except AttributeError:
        return
    if emb is head or emb.data_ptr() == head.data_ptr():
        raise InvalidInput(
            f"lattice_embedding codes an untied token embedding; {head_name} is tied to "
            f"{embed_name} (one table serves both): use a 4- or 8-bit embedding")


def apply_lattice(student: nn.Module, raw: dict[str, Any],
                   lattice: Mapping[str, QuantizedWeight]) -> None:
    """Make ``student`` evaluate the lattice-coded tables and keep their decode in ``raw`` (a
    dense 2-D tensor: the row-scale and tuning steps leave it as it is)."""
    for name, rec in lattice.items():
        dense = rec.dequantize(torch.float32)
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

