"""llama.cpp's quantization types as baselines, run through the same evaluation harness.

Where a user has built llama.cpp's command-line tools (``llama-imatrix`` and ``llama-quantize``;
leechq does not ship or build them), this module makes the model that a llama.cpp user would make
from the same source GGUF and the same calibration text, and hands it back as a float model that
the report evaluates like every other arm:

1. **Importance matrix** (optional, needed by llama.cpp's ``IQ1``/``IQ2`` types): ``llama-imatrix``
   runs the source model over the calibration text in windows of ``context`` tokens and writes the
   per-column mean squared activations that llama.cpp's quantizers weight their error by.
2. **Requantize**: ``llama-quantize --allow-requantize [--imatrix F] SRC OUT TYPE``. llama.cpp
   dequantizes each tensor of the (already 4–6 bit) source GGUF to f32 — the same dense model that
   every leechq arm is measured against (:mod:`leechq.models.hf_load`) — and quantizes it again
   with its own per-tensor choice of types for ``TYPE`` (embedding and head included).
3. **Read back** (:meth:`LlamaCppResult.load`, when the caller wants the model): the output GGUF
   is dequantized by transformers' GGUF loader (the ``gguf`` package's block decoders) into a
   dense f32 model; nothing is cached.

Bits (:func:`gguf_bits`): whole-model bits per parameter by the rule leechq's artifacts follow
(docs/format.md §4, rule 2): each quantized tensor at its stored size, float tensors (norms,
biases; f32 in the file) at 16 bits as a served model keeps them; a tied head is stored once in a
GGUF and counted once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from leechq.errors import ArtifactError, InvalidInput
from leechq.eval.baselines import OTHER_PARAM_BITS  # float tensors: 16 bits (format.md §4)

QUANTIZE_TOOL = "llama-quantize"
IMATRIX_TOOL = "llama-imatrix"
_FLOAT_TYPES = frozenset({"F32", "F16", "BF16", "F64"})
NEEDS_IMATRIX = frozenset({"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S"})  # llama.cpp refuses
# these without an importance matrix
_TAIL = 2000  # characters of a failed tool's output quoted in the error


class ToolFailed(InvalidInput):
    """A llama.cpp tool exited with an error; the message quotes the end of its output."""


@dataclass(frozen=True)
class LlamaCppTools:
    """Paths of the two llama.cpp tools this module runs."""

    quantize: Path
    imatrix: Path


def find_tools(directory: str | os.PathLike[str] | None = None) -> LlamaCppTools:
    """Locate ``llama-quantize`` and ``llama-imatrix``.

    Args:
        directory: where the built tools are (a llama.cpp ``build/bin``); None: search ``PATH``.

    Raises:
        InvalidInput: a tool is missing or not executable (the message says where it looked).
    """
    found: dict[str, Path] = {}
    for tool in (QUANTIZE_TOOL, IMATRIX_TOOL):
        if directory is not None:
            where = Path(directory).expanduser()
            if not where.is_dir():
                raise InvalidInput(f"llama.cpp tools directory {where} does not exist")
            path = where / tool
            ok = path.is_file() and os.access(path, os.X_OK)
            place = str(where)
        else:
            which = shutil.which(tool)
            path = Path(which) if which else Path(tool)
            ok = which is not None
            place = "PATH"
        if not ok:
            raise InvalidInput(
                f"llama.cpp's {tool} was not found in {place}: build llama.cpp's tools "
                f"({QUANTIZE_TOOL}, {IMATRIX_TOOL}) and pass the directory that holds them"
            )
        found[tool] = path
    return LlamaCppTools(found[QUANTIZE_TOOL], found[IMATRIX_TOOL])


def _run(argv: list[str], what: str) -> str:
    """Run a tool; its combined output, or :class:`ToolFailed` quoting the end of it."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise ToolFailed(f"{what}: could not start {argv[0]}: {exc}") from exc
    output = (proc.stdout or "") + (proc.stderr or "")
    if proc.returncode != 0:
        raise ToolFailed(
            f"{what} failed (exit {proc.returncode}): {' '.join(argv)}\n{output[-_TAIL:]}"
        )
    return output


