"""transformers integration: ``AutoModelForCausalLM.from_pretrained(<leechq artifact>)``.

Uses transformers' public registration API only
(``register_quantization_config`` / ``register_quantizer`` of ``transformers.quantizers.auto``; no
mapping is mutated by hand, no function patched). Importing this module registers the method
``"leechq"``; after that, a directory whose ``config.json`` carries
``quantization_config.quant_method == "leechq"`` loads with the stock ``from_pretrained``::

    import leechq.integrations.transformers  # registers "leechq"
    model = AutoModelForCausalLM.from_pretrained("out/smollm2-tetra", dtype=torch.float32)

Lifecycle (the HfQuantizer hooks of transformers 5):

* :class:`LeechqHfConfig` keeps the artifact's ``quantization_config`` verbatim (records, rotations,
  raw and tied descriptors, the resolved :class:`~leechq.config.QuantConfig`) and checks its schema
  version and codebook fingerprint when built — before any weight is read;
* ``_process_model_before_weight_loading`` swaps every recorded ``nn.Linear`` of the meta skeleton
  for a placeholder :class:`~leechq.nn.linear.LeechqLinear` whose buffers carry the file's tensor
  names, and attaches a rotation store under ``model.leechq`` for the ``leechq.rotations.*`` keys,
  so
  transformers' own loader fills everything by name (f64 scales stay f64: the loader keeps the dtype
  of the buffer it loads into);
* a lattice-coded token embedding (a record under the embedding module's name) gets the same
  kind of placeholder in place of its ``nn.Embedding``, and becomes a
  :class:`~leechq.nn.lattice_embedding.LatticeEmbedding` once loaded;
* group-affine raw tensors (a 4/8-bit embedding or head) are read by a ``WeightConverter``
  (:meth:`LeechqHfQuantizer.get_weight_conversions`) that keeps their three stored tensors; a
  transient dense copy on the CPU fills the skeleton's parameter;
* ``_process_model_after_weight_loading`` builds the canonical records, drops the store, finalizes
  every module on the device it was loaded to (dense reference path on CPU, fused kernels on CUDA
  where they exist), groups q/k/v and gate/up for a shared input rotation, and puts a
  :class:`~leechq.nn.embedding.PackedEmbedding` / :class:`~leechq.nn.embedding.PackedHead` over
  the kept tensors in place of a group-affine embedding / head (the dense copy is dropped), on the
  device ``device_map`` gives that module. The packed modules and every ``LeechqLinear`` follow a
  later ``.to(device)``;
* ``save_pretrained`` writes the canonical records again (:meth:`get_state_dict_and_metadata`), byte
  for byte, and the same ``quantization_config``.

Quantization itself is offline (``requires_calibration = True``): use ``leechq quantize``.
"""

from __future__ import annotations

import uuid
import weakref
from typing import Any

import torch
from torch import nn
from transformers.core_model_loading import ConversionOps, WeightConverter
from transformers.quantizers import HfQuantizer
from transformers.quantizers.auto import (
    AUTO_QUANTIZATION_CONFIG_MAPPING,
    AUTO_QUANTIZER_MAPPING,
    register_quantization_config,
    register_quantizer,
)
from transformers.utils.quantization_config import QuantizationConfigMixin

from leechq.errors import ArtifactError, FingerprintMismatch, IncompatibleVersion, InvalidInput

QUANT_METHOD = "leechq"

_REQUIRED_KEYS = (
    "schema_version",
    "config",
    "codebook",
    "codebook_fingerprint",
    "block_dim",
    "code_order",
    "records",
    "rotations",
    "raw",
    "tied",
)

# Live quantizers by key: conversion ops are deep-copied per checkpoint key, so they reach the
# quantizer that keeps the group-affine tensors they see (for save_pretrained) through this table.
_QUANTIZERS: weakref.WeakValueDictionary[str, LeechqHfQuantizer] = weakref.WeakValueDictionary()


