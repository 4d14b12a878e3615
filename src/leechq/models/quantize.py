"""Model glue: quantize a transformers decoder-only causal LM block by block.

Implements docs/quantizer.md §2's sequential procedure for any family :mod:`leechq.models.arch`
knows, on top of the generic driver :func:`leechq.quant.layerwise.quantize_blocks`, then writes the
artifact (:mod:`leechq.formats.artifact`). Nothing here is specific to a family: each decoder layer
runs its own ``forward`` on the arguments the model itself passed it, and every linear the
architecture walk finds in it is quantized (experts stored as one 3-D parameter are split into one
linear per expert matrix first, :mod:`leechq.models.experts`).

How standalone decoder-layer calls get their extra arguments: every decoder layer is temporarily
replaced by a capture stub and the model is run on one calibration batch; the stubs record what the
model passes to each layer (positional and keyword: the causal or sliding-window mask of that
layer's attention type, the rotary ``(cos, sin)`` — global or local —, the position ids, ...) and
the first stub records the embeddings. The last stub stops the forward, so the head never runs.
Which linears a block holds and which activation each reads come from :mod:`leechq.models.arch`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from leechq.config import CONTROL_CODEBOOKS, QuantConfig
from leechq.errors import InvalidInput
from leechq.formats.artifact import GroupAffine, write_artifact
from leechq.formats.output_paths import check_output_path, check_replaceable
from leechq.models.arch import ArchSpec, arch_of
from leechq.models.experts import split_experts
from leechq.models.head import check_lattice_head, head_block
from leechq.quant.calibration import token_digest
from leechq.quant.layerwise import LinearSpec, Record, RunResult, quantize_blocks, resolve_device

log = logging.getLogger("leechq.models")


class _StopForward(Exception):
    """Raised by the last capture stub: nothing after the decoder layers needs to run."""


class _CaptureStub(torch.nn.Module):
    """Stands in for decoder layer ``index`` while the model runs once: records what it is called
    with (hidden states of layer 0, the other positional and keyword arguments of every layer).
    Attributes of the real layer (``attention_type`` and the like, which some models read while
    building masks) stay visible through the stub."""

    def __init__(
        self,
        index: int,
        sink: dict[int, Any],
        last: bool,
        hidden_sink: list[torch.Tensor],
        layer: torch.nn.Module,
    ):
        super().__init__()
        self.index = index
        self.sink = sink
        self.last = last
        self.hidden_sink = hidden_sink
        object.__setattr__(self, "_real", layer)  # not a submodule: its weights stay put

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(object.__getattribute__(self, "_real"), name)

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        if args:
            hidden_states, rest = args[0], args[1:]
        elif "hidden_states" in kwargs:
            hidden_states, rest = kwargs.pop("hidden_states"), ()
        else:
            raise InvalidInput("a decoder layer was called without hidden states")
        if self.index == 0:
            self.hidden_sink.append(hidden_states)
        self.sink[self.index] = (rest, kwargs)
        if self.last:
            raise _StopForward
        return hidden_states


def _cast(obj: Any, device: torch.device, dtype: torch.dtype) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device=device, dtype=dtype) if obj.is_floating_point() else obj.to(device)
    if isinstance(obj, tuple):
        return tuple(_cast(o, device, dtype) for o in obj)
    if isinstance(obj, list):
        return [_cast(o, device, dtype) for o in obj]
    if isinstance(obj, dict):
        return {k: _cast(v, device, dtype) for k, v in obj.items()}
    return obj


class _HFBlock:
    """One decoder layer as a :class:`leechq.quant.layerwise.Block`."""

    def __init__(
        self,
        index: int,
        layer: torch.nn.Module,
        linears: list[LinearSpec],
        kwargs_by_batch: dict[int, tuple[tuple[Any, ...], dict[str, Any]]],
    ):
        self.index = index
        self.layer = layer
        self.linears = linears
        self._kwargs_by_batch = kwargs_by_batch
        self._active: dict[int, tuple[tuple[Any, ...], dict[str, Any]]] = {}

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        captured = self._active.get(hidden.shape[0])
        if captured is None:
            raise InvalidInput(
                f"no captured layer arguments for a batch of {hidden.shape[0]} windows"
            )
        args, kwargs = captured
        out = self.layer(hidden, *args, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    @contextmanager
    def activate(self, device: torch.device, dtype: torch.dtype) -> Iterator[None]:
        param = next(self.layer.parameters())
        orig_device, orig_dtype = param.device, param.dtype
        self.layer.to(device=device, dtype=dtype)
        self._active = {b: _cast(kw, device, dtype) for b, kw in self._kwargs_by_batch.items()}
        try:
            yield
        finally:
            self._active = {}
            self.layer.to(device=orig_device, dtype=orig_dtype)


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return any(name == p or name.endswith("." + p) for p in patterns)


def check_model(model: Any) -> ArchSpec:
    """Check that ``model`` is a supported causal LM with finite weights; return its family.

    Fused 3-D experts are split into per-expert linears here (in place, same outputs).

    Raises:
        UnsupportedArchitecture: an unknown family or module layout.
        InvalidInput: a parameter with NaN/inf values (named).
    """
    arch = arch_of(model)
    arch.layers(model)
    split_experts(model)
    for name, p in model.named_parameters():
        if p.is_floating_point() and not bool(torch.isfinite(p).all()):
            raise InvalidInput(
                f"model parameter {name} has NaN or inf values; refusing to quantize"
            )
    return arch


def tensor_digest(t: torch.Tensor) -> str:
    """sha256 (hex) of a tensor's dtype, shape and every byte of its contents (row-major)."""
    h = hashlib.sha256(f"{t.dtype}|{tuple(t.shape)}|".encode())
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    if flat.numel():
        h.update(memoryview(flat.view(torch.uint8).numpy()))
    return h.hexdigest()


