"""A vLLM plugin: the ``leechq`` quantization method (entry point ``vllm.general_plugins``).

vLLM builds its own model (its fused ``qkv_proj`` / ``gate_up_proj`` linears, split over
tensor-parallel ranks) and asks the checkpoint's quantization method for each linear's weights.
This module answers for leechq artifacts:

* :class:`LeechqVllmConfig` (built by :func:`register`, which vLLM calls at start-up) reads the
  artifact's ``quantization_config`` (record descriptors, rotation descriptors) and the rotation
  tables stored beside the records; a linear whose logical parts (``q_proj``, ``k_proj``,
  ``v_proj`` of a ``qkv_proj``) all have records gets the leechq linear method, any other the
  unquantized one.
* The linear method creates one parameter per artifact tensor suffix (``codes``, ``row_scales``,
  ``centroids``, ``tail``; ``qweight``, ``scales``, ``biases`` for int4) whose loader keeps each
  logical part's tensors as stored; after loading it rebuilds the canonical records
  (:func:`leechq.nn.records.record_from_tensors`), cuts this rank's share (:func:`shard_record`)
  and serves it through :class:`~leechq.nn.linear.LeechqLinear` (fused kernels on CUDA, the dense
  reference path elsewhere).

Tensor-parallel splits (:func:`shard_record`, no vLLM needed, tested in the default tier):

* along the output (column-parallel: q/k/v, gate/up): rows of a lattice code are independent, so
  each rank keeps its rows (codes, row scales, tail) and the whole rotation;
* along the input (row-parallel: o, down): only at 24-column block boundaries. The rotation mixes
  every input column, so a rotated record's rank gathers the whole activation, rotates it, and
  multiplies its own blocks (the tail columns go to the last rank); the partial products then sum
  (vLLM's all-reduce) to the full product. Unrotated lattice records and int4 records take vLLM's
  input shard directly, which must then fall on block (or group) boundaries.

vLLM pins its own torch, so it is not part of leechq's environments; nothing here imports vLLM
until :func:`register` runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from leechq.codebooks.base import BLOCK
from leechq.errors import InvalidInput, UnsupportedShape
from leechq.formats.quantized_weight import Int4Weight, QuantizedWeight
from leechq.formats.rotation import RotationTables, apply_rotation
from leechq.nn.linear import LeechqLinear

Record = QuantizedWeight | Int4Weight

PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
"""vLLM's fused linears and the checkpoint modules they hold, in order."""


# --------------------------------------------------------------------------------------------------
# Tensor-parallel shares of a record (no vLLM needed)


def even_split(n: int, parts: int, rank: int) -> tuple[int, int]:
    """``[start, end)`` of part ``rank`` when ``n`` units are split into ``parts`` near-equal runs
    (the first ``n % parts`` runs one longer)."""
    base, extra = divmod(n, parts)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def rows_of(record: Record, start: int, end: int) -> Record:
    """Rows ``[start, end)`` of ``record`` (a record of ``end - start`` output features)."""
    if not 0 <= start < end <= record.d_out:
        raise InvalidInput(f"rows [{start}, {end}) of a record with {record.d_out} rows")
    if isinstance(record, QuantizedWeight):
        return replace(record, d_out=end - start, labels=record.labels[start:end],
                       gains=record.gains[start:end], row_scales=record.row_scales[start:end],
                       tail=record.tail[start:end])
    return replace(record, d_out=end - start, qweight=record.qweight[start:end],
                   scales=record.scales[start:end], biases=record.biases[start:end])


def blocks_of(record: QuantizedWeight, b0: int, b1: int, tail: bool) -> QuantizedWeight:
    """Input blocks ``[b0, b1)`` of a lattice record (plus its tail columns when ``tail``), as a
    record without rotation: it multiplies columns ``[24·b0, 24·b1)`` (and the tail) of the
    *rotated* activation."""
    nb = record.labels.shape[1]
    if not 0 <= b0 <= b1 <= nb or (b0 == b1 and not tail):
        raise InvalidInput(f"blocks [{b0}, {b1}) of a record with {nb} blocks")
    t = record.tail if tail else record.tail[:, :0]
    return replace(record, d_in=BLOCK * (b1 - b0) + t.shape[1], labels=record.labels[:, b0:b1],
                   gains=record.gains[:, b0:b1], tail=t, rotation=None)


