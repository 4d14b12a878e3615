"""The llama.cpp baseline's glue: finding the tools, their command lines and failures, GGUF bits.

llama.cpp itself is not installed in CI: the tools here are stand-in scripts that record how they
were called and write what the real tools write (the quantizer copies its source GGUF)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from leechq.errors import ArtifactError, InvalidInput
from leechq.eval import llamacpp
from leechq.eval.llamacpp import (
    ToolFailed,
    compute_imatrix,
    find_tools,
    gguf_bits,
    llamacpp_quantize,
    requantize,
)

_QUANTIZE = """
import json, shutil, sys
args = sys.argv[1:]
json.dump(args, open(__file__ + ".argv", "w"))
if "BOGUS" in args:
    print("main: invalid ftype 'BOGUS'", file=sys.stderr)
    sys.exit(1)
pos = [a for i, a in enumerate(args) if not a.startswith("--")
       and (i == 0 or args[i - 1] != "--imatrix")]
shutil.copy(pos[0], pos[1])
"""

_IMATRIX = """
import json, sys
args = sys.argv[1:]
json.dump(args, open(__file__ + ".argv", "w"))
text = open(args[args.index("-f") + 1], encoding="utf-8").read()
open(__file__ + ".text", "w", encoding="utf-8").write(text)
if "{fail}" == "yes":
    print("imatrix: the model failed to load", file=sys.stderr)
    sys.exit(3)
if "{write}" == "yes":
    open(args[args.index("-o") + 1], "wb").write(b"imatrix")
"""


def _tool(directory: Path, name: str, body: str) -> Path:
    path = directory / name
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(0o755)
    return path


def _tools(tmp_path: Path, *, fail: bool = False, write: bool = True) -> llamacpp.LlamaCppTools:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    _tool(bin_dir, "llama-quantize", _QUANTIZE)
    _tool(bin_dir, "llama-imatrix", _IMATRIX.replace("{fail}", "yes" if fail else "no")
          .replace("{write}", "yes" if write else "no"))
    return find_tools(bin_dir)


def _argv(tool: Path) -> list[str]:
    return json.loads(Path(str(tool) + ".argv").read_text())


def write_gguf(path: Path) -> Path:
    """A GGUF with a 64-element f32 norm and a 2 × 64 Q8_0 matrix (four blocks of 34 bytes)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny")
    writer.add_block_count(1)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(["<s>", "a", "b", " c"])
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(64, dtype=np.float32))
    w = np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64)
    q = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("blk.0.attn_q.weight", q, raw_shape=q.shape,
                      raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_find_tools_names_what_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InvalidInput, match="does not exist"):
        find_tools(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidInput, match=r"llama-quantize was not found in .*empty"):
        find_tools(tmp_path / "empty")
    tools = _tools(tmp_path)
    assert tools.quantize == tmp_path / "bin" / "llama-quantize"
    (tmp_path / "bin" / "llama-imatrix").chmod(0o644)  # present but not executable
    with pytest.raises(InvalidInput, match="llama-imatrix"):
        find_tools(tmp_path / "bin")
    (tmp_path / "bin" / "llama-imatrix").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert find_tools().imatrix == tmp_path / "bin" / "llama-imatrix"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(InvalidInput, match="not found in PATH"):
        find_tools()


def test_requantize_command_line_and_refusals(tmp_path: Path) -> None:
    tools = _tools(tmp_path)
    src = write_gguf(tmp_path / "src.gguf")
    out = requantize(tools, src, tmp_path / "q.gguf", "q2_k", threads=2)
    assert out.read_bytes() == src.read_bytes()
    assert _argv(tools.quantize) == ["--allow-requantize", str(src), str(out), "Q2_K", "2"]
    out2 = requantize(tools, src, tmp_path / "iq.gguf", "IQ2_XS", imatrix=tmp_path / "m.gguf",
                      threads=1)
    assert _argv(tools.quantize) == ["--allow-requantize", "--imatrix", str(tmp_path / "m.gguf"),
                                     str(src), str(out2), "IQ2_XS", "1"]
    with pytest.raises(InvalidInput, match="overwrites nothing"):
        requantize(tools, src, out, "Q2_K")
    with pytest.raises(InvalidInput, match="needs an importance matrix"):
        requantize(tools, src, tmp_path / "x.gguf", "IQ2_XXS")
    with pytest.raises(InvalidInput, match=r"not a llama.cpp quantization type"):
        requantize(tools, src, tmp_path / "x.gguf", "Q2 K; rm")
    with pytest.raises(ToolFailed, match=r"(?s)exit 1.*invalid ftype 'BOGUS'"):
        requantize(tools, src, tmp_path / "x.gguf", "BOGUS")
    assert not (tmp_path / "x.gguf").exists()


