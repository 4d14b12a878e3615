"""Load a reference model (zoo alias, GGUF file, local HF directory or hub id) through transformers.

The returned model is a dense ``*ForCausalLM`` on the requested device and dtype plus its tokenizer;
experts stored as one 3-D parameter are split into one linear per expert matrix
(:mod:`leechq.models.experts`: same outputs), so every consumer — the quantizer, the recipe's
reference, the baselines — sees the module tree the artifact records.
It is the *reference* arm of every comparison: the model a quantizer starts from and the one KL and
agreement are measured against.

GGUF sources: transformers reads a ``.gguf`` with ``from_pretrained(dir, gguf_file=name)`` and, with
``GgufConfig(dequantize=True)``, unpacks every (4–6 bit) GGUF block into dense f32. That dequantized
model *is* the reference; it is not the original bf16 release of the model. Converting is slow (the
tokenizer is rebuilt from the GGUF vocabulary and every tensor is dequantized: tens of seconds on
CPU), so the first load writes the dequantized model as a plain safetensors directory under
``<cache root>/converted/<gguf sha256[:16]>/`` (temp dir + rename) and later loads read that
directory (a few seconds). The converted weights are the same f32 values bit for bit.

transformers is imported only inside functions (docs/architecture.md §1).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from leechq.data.cache import cache_root
from leechq.errors import InvalidInput
from leechq.models.arch import ArchSpec, arch_of
from leechq.models.experts import split_experts
from leechq.models.zoo import ModelSource, resolve_model
from leechq.utils.hashing import sha256_file

_CONVERTED_MARKER = "leechq-converted.json"


@dataclass
class LoadedModel:
    """A loaded reference model.

    Attributes:
        model: the transformers causal LM (``eval()`` mode, gradients off).
        tokenizer: its tokenizer.
        source: where it came from.
        arch: its architecture facts.
        seconds: wall time of the load (including any conversion).
        converted_dir: the converted safetensors directory used or written, if any.
    """

    model: Any
    tokenizer: Any
    source: ModelSource
    arch: ArchSpec
    seconds: float
    converted_dir: Path | None = None


def converted_cache_dir() -> Path:
    """Root of the converted-GGUF cache: ``cache_root() / "converted"``."""
    return cache_root() / "converted"


def _torch_dtype(dtype: Any) -> Any:
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    names = {
        "float32": torch.float32,
        "f32": torch.float32,
        "float16": torch.float16,
        "f16": torch.float16,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float64": torch.float64,
        "f64": torch.float64,
    }
    if dtype not in names:
        raise InvalidInput(f"unknown dtype {dtype!r}; choices: {', '.join(sorted(names))}")
    return names[dtype]


def load_model(
    spec: str | ModelSource,
    *,
    device: str = "cpu",
    dtype: Any = "float32",
    use_converted_cache: bool = True,
    download: bool = True,
) -> LoadedModel:
    """Load a reference causal LM and its tokenizer.

    Args:
        spec: zoo alias, ``.gguf`` path, transformers directory, hub id, or a resolved source.
        device: torch device string for the model.
        dtype: torch dtype or name (``"float32"``, ``"bfloat16"``, ...). GGUF models are dequantized
            in f32 and then cast.
        use_converted_cache: for GGUF sources, read/write the dequantized safetensors copy.
        download: allow fetching zoo aliases.

    Returns:
        A :class:`LoadedModel` with the model in eval mode.

    Raises:
        InvalidInput, ArtifactError, UnsupportedArchitecture: see
            :func:`~leechq.models.zoo.resolve_model` and :func:`~leechq.models.arch.arch_of`.
    """

    start = time.perf_counter()
    source = spec if isinstance(spec, ModelSource) else resolve_model(spec, download=download)
    torch_dtype = _torch_dtype(dtype)
    conv: Path | None = None
    if source.kind == "gguf":
        if use_converted_cache:
            sha = source.sha256 or sha256_file(source.path)
            conv = converted_cache_dir() / sha[:16]
            if not (conv / _CONVERTED_MARKER).is_file():
                model, tokenizer = _load_gguf(source)
                write_converted(model, tokenizer, conv, source, sha)
                del model, tokenizer
            model, tokenizer = _load_dir(str(conv), torch_dtype)
        else:
            model, tokenizer = _load_gguf(source)
            model = model.to(torch_dtype)
    else:
        model, tokenizer = _load_dir(source.path, torch_dtype)
    model = model.to(device).eval()
    model.requires_grad_(False)
    arch = arch_of(model)
    split_experts(model)  # one linear per expert matrix, as the quantizer and the artifact see them
    return LoadedModel(model, tokenizer, source, arch, time.perf_counter() - start, conv)


def load_tokenizer(spec: str | ModelSource, *, download: bool = True) -> Any:
    """Load only the tokenizer of a model spec (converted cache used when present)."""
    from transformers import AutoTokenizer

    source = spec if isinstance(spec, ModelSource) else resolve_model(spec, download=download)
    if source.kind == "gguf":
        if source.sha256:
            conv = converted_cache_dir() / source.sha256[:16]
            if (conv / _CONVERTED_MARKER).is_file():
                return AutoTokenizer.from_pretrained(str(conv))
        return AutoTokenizer.from_pretrained(source.gguf_dir, gguf_file=source.gguf_file)
    return AutoTokenizer.from_pretrained(source.path)


def _load_gguf(source: ModelSource) -> tuple[Any, Any]:
    """Dequantize a GGUF with transformers (f32); returns (model, tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, Any] = {"gguf_file": source.gguf_file}
    try:
        from transformers import GgufConfig

        # Ask for dense weights explicitly: with the optional `kernels` package transformers would
        # otherwise keep GGUF blocks, and the reference must be a plain dense model.
        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:  # older transformers always dequantize GGUF files
        pass
    tokenizer = AutoTokenizer.from_pretrained(source.gguf_dir, gguf_file=source.gguf_file)
    model = AutoModelForCausalLM.from_pretrained(source.gguf_dir, dtype=torch.float32, **kwargs)
    return model, tokenizer


