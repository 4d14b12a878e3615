"""Every user error of the CLI is one line on stderr and exit status 2 (no traceback), and
``inspect`` says whether it verified the hashes."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from leechq_tiny import make_artifact

from leechq.cli.main import main
from leechq.errors import ArtifactError


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out, _ = make_artifact(tmp_path_factory.mktemp("cli"), "llama")
    return out


def _one_line_error(capsys: pytest.CaptureFixture[str], command: str, needle: str) -> None:
    err = capsys.readouterr().err.strip().splitlines()
    err = [line for line in err if not line.startswith("[")]  # progress lines
    assert len(err) == 1, err
    assert err[0].startswith(f"leechq {command}: error:") and needle in err[0], err


@pytest.mark.parametrize("command", ["run", "chat", "eval", "quantize"])
def test_unknown_device_is_refused(
    command: str, artifact: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = {
        "run": ["run", str(artifact), "--prompt", "hi"],
        "chat": ["chat", str(artifact)],
        "eval": ["eval", str(artifact)],
        "quantize": ["quantize", "m", str(tmp_path / "o")],
    }[command]
    for device in ("tpu", "mps", "meta", "cuda:x"):
        assert main([*argv, "--device", device]) == 2
        _one_line_error(capsys, command, "unknown device")


def test_library_refuses_non_cpu_cuda_devices() -> None:
    from leechq.errors import InvalidInput
    from leechq.models.load import resolve_device

    for device in ("tpu", "mps", "meta", "xla"):
        with pytest.raises(InvalidInput, match="device"):
            resolve_device(device)
    assert resolve_device("cpu").type == "cpu"


def test_unwritable_or_overlong_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert main(["quantize", "m", str(a_file / "out"), "--device", "cpu"]) == 2
    _one_line_error(capsys, "quantize", "is not a directory")
    assert main(["quantize", "m", str(tmp_path / ("n" * 300)), "--device", "cpu"]) == 2
    _one_line_error(capsys, "quantize", "300 bytes")
    assert main(["quantize", "m", str(tmp_path), "--device", "cpu"]) == 2
    _one_line_error(capsys, "quantize", "already exists")


def test_offline_hub_id_is_one_line(tmp_path: Path) -> None:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "leechq.cli.main", "quantize", "no-such-org/no-such-model",
         str(tmp_path / "out"), "--device", "cpu"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("[")]
    assert len(errors) == 1 and errors[0].startswith("leechq quantize: error:"), proc.stderr
    assert "Traceback" not in proc.stderr


def test_corrupt_artifact_is_one_line_for_run_and_inspect(
    artifact: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    bad = Path(shutil.copytree(artifact, tmp_path / "bad"))
    cfg = json.loads((bad / "config.json").read_text())
    cfg["quantization_config"]["config"]["rotation_seed_hex"] = "zz"
    (bad / "config.json").write_text(json.dumps(cfg))
    manifest = json.loads((bad / "leechq-manifest.json").read_text())
    data = (bad / "config.json").read_bytes()
    manifest["files"]["config.json"] = {
        "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()
    }
    (bad / "leechq-manifest.json").write_text(json.dumps(manifest))
    for argv in (["run", str(bad), "--prompt", "hi", "--device", "cpu"], ["inspect", str(bad)]):
        assert main(argv) == 2
        _one_line_error(capsys, argv[0], "rotation_seed_hex")


def test_inspect_says_whether_it_verified(
    artifact: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", str(artifact)]) == 0
    assert "sha256 of every file verified" in capsys.readouterr().out
    assert main(["inspect", str(artifact), "--no-verify"]) == 0
    assert "NOT verified" in capsys.readouterr().out
    assert main(["inspect", str(artifact), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verified"] is True


def test_checkpoint_metadata_types_are_checked(tmp_path: Path) -> None:
    from leechq.quant.layerwise import Checkpoint

    ckpt = tmp_path / "ck"
    ckpt.mkdir()
    for state, field in (
        ({"run_id": "r", "n_blocks": 2, "done": "x", "stats": {}}, "done"),
        ({"run_id": "r", "n_blocks": 2, "done": 5, "stats": {}}, "done"),
        ({"run_id": "r", "n_blocks": 2, "done": 1, "stats": []}, "stats"),
        ([1, 2], "JSON object"),
    ):
        (ckpt / "run.json").write_text(json.dumps(state))
        with pytest.raises(ArtifactError, match=field):
            Checkpoint(ckpt, "r", 2)