class LeechqHfConfig(QuantizationConfigMixin):
    """The artifact's ``quantization_config`` as a transformers config object.

    Every field of the artifact is kept as an attribute, unchanged, so ``to_dict()`` writes back the
    same block; ``modules_to_not_convert`` (optional) names modules that must stay dense (a record
    under such a name is refused rather than dropped).

    Raises:
        IncompatibleVersion: a schema version this build does not read.
        ArtifactError: required fields missing or malformed.
        FingerprintMismatch: the stored codebook fingerprint differs from this build's codebook.
    """

    def __init__(self, modules_to_not_convert: list[str] | None = None, **kwargs: Any) -> None:
        kwargs.pop("quant_method", None)
        self.quant_method = QUANT_METHOD
        for key, value in kwargs.items():
            setattr(self, key, value)
        if modules_to_not_convert is not None:
            self.modules_to_not_convert = list(modules_to_not_convert)
        self.post_init()

    def post_init(self) -> None:
        """Validate the block (schema version, fields, codebook fingerprint)."""
        from leechq.config import SCHEMA_VERSION

        version = getattr(self, "schema_version", None)
        if version != SCHEMA_VERSION:
            raise IncompatibleVersion(
                f"leechq quantization_config schema_version {version!r}; this build reads "
                f"{SCHEMA_VERSION} (upgrade leechq, or re-quantize with this version)"
            )
        missing = [k for k in _REQUIRED_KEYS if not hasattr(self, k)]
        if missing:
            raise ArtifactError(f"leechq quantization_config lacks {missing}")
        for key in ("records", "rotations", "raw", "tied"):
            if not isinstance(getattr(self, key), dict):
                raise ArtifactError(f"leechq quantization_config.{key} must be an object")
        from leechq.codebooks import get
        from leechq.errors import LeechqError

        try:
            cb = get(str(self.codebook))
        except LeechqError as exc:
            raise ArtifactError(
                f"codebook {self.codebook!r} is not available in this build: {exc}"
            ) from exc
        if self.codebook_fingerprint != cb.fingerprint():
            raise FingerprintMismatch(
                f"codebook {self.codebook!r} fingerprint {self.codebook_fingerprint!r} "
                "differs from "
                f"this build's {cb.fingerprint()!r}: the labels would decode to different points"
            )

    def quant_config(self) -> Any:
        """The resolved :class:`leechq.config.QuantConfig`."""
        from leechq.config import QuantConfig

        return QuantConfig.from_dict(self.config)


class GroupAffineDequantize(ConversionOps):
    """``<name>.qweight``, ``.scales``, ``.biases`` → the dense tensor ``<name>``
    (exact arithmetic of
    :class:`leechq.formats.artifact.GroupAffine`)."""

    def __init__(self, name: str, desc: dict[str, Any], capture_key: str) -> None:
        self.name, self.desc, self.capture_key = name, desc, capture_key

    @torch.no_grad()
    def convert(
        self,
        input_dict: dict[str, Any],
        source_patterns: list[str],
        target_patterns: list[str],
        **kwargs: Any,
    ) -> dict[str, torch.Tensor]:
        from leechq.formats.artifact import GroupAffine

        parts = []
        for pattern in source_patterns:
            got = input_dict[pattern]
            parts.append((got[0] if isinstance(got, (list, tuple)) else got).detach().cpu())
        q, s, b = parts
        # transformers may have widened the f16 scales/biases to the model dtype on the way in;
        # narrowing back is exact (checked) and keeps the stored bytes for save_pretrained.
        s16, b16 = s.to(torch.float16), b.to(torch.float16)
        if not (torch.equal(s16.to(s.dtype), s) and torch.equal(b16.to(b.dtype), b)):
            raise ArtifactError(f"group-affine tensor {self.name}: scales/biases are not float16")
        s, b = s16, b16
        d = self.desc
        try:
            ga = GroupAffine(
                dims=tuple(d["dims"]),
                bits=int(d["bits"]),
                group=int(d["group"]),
                qweight=q,
                scales=s,
                biases=b,
            )
            dense = ga.dequantize(torch.float32)
        except (KeyError, RuntimeError, ValueError) as exc:
            raise ArtifactError(f"group-affine tensor {self.name}: {exc}") from exc
        owner = _QUANTIZERS.get(self.capture_key)
        if owner is not None:
            owner.captured[self.name] = {"qweight": q, "scales": s, "biases": b}
        return {target_patterns[0]: dense}

    @property
    def reverse_op(self) -> ConversionOps:
        raise NotImplementedError(
            "leechq writes group-affine tensors in LeechqHfQuantizer.get_state_dict_and_metadata"
        )


class RotationTable(nn.Module):
    """Placeholder for one stored rotation (``signs`` f64 [n], ``small`` f64 [k, k])."""

    def __init__(self, n: int, k: int) -> None:
        super().__init__()
        self.register_buffer("signs", torch.empty(n, dtype=torch.float64))
        self.register_buffer("small", torch.empty(k, k, dtype=torch.float64))