def _model_fingerprint(model: Any) -> str:
    """Identity of the weights: the full content hash of every state-dict tensor, by name.

    The resume key (with the configuration and the calibration digest): editing any single value
    of the source model changes it, so a checkpoint of another model is never reused.
    """
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(f"{name}|{tensor_digest(t)}\n".encode())
    return h.hexdigest()[:32]


def capture_layer_inputs(
    model: Any,
    arch: ArchSpec,
    batches: Sequence[torch.Tensor],
    device: torch.device,
    dtype: torch.dtype,
) -> tuple[list[torch.Tensor], list[dict[int, tuple[tuple[Any, ...], dict[str, Any]]]]]:
    """Embeddings entering block 0 and the keyword arguments each block receives.

    Args:
        batches: int64 token windows, one tensor [b, seq] per forward batch.

    Returns:
        (hidden states per batch [b, seq, d] in ``dtype`` on ``device``, per layer: {batch size:
         (positional arguments after the hidden states, keyword arguments)} — captured from one
         batch of each size).
    """
    layers = arch.layers(model)
    n = len(layers)
    originals = list(layers)
    kwargs_by_layer: list[dict[int, tuple[tuple[Any, ...], dict[str, Any]]]] = [
        {} for _ in range(n)
    ]
    states: list[torch.Tensor] = []
    sink: dict[int, Any] = {}
    hidden_sink: list[torch.Tensor] = []
    for i in range(n):
        layers[i] = _CaptureStub(i, sink, i == n - 1, hidden_sink, originals[i])
    params = list(model.parameters())
    orig_device = params[0].device if params else torch.device("cpu")
    embedding = arch.embedding(model)
    embed_dtype = embedding.weight.dtype
    try:
        model.to(device)  # only the modules outside the blocks (the stubs hold no weights)
        # Embeddings in the compute dtype, so that the rotary tables and masks are built in it too.
        embedding.to(dtype)
        with torch.no_grad():
            for batch in batches:
                sink.clear()
                hidden_sink.clear()
                with suppress(_StopForward):
                    model(input_ids=batch.to(device), use_cache=False)
                if len(sink) != n or len(hidden_sink) != 1:
                    raise InvalidInput(
                        "the model did not call every decoder layer once; unsupported forward"
                    )
                states.append(hidden_sink[0].to(device=device, dtype=dtype))
                b = int(batch.shape[0])
                if b not in kwargs_by_layer[0]:
                    for i in range(n):
                        rest, kw = sink[i]
                        kwargs_by_layer[i][b] = (
                            rest,
                            {
                                k: v
                                for k, v in kw.items()
                                if k not in ("cache", "past_key_values", "use_cache")
                            },
                        )
    finally:
        for i in range(n):
            layers[i] = originals[i]
        embedding.to(embed_dtype)
        model.to(orig_device)
    return states, kwargs_by_layer


@dataclass
class ModelQuantization:
    """Everything :func:`quantize_model_in_place` produced.

    Attributes:
        records: linear name → record (the model's linears hold the decoded weights).
        raw: every other tensor to store (dense, or :class:`GroupAffine` for the embedding/head).
        tied: alias → stored tensor name.
        stats: per-matrix relative weight error and relative proxy loss.
        seconds: quantization wall time (blocks), capture time included in ``capture_seconds``.
        provenance: identity of the run (model fingerprint, calibration digest, versions).
        phase_seconds: the blocks' wall time per driver phase
            (:attr:`leechq.quant.layerwise.RunResult.phase_seconds`); not stored in the artifact.
    """

    records: dict[str, Record]
    raw: dict[str, torch.Tensor | GroupAffine]
    tied: dict[str, str]
    stats: dict[str, dict[str, float]]
    seconds: float
    capture_seconds: float
    provenance: dict[str, Any] = field(default_factory=dict)
    phase_seconds: dict[str, float] = field(default_factory=dict)