def _load_dir(path: str, torch_dtype: Any) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    return model, tokenizer


def write_converted(
    model: Any, tokenizer: Any, dest: Path, source: ModelSource, sha256: str
) -> None:
    """Write a dequantized GGUF model as a plain transformers directory (temp dir + rename).

    transformers refuses ``save_pretrained`` on a model loaded from GGUF, so the directory is
    written by hand: ``config.json`` without ``quantization_config``, ``model.safetensors`` with
    every tensor (a tied head is stored once, under the embedding's name), the tokenizer files,
    the generation config, and a marker JSON recording the GGUF's sha256 and the transformers
    version.
    """
    import transformers
    from safetensors.torch import save_file

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}-"))
    os.chmod(tmp, 0o755)  # mkdtemp creates 0700; the cache may be shared
    try:
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        config["dtype"] = "float32"
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        tensors: dict[str, Any] = {}
        seen: dict[int, str] = {}
        for name, tensor in model.state_dict().items():
            ptr = tensor.data_ptr()
            if ptr in seen:  # tied weights: transformers re-ties them on load
                continue
            seen[ptr] = name
            tensors[name] = tensor.detach().to("cpu").contiguous()
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        tokenizer.save_pretrained(str(tmp))
        gen = getattr(model, "generation_config", None)
        if gen is not None:
            gen.save_pretrained(str(tmp))
        marker = {
            "gguf_sha256": sha256,
            "source": source.to_dict(),
            "transformers": transformers.__version__,
        }
        (tmp / _CONVERTED_MARKER).write_text(json.dumps(marker, indent=1))
        if (dest / _CONVERTED_MARKER).is_file():  # another process finished first; equally valid
            shutil.rmtree(tmp, ignore_errors=True)
            return
        if dest.exists():  # a leftover without marker is incomplete by construction
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