class RotationStore(nn.Module):
    """``model.leechq``: receives the ``leechq.rotations.<key>.signs|small`` tensors on load."""

    def __init__(self, descriptors: dict[str, dict[str, Any]]) -> None:
        super().__init__()
        from leechq.formats.rotation import split_width

        tables = {}
        for key, desc in descriptors.items():
            if "." in key:
                raise ArtifactError(f"rotation key {key!r} contains a dot")
            n = int(desc["n"])
            tables[key] = RotationTable(n, split_width(n)[1])
        self.rotations = nn.ModuleDict(tables)

    def tables(self, descriptors: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """key → :class:`RotationTables`, checked."""
        from leechq.nn.records import rotation_from_tensors

        return {
            key: rotation_from_tensors(key, descriptors[key], m.signs, m.small)
            for key, m in self.rotations.items()
        }


class LeechqHfQuantizer(HfQuantizer):
    """Loads leechq artifacts in ``from_pretrained``; cannot quantize (the encoder is offline)."""

    requires_calibration = True
    required_packages: tuple[str, ...] = ("leechq",)
    requires_parameters_quantization = False
    quantization_config: LeechqHfConfig

    def __init__(self, quantization_config: LeechqHfConfig, **kwargs: Any) -> None:
        super().__init__(quantization_config, **kwargs)
        self.dtype: torch.dtype | None = None
        self.modules: dict[str, Any] = {}
        self.captured: dict[str, dict[str, torch.Tensor]] = {}
        self.lattice: tuple[str, Any, float] | None = None  # a lattice-coded embedding's holder
        self._key = uuid.uuid4().hex
        _QUANTIZERS[self._key] = self

    def validate_environment(self, *args: Any, device_map: Any = None, **kwargs: Any) -> None:
        """CPU and CUDA are both fine (reference path on CPU); disk offload is refused."""
        if isinstance(device_map, dict) and "disk" in device_map.values():
            raise InvalidInput(
                "leechq modules cannot be offloaded to disk; use a CPU or GPU device_map"
            )

    def update_dtype(self, dtype: torch.dtype | None) -> torch.dtype:
        """float32 unless asked otherwise; float16/bfloat16 accepted; anything else refused."""
        if dtype is None:
            dtype = torch.float32
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise InvalidInput(f"leechq models run in float32, float16 or bfloat16, not {dtype}")
        self.dtype = dtype
        return dtype

    def _process_model_before_weight_loading(self, model: Any, **kwargs: Any) -> None:
        from leechq.formats.integrity import check_pretrained, check_pretrained_keys
        from leechq.models.experts import needs_split, split_experts
        from leechq.nn.replace import replace_with_placeholders

        art = check_pretrained(model, kwargs.get("checkpoint_files"))  # the integrity gate
        qc = self.quantization_config
        skip = list(getattr(qc, "modules_to_not_convert", None) or [])
        if needs_split(qc.records):  # experts quantized one matrix each (leechq.models.experts)
            split_experts(model, copy_weights=False)
        records = self._lattice_placeholder(model, dict(qc.records))
        self.modules = replace_with_placeholders(model, records, skip=skip)
        # a recorded module keeps no dense weight to tie: a lattice-coded head is its own,
        # whatever the config's tie_word_embeddings says
        _untie(model, {f"{name}.weight" for name in qc.records})
        device = next(iter(model.parameters())).device
        with torch.device(device):
            model.leechq = RotationStore(qc.rotations)
        check_pretrained_keys(model, art)  # every skeleton tensor stored or tied

    def _lattice_placeholder(self, model: Any, records: dict[str, Any]) -> dict[str, Any]:
        """A lattice-coded token embedding (recorded under the embedding module's name) gets a
        placeholder whose buffers carry the record's tensor names (swapped for a
        :class:`~leechq.nn.lattice_embedding.LatticeEmbedding` once loaded); returns the other
        records."""
        from leechq.models.load import split_embedding_record
        from leechq.nn.linear import LeechqLinear
        from leechq.utils.modules import embedding_scale

        name, desc, records = split_embedding_record(model, records)
        if name is None or desc is None:
            return records
        emb = model.get_submodule(name)
        if not isinstance(emb, nn.Embedding) or desc.get("kind") != "lattice":
            raise ArtifactError(f"{name}: the artifact records a {desc.get('kind')!r} table for a "
                                f"{type(emb).__name__}; leechq codes an nn.Embedding on the "
                                "lattice only")
        with torch.device(emb.weight.device):
            holder = LeechqLinear.placeholder(name, desc, bias=False)
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, leaf, holder)
        self.lattice = (name, holder, embedding_scale(emb))
        return records

    def _install_lattice_embedding(self, model: Any, rotations: dict[str, Any],
                                   dtype: torch.dtype, fallback: torch.device | None) -> None:
        """The loaded placeholder's record as a :class:`LatticeEmbedding`, finalized where
        ``device_map`` puts the embedding."""
        from leechq.nn.lattice_embedding import LatticeEmbedding

        if self.lattice is None:
            return
        name, holder, scale = self.lattice
        self.lattice = None
        device = next(iter(holder.buffers())).device
        record = holder.materialize(rotations)
        module = LatticeEmbedding.from_record(record, scale)
        module._canonical = holder._canonical  # the loaded bytes: state_dict writes them back
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, leaf, module)
        module.finalize(_placement(model, name, fallback or device), dtype)

    def get_weight_conversions(self) -> list[Any]:
        """One converter per group-affine raw tensor (three stored keys → one dense parameter)."""
        out = []
        for name, desc in self.quantization_config.raw.items():
            if not isinstance(desc, dict) or desc.get("encoding") != "quant":
                continue
            out.append(
                WeightConverter(
                    [f"{name}.qweight", f"{name}.scales", f"{name}.biases"],
                    name,
                    operations=[GroupAffineDequantize(name, desc, self._key)],
                )
            )
        return out

    def _process_model_after_weight_loading(self, model: Any, **kwargs: Any) -> Any:
        from leechq.nn.replace import finalize_all, materialize_all, share_groups

        qc = self.quantization_config
        store = getattr(model, "leechq", None)
        rotations = store.tables(qc.rotations) if store is not None else {}
        devices = {}
        for name, module in self.modules.items():
            first = next(iter(module.buffers()))
            devices[name] = first.device
        materialize_all(self.modules, rotations)
        if store is not None:
            del model.leechq
        # transformers keeps the used conversions to revert them in save_pretrained; ours need no
        # reverting (get_state_dict_and_metadata emits the stored tensors), so they are not kept.
        kept = getattr(model, "_weight_conversions", None)
        if isinstance(kept, list):
            model._weight_conversions = [
                c
                for c in kept
                if not any(
                    isinstance(op, GroupAffineDequantize) for op in getattr(c, "operations", ())
                )
            ]
        dtype = self.dtype or torch.float32
        finalize_all(self.modules, devices, dtype)
        share_groups(self.modules)
        fallback = next(iter(devices.values()), None)
        self._install_lattice_embedding(model, rotations, dtype, fallback)
        self._install_packed_tables(model, dtype, fallback)
        return model

    def _install_packed_tables(self, model: Any, dtype: torch.dtype,
                               fallback: torch.device | None) -> None:
        """Packed modules in place of the group-affine embedding / head, finalized where
        ``device_map`` puts them (default: where the quantized projections are)."""
        from types import SimpleNamespace

        from leechq.formats.artifact import GroupAffine
        from leechq.models.load import install_packed_tables

        qc = self.quantization_config
        raw_quant, raw = {}, {}
        for name, desc in qc.raw.items():
            if isinstance(desc, dict) and desc.get("encoding") == "quant" and name in self.captured:
                got = self.captured[name]
                raw_quant[name] = GroupAffine(tuple(desc["dims"]), int(desc["bits"]),
                                              int(desc["group"]), got["qweight"], got["scales"],
                                              got["biases"])
            else:
                raw[name] = desc
        if not raw_quant:
            return
        fallback = fallback or next(
            (p.device for p in model.parameters() if p.device.type != "meta"), torch.device("cpu"))
        art = SimpleNamespace(raw=raw, raw_quant=raw_quant, tied=dict(qc.tied),
                              records=dict(qc.records))
        packed, handled = install_packed_tables(model, art, model.config)
        _untie(model, handled)  # the dense parameters these modules replaced
        names = {id(m): n for n, m in model.named_modules()}
        for module in packed:  # the embedding before a head that reads its table
            name = names.get(id(module), "")
            module.finalize(_placement(model, name, fallback), dtype)

    def _dequantize(self, model: Any, dtype: torch.dtype | None = None) -> Any:
        """``model.dequantize()``: every LeechqLinear becomes an ``nn.Linear`` holding its exact
        dequantized weight (:meth:`QuantizedWeight.dequantize`, f32 then ``dtype``)."""
        from leechq.nn.replace import leechq_modules

        for name, module in leechq_modules(model).items():
            record = module.record
            if record is None:
                raise InvalidInput(f"{name}: LeechqLinear has no record")
            device = (
                module.bias.device
                if module.bias is not None
                else (
                    module.weight_dense.device
                    if module.weight_dense is not None
                    else torch.device("cpu")
                )
            )
            target = dtype or (module.execution.dtype if module.execution else torch.float32)
            dense = nn.Linear(
                record.d_in, record.d_out, bias=module.bias is not None, device="meta"
            )
            dense.weight = nn.Parameter(
                record.dequantize(torch.float32).to(device, target), requires_grad=False
            )
            if module.bias is not None:
                dense.bias = nn.Parameter(module.bias.detach().to(target), requires_grad=False)
            parent_name, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, leaf, dense)
        return model

    @property
    def is_trainable(self) -> bool:
        """Codes are frozen; nothing to train through a table lookup."""
        return False

    def is_serializable(self, *args: Any, **kwargs: Any) -> bool:
        """``save_pretrained`` writes the canonical records (get_state_dict_and_metadata)."""
        return True

    def get_state_dict_and_metadata(
        self, model: Any
    ) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """The canonical tensors: every record as stored (byte-identical), the rotation tables,
        group-affine raw tensors as loaded, and every other tensor as held."""
        from leechq.formats.quantized_weight import QuantizedWeight
        from leechq.nn.embedding import PackedEmbedding, PackedHead
        from leechq.nn.lattice_embedding import LatticeEmbedding
        from leechq.nn.records import rotation_tensors
        from leechq.nn.replace import leechq_modules

        packed = [n for n, m in model.named_modules()
                  if isinstance(m, (PackedEmbedding, PackedHead))]
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()
                 if not any(k.startswith(p + ".") for p in packed)}
        records = [m.record for m in leechq_modules(model).values()]
        records += [m.record() for m in model.modules() if isinstance(m, LatticeEmbedding)]
        for rec in records:
            if isinstance(rec, QuantizedWeight) and rec.rotation is not None:
                state.update(rotation_tensors(rec.rotation))
        for alias in self.quantization_config.tied:
            state.pop(alias, None)  # stored once, under its target
        captured = self.captured
        for name, desc in self.quantization_config.raw.items():
            if isinstance(desc, dict) and desc.get("encoding") == "quant":
                if name not in captured:
                    raise ArtifactError(
                        f"group-affine tensor {name} was not captured while loading"
                    )
                state.pop(name, None)
                for suffix, t in captured[name].items():
                    state[f"{name}.{suffix}"] = t
        from leechq.formats.integrity import content_metadata

        return state, content_metadata(state)  # no manifest here: the tensors seal themselves