def test_imatrix_command_line_and_failures(tmp_path: Path) -> None:
    tools = _tools(tmp_path)
    src = write_gguf(tmp_path / "src.gguf")
    out = compute_imatrix(tools, src, "some calibration text", tmp_path / "m.gguf", context=256,
                          chunks=12, threads=2)
    assert out.read_bytes() == b"imatrix"
    argv = _argv(tools.imatrix)
    assert argv[:2] == ["-m", str(src)] and argv[argv.index("-o") + 1] == str(out)
    assert argv[argv.index("-c") + 1] == "256" and argv[argv.index("--chunks") + 1] == "12"
    assert argv[argv.index("-t") + 1] == "2"
    assert Path(str(tools.imatrix) + ".text").read_text() == "some calibration text"
    with pytest.raises(InvalidInput, match="empty"):
        compute_imatrix(tools, src, "  \n", tmp_path / "n.gguf", context=256, chunks=1)
    with pytest.raises(InvalidInput, match="chunks >= 1"):
        compute_imatrix(tools, src, "text", tmp_path / "n.gguf", context=256, chunks=0)
    with pytest.raises(ToolFailed, match=r"(?s)exit 3.*failed to load"):
        compute_imatrix(_tools(tmp_path / "f", fail=True), src, "t", tmp_path / "n.gguf",
                        context=8, chunks=1)
    with pytest.raises(ToolFailed, match="wrote no"):
        compute_imatrix(_tools(tmp_path / "w", write=False), src, "t", tmp_path / "n.gguf",
                        context=8, chunks=1)


def test_gguf_bits_rule_two(tmp_path: Path) -> None:
    bits = gguf_bits(write_gguf(tmp_path / "m.gguf"))
    assert (bits.parameters, bits.quantized, bits.quantized_bits) == (192, 128, 4 * 34 * 8)
    assert bits.bits_per_quantized_weight == 8.5  # Q8_0: 32 int8 + one f16 scale
    assert bits.bits_per_param == 11.0  # (1088 + 16·64) / 192: the f32 norm counted at 16 bits
    assert bits.types == {"F32": 64, "Q8_0": 128}
    (tmp_path / "bad.gguf").write_bytes(b"not a gguf at all")
    with pytest.raises(ArtifactError, match="not a readable GGUF"):
        gguf_bits(tmp_path / "bad.gguf")


def test_llamacpp_quantize_then_load_reads_the_requantized_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from leechq.models import hf_load

    tools = _tools(tmp_path)
    src = write_gguf(tmp_path / "src.gguf")
    seen: list[tuple[object, dict[str, object]]] = []

    def fake_load(spec: object, **kw: object) -> SimpleNamespace:
        seen.append((spec, kw))
        return SimpleNamespace(model=f"model {len(seen)}")

    monkeypatch.setattr(hf_load, "load_model", fake_load)
    work = tmp_path / "work"
    work.mkdir()
    res = llamacpp_quantize(src, "iq2_xs", tools, work, imatrix=tmp_path / "m.gguf")
    assert res.method == "llama.cpp IQ2_XS+imatrix" and res.path == work / "IQ2_XS+imatrix.gguf"
    assert res.bits.parameters == 192 and res.summary()["types"] == {"F32": 64, "Q8_0": 128}
    assert seen == []  # quantizing loads nothing
    assert res.load() == "model 1" and res.load() == "model 2"  # each call reads the file
    spec, kw = seen[0]
    assert spec.kind == "gguf" and Path(spec.path) == res.path and os.path.isfile(spec.path)
    assert kw == {"use_converted_cache": False}  # a scratch file is never cached
    plain = llamacpp_quantize(src, "Q2_K", tools, work)
    assert plain.method == "llama.cpp Q2_K" and plain.path == work / "Q2_K.gguf"