def _raw_tensors(
    model: Any, arch: ArchSpec, records: dict[str, Record], config: QuantConfig
) -> tuple[dict[str, torch.Tensor | GroupAffine], dict[str, str]]:
    quantized = {f"{name}.weight" for name in records}
    tied: dict[str, str] = {}
    raw: dict[str, torch.Tensor | GroupAffine] = {}
    seen: dict[tuple[int, int, tuple[int, ...]], str] = {}
    for name, t in model.state_dict(keep_vars=False).items():
        if name in quantized:
            continue
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if t.numel() and key in seen:
            tied[name] = seen[key]
            continue
        seen[key] = name
        raw[name] = t.detach().cpu()
    if config.embedding_encoding in ("int8", "int4"):
        bits = 8 if config.embedding_encoding == "int8" else 4
        embed_name = f"{arch.embed_path}.weight"
        head_name = f"{arch.head_path}.weight"
        for name in (embed_name, head_name):
            t = raw.get(name)
            if isinstance(t, torch.Tensor):
                raw[name] = GroupAffine.quantize(t, bits, config.embedding_group)
    return raw, tied


def lattice_embedding(model: Any, arch: ArchSpec, config: QuantConfig,
                      progress: bool = False) -> Record:
    """Code ``model``'s token embedding on the lattice (``leechq.quant.embedding``, a progress
    bar with ``progress``) and make the model evaluate the decoded table; returns the record
    (stored under the module's name). The caller has checked the model and config
    (``leechq.quant.tables.check_lattice_table``)."""
    from leechq.quant.embedding import encode_embedding

    module = arch.embedding(model)
    t0 = time.perf_counter()
    log.info("coding the token embedding %s on the lattice", list(module.weight.shape))
    record = encode_embedding(module.weight, config, name=f"{arch.embed_path}.weight",
                              progress=progress)
    with torch.no_grad():
        module.weight.copy_(record.dequantize(torch.float32).to(module.weight.dtype))
    log.info("token embedding coded in %.1f s", time.perf_counter() - t0)
    return record


def _apply_raw_quant(model: Any, raw: dict[str, torch.Tensor | GroupAffine]) -> None:
    """Make the in-memory model evaluate the group-affine embedding/head it will be stored with."""
    params = dict(model.named_parameters())
    for name, t in raw.items():
        if isinstance(t, GroupAffine) and name in params:
            with torch.no_grad():
                params[name].copy_(t.dequantize(torch.float32).to(params[name].dtype))


def quantize_model_in_place(
    model: Any,
    calib_windows: torch.Tensor,
    config: QuantConfig,
    *,
    progress: bool = True,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    model_id: str | None = None,
    on_block: Any = None,
) -> ModelQuantization:
    """Quantize every decoder-block projection of ``model`` in place (weights become the decoded
    ones), and the output head too with ``config.lattice_head`` (:mod:`leechq.models.head`).

    Args:
        model: a transformers causal LM of a family :mod:`leechq.models.arch` knows.
        calib_windows: int64 [n_windows, seq] calibration token windows
            (:func:`leechq.quant.calibration.calibration_windows`).
        config: the resolved configuration.
        progress: tqdm progress bar.
        checkpoint_dir: resumable run directory (see :class:`leechq.quant.layerwise.Checkpoint`).
        model_id: a name recorded in the provenance.
        on_block: callback after each committed block (tests).
    """
    arch = check_model(model)
    if config.embedding_encoding == "lattice":  # refused before any work, not after the blocks
        from leechq.quant.tables import check_lattice_table

        check_lattice_table(model, f"{arch.embed_path}.weight", f"{arch.head_path}.weight",
                            config)
    if config.lattice_head:
        check_lattice_head(model, arch)
    if calib_windows.dim() != 2 or calib_windows.dtype != torch.int64:
        raise InvalidInput(
            f"calib_windows must be int64 [n, seq], got {calib_windows.dtype} "
            f"{list(calib_windows.shape)}"
        )
    vocab = getattr(model.config, "vocab_size", None)
    if vocab is not None and calib_windows.numel() and int(calib_windows.max()) >= vocab:
        raise InvalidInput(f"calibration token id {int(calib_windows.max())} >= vocab size {vocab}")
    device = resolve_device(config.device)
    dtype = getattr(torch, config.dtype)
    was_training = model.training
    model.eval()
    started = time.perf_counter()
    batches = [
        calib_windows[i : i + config.calib_batch]
        for i in range(0, calib_windows.shape[0], config.calib_batch)
    ]
    states, kwargs_by_layer = capture_layer_inputs(model, arch, batches, device, dtype)
    capture_seconds = time.perf_counter() - started
    layers = arch.layers(model)
    blocks = []
    for i, layer in enumerate(layers):
        specs = [
            LinearSpec(
                name=f"{arch.layers_path}.{i}.{p.name}",
                module=layer.get_submodule(p.name),
                act=p.act,
                int4=_matches(f"{arch.layers_path}.{i}.{p.name}", config.int4_modules),
            )
            for p in arch.block_projections(layer)
        ]
        blocks.append(_HFBlock(i, layer, specs, kwargs_by_layer[i]))
    if config.lattice_head:  # one more block: the head reads the final norm of the last output
        blocks.append(head_block(model, arch, len(layers),
                                 int4=_matches(arch.head_path, config.int4_modules)))
    provenance = {
        "model_id": model_id,
        "model_type": model.config.model_type,
        "model_fingerprint": _model_fingerprint(model),
        "calibration_digest": token_digest(calib_windows),
        "calibration_shape": list(calib_windows.shape),
    }
    run_id = hashlib.sha256(
        json.dumps([config.digest(), provenance], sort_keys=True).encode()
    ).hexdigest()
    result: RunResult = quantize_blocks(
        blocks,
        states,
        config,
        checkpoint_dir=checkpoint_dir,
        run_id=run_id,
        progress=progress,
        on_block=on_block,
    )
    records = dict(result.records)
    if config.embedding_encoding == "lattice":
        records[arch.embed_path] = lattice_embedding(model, arch, config, progress)
    raw, tied = _raw_tensors(model, arch, records, config)
    _apply_raw_quant(model, raw)
    if was_training:
        model.train()
    import leechq

    provenance.update(
        {
            "leechq_version": leechq.__version__,
            "torch_version": torch.__version__,
            "device": str(device),
            "quantize_seconds": result.seconds,
            "capture_seconds": capture_seconds,
            "resumed_blocks": result.resumed_blocks,
        }
    )
    return ModelQuantization(
        records=records,
        raw=raw,
        tied=tied,
        stats=result.stats,
        seconds=result.seconds,
        capture_seconds=capture_seconds,
        provenance=provenance,
        phase_seconds=dict(result.phase_seconds),
    )