def _threads(threads: int | None) -> int:
    return threads or os.cpu_count() or 1


def compute_imatrix(
    tools: LlamaCppTools,
    source: str | os.PathLike[str],
    text: str,
    out: str | os.PathLike[str],
    *,
    context: int,
    chunks: int,
    threads: int | None = None,
) -> Path:
    """Run ``llama-imatrix`` over ``text`` and write the importance matrix to ``out``.

    Args:
        tools: from :func:`find_tools`.
        source: the source GGUF (the model being quantized).
        text: calibration text; llama.cpp tokenizes it with the GGUF's own tokenizer.
        out: the importance matrix file to write (``.gguf``).
        context: tokens per window (``-c``).
        chunks: windows to run (``--chunks``); the text must hold at least this many.
        threads: CPU threads (default: the machine's count).

    Raises:
        InvalidInput: ``context`` or ``chunks`` below 1, or empty text.
        ToolFailed: the tool exited with an error, or wrote no file.
    """
    if context < 1 or chunks < 1:
        raise InvalidInput(f"imatrix needs context >= 1 and chunks >= 1, got {context}, {chunks}")
    if not text.strip():
        raise InvalidInput("imatrix needs calibration text; it is empty")
    out = Path(out)
    with tempfile.TemporaryDirectory(prefix="leechq-imatrix-") as tmp:
        text_file = Path(tmp) / "calibration.txt"
        text_file.write_text(text, encoding="utf-8")
        _run([str(tools.imatrix), "-m", str(source), "-f", str(text_file), "-o", str(out),
              "-c", str(context), "--chunks", str(chunks), "-t", str(_threads(threads))],
             "llama-imatrix")
    if not out.is_file():
        raise ToolFailed(f"llama-imatrix exited cleanly but wrote no {out}")
    return out


def requantize(
    tools: LlamaCppTools,
    source: str | os.PathLike[str],
    out: str | os.PathLike[str],
    qtype: str,
    *,
    imatrix: str | os.PathLike[str] | None = None,
    threads: int | None = None,
) -> Path:
    """``llama-quantize --allow-requantize``: the source GGUF requantized to llama.cpp's ``qtype``.

    Args:
        tools: from :func:`find_tools`.
        source: the source GGUF.
        out: the GGUF to write; it must not exist (nothing is overwritten).
        qtype: a llama.cpp file type name, e.g. ``"Q2_K"``, ``"IQ2_XS"``, ``"Q3_K_M"``.
        imatrix: an importance matrix from :func:`compute_imatrix` (required by the IQ1/IQ2 types).
        threads: CPU threads (default: the machine's count).

    Raises:
        InvalidInput: ``out`` exists, ``qtype`` is not a type name, or an IQ1/IQ2 type without an
            importance matrix.
        ToolFailed: the tool exited with an error (an unknown type among them), or wrote no file.
    """
    out = Path(out)
    if out.exists():
        raise InvalidInput(f"{out} exists; requantize writes a new file and overwrites nothing")
    name = qtype.upper()
    if not name.replace("_", "").isalnum():
        raise InvalidInput(f"{qtype!r} is not a llama.cpp quantization type name (e.g. Q2_K)")
    if name in NEEDS_IMATRIX and imatrix is None:
        raise InvalidInput(f"llama.cpp's {name} needs an importance matrix (calibration text)")
    argv = [str(tools.quantize), "--allow-requantize"]
    if imatrix is not None:
        argv += ["--imatrix", str(imatrix)]
    argv += [str(source), str(out), name, str(_threads(threads))]
    _run(argv, f"llama-quantize to {name}")
    if not out.is_file():
        raise ToolFailed(f"llama-quantize exited cleanly but wrote no {out}")
    return out