def _untie(model: Any, names: set[str]) -> None:
    """Drop from transformers' tied-weight map every pair that names one of ``names`` (tensors a
    leechq module replaced): transformers must not tie, or look for, those dense parameters."""
    tied_keys = getattr(model, "all_tied_weights_keys", None)
    if isinstance(tied_keys, dict):
        for key in [k for k, v in tied_keys.items() if k in names or v in names]:
            tied_keys.pop(key)


def _placement(model: Any, name: str, fallback: torch.device) -> torch.device:
    """The device ``model.hf_device_map`` gives module ``name`` (longest matching prefix), else
    ``fallback``."""
    dmap = getattr(model, "hf_device_map", None)
    if isinstance(dmap, dict):
        keys = [k for k in dmap if k == "" or name == k or name.startswith(k + ".")]
        if keys:
            where = dmap[max(keys, key=len)]
            if isinstance(where, int):
                return torch.device("cuda", where)
            if str(where) not in ("disk", "meta"):
                return torch.device(where)
    return fallback


if QUANT_METHOD not in AUTO_QUANTIZATION_CONFIG_MAPPING:
    register_quantization_config(QUANT_METHOD)(LeechqHfConfig)
if QUANT_METHOD not in AUTO_QUANTIZER_MAPPING:
    register_quantizer(QUANT_METHOD)(LeechqHfQuantizer)
