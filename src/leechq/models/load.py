"""``leechq.load``: an artifact directory → a causal LM with ``LeechqLinear`` modules.

The standalone loader (docs/architecture.md §1, ``models/load.py``), which shares
the module type, the replacement and the finalize step with the transformers integration
(``leechq.integrations.transformers``) but does not go through ``from_pretrained``:

1. read and validate the artifact through the integrity gate
   (:func:`leechq.formats.integrity.check_artifact`: manifest names, sizes and sha256, schema
   version and field types, codebook fingerprint, every tensor's dtype, shape and finiteness,
   decoded magnitudes; docs/integrity.md);
2. build the model skeleton from ``config.json`` with its parameters on the meta device (buffers
   such as RoPE frequencies are computed normally), in the serving dtype;
3. replace the recorded linears by :class:`LeechqLinear` (:mod:`leechq.nn.replace`);
4. a 4/8-bit group-affine embedding or head table stays packed: the module becomes a
   :class:`~leechq.nn.embedding.PackedEmbedding` / :class:`~leechq.nn.embedding.PackedHead` (a tied
   head reads the embedding's table, no copy); a lattice-coded embedding becomes a
   :class:`~leechq.nn.lattice_embedding.LatticeEmbedding`, see :func:`install_packed_tables`;
5. assign the other raw tensors (norms, biases, dense tables; any other group-affine tensor
   dequantized exactly) and tie a dense head when the config says so; refuse any parameter left
   unloaded;
6. move to the device and finalize every quantized module (dense reference path on CPU, fused
   kernels on CUDA where they exist), then group q/k/v and gate/up for a shared activation rotation.

transformers is imported inside functions only (docs/architecture.md §1).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from leechq.errors import ArtifactError, InvalidInput, UnsupportedArchitecture
from leechq.utils.modules import embedding_scale

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``"auto"``/None → CUDA when available, else CPU; "cpu", "cuda", "cuda:N" or such a
    torch.device as given. Any other device type (tpu, mps, meta, ...) is refused: leechq runs on
    the CPU or on CUDA only."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise InvalidInput(f"unknown device {device!r}; choose auto, cpu, cuda or cuda:N") from exc
    if dev.type not in ("cpu", "cuda"):
        raise InvalidInput(f"unknown device {device!r}; leechq runs on cpu or cuda only")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InvalidInput(f"device {device!r} requested but CUDA is not available on this machine")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise InvalidInput(
            f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)"
        )
    return dev


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """``"auto"``/None → float32 on CPU, bfloat16 on CUDA; else float32/float16/bfloat16."""
    if dtype is None or dtype == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise InvalidInput(f"unknown dtype {dtype!r}; choices: auto, {', '.join(_DTYPES)}")
        return _DTYPES[dtype]
    if dtype not in _DTYPES.values():
        raise InvalidInput(f"leechq serves float32, float16 or bfloat16, not {dtype}")
    return dtype


def base_config(config: dict[str, Any]) -> Any:
    """The transformers config of the base model (``config.json`` without ``quantization_config``).

    Raises:
        UnsupportedArchitecture: no ``model_type``, or one this transformers does not know.
    """
    from transformers import AutoConfig

    cfg = {k: v for k, v in config.items() if k != "quantization_config"}
    model_type = cfg.pop("model_type", None)
    if not model_type:
        raise UnsupportedArchitecture("config.json has no model_type: cannot build the model")
    try:
        return AutoConfig.for_model(model_type, **cfg)
    except (ValueError, KeyError) as exc:
        raise UnsupportedArchitecture(
            f"model_type {model_type!r} is not known to this transformers installation: {exc}"
        ) from exc


def build_skeleton(config: Any, dtype: torch.dtype) -> Any:
    """A causal LM for ``config`` with every parameter on the meta device (buffers materialized).

    Raises:
        UnsupportedArchitecture: the config has no causal-LM model class.
    """
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    try:
        with init_empty_weights(include_buffers=False):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    except ValueError as exc:
        raise UnsupportedArchitecture(
            f"{type(config).__name__} ({config.model_type}) has no causal-LM class in "
            f"transformers: {exc}"
        ) from exc
    return model


def _assign(model: torch.nn.Module, name: str, tensor: torch.Tensor) -> None:
    parent_name, _, leaf = name.rpartition(".")
    try:
        parent = model.get_submodule(parent_name) if parent_name else model
    except AttributeError as exc:
        raise ArtifactError(f"the artifact stores {name}, which this model does not have") from exc
    current = parent._parameters.get(leaf) if leaf in parent._parameters else None
    if current is None and leaf in parent._buffers:
        buf = parent._buffers[leaf]
        parent._buffers[leaf] = (
            tensor.to(buf.dtype)
            if buf is not None and buf.is_floating_point() and tensor.is_floating_point()
            else tensor
        )
        return
    if current is None:
        raise ArtifactError(f"the artifact stores {name}, which this model does not have")
    if tuple(current.shape) != tuple(tensor.shape):
        raise ArtifactError(
            f"tensor {name} is {list(tensor.shape)} in the artifact but {list(current.shape)} "
            "in the "
            "model (different model size or config)"
        )
    value = (
        tensor.to(current.dtype)
        if tensor.is_floating_point() and current.is_floating_point()
        else tensor
    )
    parent._parameters[leaf] = torch.nn.Parameter(value, requires_grad=False)


def _module_name(model: torch.nn.Module, module: Any) -> str | None:
    if module is None:
        return None
    for name, m in model.named_modules():
        if m is module:
            return name
    return None


def _replace_module(model: torch.nn.Module, name: str, module: torch.nn.Module) -> None:
    parent_name, _, leaf = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, leaf, module)


def split_embedding_record(model: torch.nn.Module,
                           records: dict[str, Any]) -> tuple[str | None, Any, dict[str, Any]]:
    """``(the input embedding's module name, its entry in records or None, the other entries)``:
    an artifact made with ``embedding_encoding="lattice"`` records the token embedding under its
    module's name beside the projections (``records``: records, or their descriptors)."""
    get_in = getattr(model, "get_input_embeddings", None)
    emb_name = _module_name(model, get_in() if get_in else None)
    if emb_name is None or emb_name not in records:
        return emb_name, None, records
    return emb_name, records[emb_name], {n: r for n, r in records.items() if n != emb_name}


def install_packed_tables(
    model: torch.nn.Module, art: Any, config: Any, lattice: Any = None
) -> tuple[list[torch.nn.Module], set[str]]:
    """Put packed modules in place of the input embedding / output head stored as group-affine
    or on the lattice.

    The embedding module becomes a :class:`LatticeEmbedding` over ``lattice`` (its record, from
    :func:`split_embedding_record`), or a :class:`PackedEmbedding` when ``<embedding>.weight`` is
    a group-affine tensor of the artifact — either carrying the factor a scaled word embedding
    applied, e.g. Gemma's √dim, as its ``embed_scale``; the head becomes a :class:`PackedHead`
    reading that same table when it is tied to it (``art.tied`` or ``config.tie_word_embeddings``;
    a head the artifact records, coded on the lattice, is its own), or one over its own table when
    ``<head>.weight`` is group-affine. Dense tables are left to the
    dense path.

    Returns:
        ``(modules to finalize, embedding first; tensor names they took over)``.

    Raises:
        ArtifactError: a table that does not fit its module, or a lattice-coded embedding whose
            head is tied to it.
    """
    from leechq.nn.embedding import PackedEmbedding, PackedHead
    from leechq.nn.lattice_embedding import LatticeEmbedding

    get_in = getattr(model, "get_input_embeddings", None)
    get_out = getattr(model, "get_output_embeddings", None)
    emb_name = _module_name(model, get_in() if get_in else None)
    head_name = _module_name(model, get_out() if get_out else None)
    emb_key = f"{emb_name}.weight" if emb_name is not None else None
    head_key = f"{head_name}.weight" if head_name is not None else None
    modules: list[torch.nn.Module] = []
    handled: set[str] = set()
    emb = None
    if lattice is not None:
        module = get_in() if get_in else None
        shape = tuple(getattr(module, "weight", torch.empty(0)).shape)
        if shape != (lattice.d_out, lattice.d_in):
            raise ArtifactError(f"lattice-coded embedding {emb_name}: [{lattice.d_out}, "
                                f"{lattice.d_in}] does not fit the model's {list(shape)}")
        try:
            lat = LatticeEmbedding.from_record(lattice, embedding_scale(module))
        except InvalidInput as exc:
            raise ArtifactError(f"lattice-coded embedding {emb_name}: {exc}") from exc
        _replace_module(model, emb_name, lat)  # type: ignore[arg-type]
        modules.append(lat)
        handled.add(emb_key)  # type: ignore[arg-type]
    elif emb_key in art.raw_quant:
        try:
            emb = PackedEmbedding.from_group_affine(art.raw_quant[emb_key])
        except InvalidInput as exc:
            raise ArtifactError(f"group-affine table {emb_key}: {exc}") from exc
        emb.embed_scale = embedding_scale(get_in())  # type: ignore[misc]
        _replace_module(model, emb_name, emb)  # type: ignore[arg-type]
        modules.append(emb)
        handled.add(emb_key)  # type: ignore[arg-type]
    if head_key is None:
        return modules, handled
    tied = art.tied.get(head_key) == emb_key or (
        head_key not in art.raw
        and head_key not in art.raw_quant
        and head_name not in art.records  # a lattice-coded head is its own
        and bool(getattr(config, "tie_word_embeddings", False))
    )
    if lattice is not None and tied:
        raise ArtifactError(f"{head_key} is tied to the lattice-coded embedding {emb_key}: a "
                            f"lattice table serves no head (quantize with 'int4' or 'int8')")
    head = None
    if emb is not None and tied:
        head = PackedHead.tied_to(emb)
    elif head_key in art.raw_quant:
        try:
            head = PackedHead.from_group_affine(art.raw_quant[head_key])
        except InvalidInput as exc:
            raise ArtifactError(f"group-affine table {head_key}: {exc}") from exc
    if head is not None:
        _replace_module(model, head_name, head)  # type: ignore[arg-type]
        modules.append(head)
        handled.add(head_key)
    return modules, handled


def load(
    path: str | os.PathLike[str],
    device: str | torch.device | None = "auto",
    dtype: str | torch.dtype | None = "auto",
    *,
    prefer: str = "auto",
    verify: bool = True,
    tokenizer: bool = True,
) -> tuple[Any, Any]:
    """Load an artifact as a ready-to-run causal LM.

    Args:
        path: the artifact directory (``leechq quantize`` output), or a published Tetra checkpoint
            (``quant_method: "llvq"``, converted losslessly on the fly).
        device: "auto" (CUDA when present), "cpu", "cuda", "cuda:N" or a torch.device.
        dtype: activation dtype, "auto" = float32 on CPU, bfloat16 on CUDA.
        prefer: kernel preference for every quantized module: "auto", "reference" or "fused"
            (see :meth:`LeechqLinear.finalize`), packed embedding/head tables included
            (:meth:`PackedEmbedding.finalize`, :meth:`PackedHead.finalize`).
        verify: check every file's sha256 against the manifest (sizes are always checked).
        tokenizer: also load the tokenizer stored in the directory.

    Returns:
        ``(model, tokenizer)``: the model in eval mode (tokenizer None when ``tokenizer=False``).

    Raises:
        ArtifactError: a missing, corrupt or inconsistent artifact, or a missing tokenizer.
        IncompatibleVersion: a schema version this build does not read.
        FingerprintMismatch: a codebook this build decodes differently.
        UnsupportedArchitecture: a model type transformers cannot build, or records that do not fit.
    """
    from leechq.formats.integrity import check_artifact
    from leechq.models.convert import is_tetra_dir, read_tetra_as_artifact
    from leechq.models.experts import needs_split, split_experts
    from leechq.nn.replace import (
        finalize_all,
        leechq_modules,
        replace_with_records,
        share_groups,
    )

    root = Path(path)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    # A published Tetra checkpoint is converted on the fly (leechq.models.convert, lossless).
    art = read_tetra_as_artifact(root) if is_tetra_dir(root) else check_artifact(root, verify=verify)
    config = base_config(art.config)
    model = build_skeleton(config, dt)
    if needs_split(art.records):  # experts quantized one matrix each (leechq.models.experts)
        split_experts(model, copy_weights=False)
    _, lattice, records = split_embedding_record(model, art.records)
    replace_with_records(model, records)

    packed, handled = install_packed_tables(model, art, config, lattice)
    state: dict[str, torch.Tensor] = dict(art.raw)
    for name, ga in art.raw_quant.items():
        if name not in handled:  # a group-affine tensor that is not an embedding/head table
            state[name] = ga.dequantize(torch.float32)
    for name, tensor in state.items():
        _assign(model, name, tensor)
    tied_aliases = set(art.tied)
    if not packed and (getattr(config, "tie_word_embeddings", False) or tied_aliases):
        model.tie_weights()
    for alias, target in art.tied.items():
        if alias in handled:
            continue  # a packed tied head reads the embedding's table already
        # The artifact's word is final: an alias must end up sharing its target's storage.
        try:
            a, t = model.get_parameter(alias), model.get_parameter(target)
        except AttributeError as exc:
            raise ArtifactError(f"tied alias {alias} → {target}: no such parameter") from exc
        if a.data_ptr() != t.data_ptr():
            _assign(model, alias, t.detach())
    missing = [
        n for n, p in model.named_parameters(remove_duplicate=False) if p.device.type == "meta"
    ]
    if missing:
        raise ArtifactError(
            f"{root}: the artifact lacks {len(missing)} model tensor(s), e.g. {missing[:3]}"
        )

    model.to(dev)
    modules = leechq_modules(model)
    finalize_all(modules, dev, dt, prefer=prefer)
    for module in packed:  # the embedding before a head that reads its table
        module.finalize(dev, dt, prefer=prefer)
    share_groups(modules)
    model.eval()
    model.requires_grad_(False)
    model.config.quantization_config = dict(art.quantization_config)
    model.leechq_artifact = str(root)
    tok = load_tokenizer(root) if tokenizer else None
    return model, tok


def load_tokenizer(path: str | os.PathLike[str]) -> Any:
    """The tokenizer stored in an artifact directory.

    Raises:
        ArtifactError: the directory holds no tokenizer files (or they cannot be read).
    """
    root = Path(path)
    names = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
    if not any((root / n).is_file() for n in names):
        raise ArtifactError(
            f"{root}: no tokenizer files (looked for {', '.join(names)}); "
            "re-run `leechq quantize`, "
            "which copies the tokenizer, or pass tokenizer=False"
        )
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(root))
    except (OSError, ValueError, KeyError) as exc:
        raise ArtifactError(f"{root}: the tokenizer files cannot be loaded: {exc}") from exc