@dataclass(frozen=True)
class GgufBits:
    """Storage of a GGUF's tensors by docs/format.md §4 rule 2.

    Attributes:
        parameters: elements of every tensor (a tied head is one tensor).
        quantized: elements of block-quantized tensors.
        quantized_bits: their stored bits.
        bits_per_param: ``(quantized_bits + 16·(parameters − quantized)) / parameters``.
        types: elements per GGUF tensor type name.
    """

    parameters: int
    quantized: int
    quantized_bits: int
    bits_per_param: float
    types: dict[str, int] = field(default_factory=dict)

    @property
    def bits_per_quantized_weight(self) -> float:
        """Mean stored bits of a quantized element."""
        return self.quantized_bits / self.quantized if self.quantized else float("nan")


def gguf_bits(path: str | os.PathLike[str]) -> GgufBits:
    """Whole-model bits per parameter of a GGUF file (see :class:`GgufBits`).

    Raises:
        ArtifactError: the file is not a readable GGUF or holds no tensors.
    """
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"{path}: not a readable GGUF file ({exc})") from exc
    params = quantized = q_bits = 0
    types: dict[str, int] = {}
    for t in reader.tensors:
        n = int(t.n_elements)
        kind = t.tensor_type.name
        types[kind] = types.get(kind, 0) + n
        params += n
        if kind not in _FLOAT_TYPES:
            quantized += n
            q_bits += int(t.n_bytes) * 8
    if params == 0:
        raise ArtifactError(f"{path}: GGUF holds no tensors")
    bpp = (q_bits + OTHER_PARAM_BITS * (params - quantized)) / params
    return GgufBits(params, quantized, q_bits, bpp, types)


@dataclass
class LlamaCppResult:
    """A llama.cpp-quantized GGUF and how it was made; :meth:`load` reads it back as floats.

    Attributes:
        method: ``"llama.cpp <TYPE>"`` (``+imatrix`` when one was used).
        path: the quantized GGUF.
        bits: :class:`GgufBits` of that file.
        seconds: wall time of the quantization (the importance matrix is the caller's).
    """

    method: str
    path: Path
    bits: GgufBits
    seconds: float

    def load(self) -> Any:
        """The quantized model as a dense ``*ForCausalLM`` (f32, CPU, eval mode).

        Each call reads and dequantizes the file again (transformers' GGUF loader); nothing is
        cached, so a caller holds one such model at a time.
        """
        from leechq.models.hf_load import load_model
        from leechq.models.zoo import ModelSource, check_gguf_metadata

        info = check_gguf_metadata(self.path)
        source = ModelSource("gguf", str(self.path), str(self.path.resolve()), None,
                             info.architecture)
        return load_model(source, use_converted_cache=False).model

    def summary(self) -> dict[str, Any]:
        """JSON-friendly summary (no model)."""
        b = self.bits
        return {"method": self.method, "bits_per_param": b.bits_per_param,
                "bits_per_quantized_weight": b.bits_per_quantized_weight, "types": b.types,
                "seconds": self.seconds}


def llamacpp_quantize(
    source: str | os.PathLike[str],
    qtype: str,
    tools: LlamaCppTools,
    workdir: str | os.PathLike[str],
    *,
    imatrix: str | os.PathLike[str] | None = None,
) -> LlamaCppResult:
    """Requantize ``source`` to ``qtype`` into ``workdir/<TYPE>[+imatrix].gguf`` and account it.

    Args:
        source: the source GGUF (a zoo model's file, or any GGUF transformers can read).
        qtype: llama.cpp type name (see :func:`requantize`).
        tools: from :func:`find_tools`.
        workdir: an existing directory; the file stays there for :meth:`LlamaCppResult.load`.
        imatrix: importance matrix from :func:`compute_imatrix`, or None.

    Returns:
        A :class:`LlamaCppResult` (the model is not loaded).
    """
    start = time.perf_counter()
    tag = "+imatrix" if imatrix is not None else ""
    out = Path(workdir) / f"{qtype.upper()}{tag}.gguf"
    requantize(tools, source, out, qtype, imatrix=imatrix)
    return LlamaCppResult(f"llama.cpp {qtype.upper()}{tag}", out, gguf_bits(out),
                          time.perf_counter() - start)