def int4_columns_of(record: Int4Weight, c0: int, c1: int) -> Int4Weight:
    """Input columns ``[c0, c1)`` of an int4 record (both on group boundaries)."""
    g = record.group
    if c0 % g or (c1 % g and c1 != record.d_in):
        raise UnsupportedShape(f"int4 input split at columns [{c0}, {c1}) is not on the "
                               f"{g}-column group boundaries")
    return replace(record, d_in=c1 - c0, qweight=record.qweight[:, c0 // 2 : -(-c1 // 2)],
                   scales=record.scales[:, c0 // g : -(-c1 // g)],
                   biases=record.biases[:, c0 // g : -(-c1 // g)])


class Share:
    """One rank's part of a record.

    Attributes:
        record: the rank's record (rotation dropped when ``rotation`` is set).
        rotation: rotate the gathered activation with these tables first (row-parallel rotated
            records), else None.
        columns: ``(start, end)`` of the (rotated, gathered) activation columns the record
            multiplies; None: the activation as given.
    """

    def __init__(self, record: Record, rotation: RotationTables | None = None,
                 columns: tuple[int, int] | None = None) -> None:
        self.record, self.rotation, self.columns = record, rotation, columns


def shard_record(record: Record, split: str, rank: int, world: int,
                 out_range: tuple[int, int] | None = None) -> Share:
    """This rank's share of ``record`` under tensor parallelism.

    Args:
        record: the whole record.
        split: "column" (the output is split, e.g. q/k/v) or "row" (the input is split, e.g. o).
        rank, world: this rank and the tensor-parallel size.
        out_range: for "column", the rows of this rank (default: an even split of ``d_out``).

    Raises:
        UnsupportedShape: an input split that does not fall on 24-column blocks (unrotated lattice
            records) or int4 groups.
    """
    if not 0 <= rank < world:
        raise InvalidInput(f"rank {rank} of {world}")
    if split == "column":
        start, end = out_range if out_range is not None else even_split(record.d_out, world, rank)
        return Share(rows_of(record, start, end))
    if split != "row":
        raise InvalidInput(f"split must be 'column' or 'row', got {split!r}")
    if world == 1:
        return Share(record)
    c0, c1 = even_split(record.d_in, world, rank)
    if isinstance(record, Int4Weight):
        if record.d_in % world:
            raise UnsupportedShape(f"int4 record of {record.d_in} columns over {world} ranks")
        return Share(int4_columns_of(record, c0, c1))
    nb = record.labels.shape[1]
    if record.rotation is None:  # vLLM's own input shard, which must be whole blocks
        width = record.d_in // world
        if record.d_in % world or width % BLOCK:
            raise UnsupportedShape(
                f"an unrotated lattice record of {record.d_in} columns splits over {world} ranks "
                f"only at {BLOCK}-column block boundaries ({width} columns per rank)"
            )
        last = rank == world - 1
        return Share(blocks_of(record, c0 // BLOCK, c1 // BLOCK, last and record.tail_cols > 0))
    b0, b1 = even_split(nb, world, rank)
    last = rank == world - 1
    share = blocks_of(record, b0, b1, last)
    end = BLOCK * b1 + (record.tail_cols if last else 0)
    return Share(share, record.rotation, (BLOCK * b0, end))


class ShardedLinear(nn.Module):
    """The quantized part of one vLLM linear on one rank: one :class:`LeechqLinear` per logical
    part (q, k, v ...), outputs concatenated.

    Args:
        shares: the rank's share of each logical part (all "column" or all "row" shares).
        gather: ``gather(x)`` → the whole activation [..., d_in] from this rank's shard (needed by
            rotated row-parallel shares; tensor-parallel size 1: identity).
    """

    def __init__(self, shares: list[Share], gather: Callable[[torch.Tensor], torch.Tensor]
                 | None = None) -> None:
        super().__init__()
        self.parts = nn.ModuleList([LeechqLinear.from_record(s.record) for s in shares])
        self.rotations = [s.rotation for s in shares]
        self.columns = [s.columns for s in shares]
        self.gather = gather

    def finalize(self, device: torch.device | str, dtype: torch.dtype) -> None:
        """Prepare every part for ``forward`` on ``device`` (``LeechqLinear.finalize``)."""
        for m in self.parts:
            m.finalize(device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [..., d_in of this rank] → [..., sum of the parts' d_out] (partial sums for a
        row-parallel share)."""
        outs = []
        full: torch.Tensor | None = None
        for m, rot, cols in zip(self.parts, self.rotations, self.columns, strict=True):
            h = x
            if rot is not None and cols is not None:
                if full is None:
                    whole = self.gather(x) if self.gather is not None else x
                    full = apply_rotation(whole.float(), rot).to(x.dtype)
                h = full[..., cols[0] : cols[1]]
            outs.append(m(h))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)


# --------------------------------------------------------------------------------------------------
# Artifact side: rotation tables beside the records


def read_rotations(directory: str | Path, descriptors: Mapping[str, Any]) -> dict[str,
                                                                               RotationTables]:
    """The rotation tables ``leechq.rotations.<key>.signs|small`` of an artifact directory."""
    from safetensors import safe_open

    from leechq.formats.artifact import MODEL_FILE, ROTATION_PREFIX
    from leechq.nn.records import rotation_from_tensors

    out: dict[str, RotationTables] = {}
    with safe_open(str(Path(directory) / MODEL_FILE), framework="pt") as f:
        for key, desc in descriptors.items():
            signs = f.get_tensor(f"{ROTATION_PREFIX}{key}.signs")
            small = f.get_tensor(f"{ROTATION_PREFIX}{key}.small")
            out[key] = rotation_from_tensors(key, desc, signs, small)
    return out


def logical_names(prefix: str) -> list[str]:
    """The checkpoint module names behind a vLLM linear's ``prefix`` (``…qkv_proj`` → q, k, v)."""
    head, _, last = prefix.rpartition(".")
    parts = PACKED.get(last)
    if parts is None:
        return [prefix]
    return [f"{head}.{p}" if head else p for p in parts]


# --------------------------------------------------------------------------------------------------
# vLLM classes (built when vLLM is importable)


def register() -> None:
    """The ``vllm.general_plugins`` entry point: registers the ``leechq`` quantization method."""
    from vllm.model_executor.layers.quantization import register_quantization_config

    config_cls = _vllm_classes()
    register_quantization_config("leechq")(config_cls)


def check_servable(config: Mapping[str, Any]) -> None:
    """Refuse a ``quantization_config`` this plugin cannot serve, naming why: an artifact whose
    token embedding is lattice-coded (``embedding_encoding = "lattice"``) or whose head is
    (``lattice_head``): vLLM builds its own embedding and head layers, which have no leechq
    method; ``leechq.load``, ``from_pretrained`` and ``leechq serve`` serve them."""
    inner = config.get("config")
    if isinstance(inner, Mapping) and inner.get("embedding_encoding") == "lattice":
        raise InvalidInput(
            "this artifact's token embedding is lattice-coded, which the vLLM plugin does not "
            "serve (vLLM builds its own embedding layer); serve it with `leechq serve`, or "
            "quantize with a 4/8-bit or kept embedding for vLLM")
    if isinstance(inner, Mapping) and inner.get("lattice_head"):
        raise InvalidInput(
            "this artifact's output head is lattice-coded, which the vLLM plugin does not serve "
            "(vLLM builds its own head layer); serve it with `leechq serve`, or quantize without "
            "--lattice-head for vLLM")


def _vllm_classes() -> type:
    from vllm.model_executor.layers.linear import (
        LinearBase,
        LinearMethodBase,
        UnquantizedLinearMethod,
    )
    from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

    class LeechqVllmConfig(QuantizationConfig):
        """The artifact's ``quantization_config`` (records and rotations by name)."""

        def __init__(self, config: Mapping[str, Any]) -> None:
            super().__init__()
            check_servable(config)
            self.raw = dict(config)
            self.records: dict[str, Any] = dict(config.get("records") or {})
            self.rotation_desc: dict[str, Any] = dict(config.get("rotations") or {})
            self.rotations: dict[str, RotationTables] = {}

        def get_name(self) -> str:
            return "leechq"

        def get_supported_act_dtypes(self) -> list[torch.dtype]:
            return [torch.float16, torch.bfloat16, torch.float32]

        @classmethod
        def get_min_capability(cls) -> int:
            return 80

        @staticmethod
        def get_config_filenames() -> list[str]:
            return ["config.json"]

        @classmethod
        def from_config(cls, config: dict[str, Any]) -> LeechqVllmConfig:
            if config.get("quant_method") != "leechq":
                method = config.get("quant_method")
                raise InvalidInput(f"not a leechq quantization_config: {method!r}")
            return cls(config)

        def maybe_update_config(self, model_name: str, hf_config: Any = None,
                                revision: str | None = None) -> None:
            path = Path(model_name)
            if self.rotation_desc and (path / "config.json").is_file():
                self.rotations = read_rotations(path, self.rotation_desc)

        def get_checkpoint_weight_mapper(self) -> Any:
            """vLLM's mapping of checkpoint names, dropping ``leechq.rotations.*`` (read by
            :meth:`maybe_update_config` instead: they belong to no layer)."""
            from vllm.model_executor.models.utils import WeightsMapper

            from leechq.formats.artifact import ROTATION_PREFIX

            drop = WeightsMapper(orig_to_new_prefix={ROTATION_PREFIX: None})
            base = getattr(super(), "get_checkpoint_weight_mapper", None)
            return base() | drop if base is not None else drop

        def get_quant_method(self, layer: nn.Module, prefix: str) -> Any:
            if not isinstance(layer, LinearBase):
                return None
            names = logical_names(prefix)
            found = [n in self.records for n in names]
            if not any(found):
                return UnquantizedLinearMethod()
            if not all(found):
                raise InvalidInput(f"{prefix}: only some of {names} have leechq records")
            return LeechqLinearMethod(self, names)

    class LeechqLinearMethod(LinearMethodBase):
        """Loads the records of one vLLM linear and serves this rank's share."""

        def __init__(self, config: LeechqVllmConfig, names: list[str]) -> None:
            self.config, self.names = config, names

        def create_weights(self, layer: nn.Module, input_size_per_partition: int,
                           output_partition_sizes: list[int], input_size: int,
                           output_size: int, params_dtype: torch.dtype,
                           **extra_weight_attrs: Any) -> None:
            from vllm.model_executor.utils import set_weight_attrs

            from leechq.nn.records import record_tensor_specs

            descs = [self.config.records[n] for n in self.names]
            if sum(int(d["d_out"]) for d in descs) != output_size:
                raise InvalidInput(f"{self.names}: records of {[d['d_out'] for d in descs]} "
                                   f"rows for a linear of {output_size} outputs")
            layer.leechq_names = self.names
            layer.leechq_split = "row" if input_size_per_partition < input_size else "column"
            layer.leechq_out_sizes = list(output_partition_sizes)
            layer.leechq_loaded = {}
            layer.leechq_dtype = params_dtype
            suffixes = dict.fromkeys(s for d in descs for s in record_tensor_specs(d))
            for suffix in suffixes:
                param = nn.Parameter(torch.empty(0, dtype=torch.uint8), requires_grad=False)

                def loader(param: nn.Parameter, loaded: torch.Tensor, shard_id: Any = None,
                           suffix: str = suffix) -> None:
                    part = _part_index(self.names, shard_id)
                    layer.leechq_loaded[(part, suffix)] = loaded.detach().to("cpu").clone()

                layer.register_parameter(suffix, param)
                set_weight_attrs(param, {**extra_weight_attrs, "weight_loader": loader})
                # The placeholders are made under vLLM's device context: the serving device.
                layer.leechq_device = param.device

        def process_weights_after_loading(self, layer: nn.Module) -> None:
            from vllm.distributed import (
                get_tensor_model_parallel_rank,
                get_tensor_model_parallel_world_size,
                tensor_model_parallel_all_gather,
            )

            from leechq.nn.records import record_from_tensors, record_tensor_specs

            rank = get_tensor_model_parallel_rank()
            world = get_tensor_model_parallel_world_size()
            shares = []
            for i, name in enumerate(self.names):
                desc = self.config.records[name]
                tensors = {s: layer.leechq_loaded[(i, s)] for s in record_tensor_specs(desc)}
                record = record_from_tensors(name, desc, tensors, self.config.rotations)
                out = None
                if layer.leechq_split == "column":
                    rows = layer.leechq_out_sizes[i]
                    out = (rank * rows, (rank + 1) * rows)
                shares.append(shard_record(record, layer.leechq_split, rank, world, out))
            sharded = ShardedLinear(
                shares, (lambda x: tensor_model_parallel_all_gather(x, dim=-1))
                if world > 1 else None)
            sharded.finalize(layer.leechq_device, layer.leechq_dtype)
            layer.leechq = sharded
            for s in dict.fromkeys(s for n in self.names
                                   for s in record_tensor_specs(self.config.records[n])):
                delattr(layer, s)
            del layer.leechq_loaded

        def apply(self, layer: nn.Module, x: torch.Tensor,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
            y = layer.leechq(x)
            return y if bias is None else y + bias

    return LeechqVllmConfig


def _part_index(names: list[str], shard_id: Any) -> int:
    """Which logical part a vLLM loader call is for: ``shard_id`` "q"/"k"/"v" or 0/1 (gate/up),
    None for an unfused linear."""
    if shard_id is None:
        if len(names) != 1:
            raise InvalidInput(f"a weight for the fused {names} without a shard id")
        return 0
    if isinstance(shard_id, int):
        return shard_id
    order = {"q": 0, "k": 1, "v": 2}
    if shard_id not in order:
        raise InvalidInput(f"unknown shard id {shard_id!r} for {names}")
    return order[shard_id]


def artifact_quant_config(directory: str | Path) -> dict[str, Any]:
    """The ``quantization_config`` of an artifact directory's ``config.json``."""
    return dict(json.loads((Path(directory) / "config.json").read_text())["quantization_config"])
