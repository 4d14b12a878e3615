"""``leechq inspect`` on a published Tetra directory (``quant_method: "llvq"``): the report a
leechq artifact gets, with the same numbers as the artifact it was written from; what was
verified; bad directories as one-line errors (exit 2)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from leechq_tiny import make_tetra_dir

from leechq.cli.main import main
from leechq.formats.accounting import artifact_report

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``(artifact, the Tetra directory written from it)``: random valid Tetra records, an int4
    v_proj, a 4-bit embedding table, bf16 norms, the tiny tokenizer."""
    art, tetra = make_tetra_dir(tmp_path_factory.mktemp("inspect-tetra"), "qwen3")
    return Path(art), tetra


def _one_line_error(capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("leechq inspect: error:") and "\n" not in err, err
    for n in needles:
        assert n in err, err
    return err


def test_tetra_directory_reports_what_its_artifact_reports(
    dirs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    art, tetra = dirs
    assert main(["inspect", str(tetra), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    want = artifact_report(art)
    assert got["matrices"] == want["matrices"]
    assert got["counts"]["parameters"] == want["counts"]["parameters"]
    for key in ("quantized_weights", "lattice_records", "int4_records"):
        assert got["counts"][key] == want["counts"][key] > 0
    for key in ("code_bits_per_weight", "kernel_bits_per_weight",
                "projection_stored_bits_per_weight", "whole_model_bits_per_param"):
        assert got["rates"][key] == pytest.approx(want["rates"][key], rel=1e-12)
    size = (tetra / "model.safetensors").stat().st_size
    assert got["counts"]["model_safetensors_bytes"] == size
    assert got["rates"]["on_disk_bits_per_param"] == pytest.approx(
        8 * size / got["counts"]["parameters"])
    assert got["config"]["embedding_encoding"] == "int4" and got["config"]["rotate"]
    assert got["config"]["int4_modules"] == ["self_attn.v_proj"]
    assert [n for n, m in got["matrices"].items() if m["kind"] == "int4"] == [
        f"model.layers.{i}.self_attn.v_proj" for i in range(2)]


def test_tetra_directory_text_says_format_and_verification(
    dirs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, tetra = dirs
    assert main(["inspect", str(tetra)]) == 0
    out = capsys.readouterr().out
    assert "published Tetra directory (quant_method 'llvq', llvq_layout_version 1)" in out
    assert "verified against" in out and "NOT verified" not in out
    assert "kernel rate" in out and "whole-model rate" in out and "on-disk rate" in out
    assert "*.v_proj" in out and "int4" in out
    assert main(["inspect", str(tetra), "--no-verify", "--matrices"]) == 0
    out = capsys.readouterr().out
    assert "NOT verified (--no-verify)" in out
    assert "model.layers.0.self_attn.q_proj" in out


def test_bad_tetra_directories_are_one_line_errors(
    dirs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, tetra = dirs
    version = Path(shutil.copytree(tetra, tmp_path / "version"))
    cfg = json.loads((version / "config.json").read_text())
    cfg["quantization_config"]["llvq_layout_version"] = 2
    (version / "config.json").write_text(json.dumps(cfg))
    assert main(["inspect", str(version)]) == 2
    _one_line_error(capsys, "llvq_layout_version")

    flipped = Path(shutil.copytree(tetra, tmp_path / "flipped"))
    data = bytearray((flipped / "model.safetensors").read_bytes())
    data[-1] ^= 0x01  # a payload bit: only the hashes can tell
    (flipped / "model.safetensors").write_bytes(bytes(data))
    (flipped / "llvq-digest.json").unlink(missing_ok=True)
    assert main(["inspect", str(flipped)]) == 2
    _one_line_error(capsys, "model.safetensors", "sha256")

    missing = Path(shutil.copytree(tetra, tmp_path / "missing"))
    (missing / "model.safetensors").unlink()
    assert main(["inspect", str(missing)]) == 2
    _one_line_error(capsys, "model.safetensors", "missing")