def quantize_model(
    model: Any,
    tokenizer: Any,
    calib_windows: torch.Tensor,
    config: QuantConfig,
    out_dir: str | os.PathLike[str],
    progress: bool = True,
    *,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    model_id: str | None = None,
    overwrite: bool = False,
    keep_checkpoint: bool = False,
) -> Path:
    """Quantize ``model`` and write the artifact directory ``out_dir``.

    Args:
        model: a transformers causal LM of a supported family (modified in place: its projections
            hold the decoded weights afterwards, so it can be evaluated directly).
        tokenizer: its tokenizer (files copied into the artifact), or None.
        calib_windows: int64 [n_windows, seq] calibration windows.
        config: the resolved configuration (codebook must be a real codebook, not a control).
        out_dir: the artifact directory (written atomically).
        progress: tqdm progress bar.
        checkpoint_dir: resumable run directory; defaults to ``<out_dir>.ckpt``; removed after
            success unless ``keep_checkpoint``.
        model_id: recorded in the provenance.
        overwrite: replace an existing artifact.

    Returns:
        The artifact path.
    """
    out = Path(out_dir)
    if config.codebook in CONTROL_CODEBOOKS:
        raise InvalidInput(
            f"codebook {config.codebook!r} is a control quantizer and cannot write an artifact"
        )
    if (out.exists() or out.is_symlink()) and not overwrite:
        raise InvalidInput(f"{out} already exists (pass overwrite=True to replace it)")
    check_output_path(out)
    check_replaceable(out)  # before hours of work: only a complete leechq artifact is replaced
    ckpt = Path(checkpoint_dir) if checkpoint_dir is not None else out.with_name(out.name + ".ckpt")
    mq = quantize_model_in_place(
        model, calib_windows, config, progress=progress, checkpoint_dir=ckpt, model_id=model_id
    )
    base = model.config.to_dict()
    base.pop("quantization_config", None)
    stats = mq.stats
    provenance = dict(mq.provenance)
    if stats:
        provenance["mean_relative_weight_error"] = sum(s["rel_err"] for s in stats.values()) / len(
            stats
        )
        provenance["mean_relative_proxy_loss"] = sum(s["proxy"] for s in stats.values()) / len(
            stats
        )
    path = write_artifact(
        out,
        base_config=base,
        quant_config=config,
        records=mq.records,  # type: ignore[arg-type]
        raw=mq.raw,
        tied=mq.tied,
        tokenizer=tokenizer,
        provenance=provenance,
        overwrite=overwrite,
    )
    if not keep_checkpoint:
        import shutil

        shutil.rmtree(ckpt, ignore_errors=True)
    log.info("wrote %s (%d records) in %.1f s", path, len(mq.records), mq.seconds)
    return path
