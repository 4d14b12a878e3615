"""The writer's output-path rules (leechq.formats.output_paths), one named case each: overwrite and
--force replace only a complete leechq artifact (never a user folder, a file or an artifact with
files added), and what a killed writer left is cleaned on the next write."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from leechq.errors import ArtifactError
from leechq.formats.artifact import read_artifact, write_artifact
from leechq.formats.output_paths import check_replaceable, clean_stale_partials


def _rewrite(src: Path, out: Path) -> Path:
    art = read_artifact(src)
    raw: dict[str, Any] = dict(art.raw)
    raw.update(art.raw_quant)
    return write_artifact(
        out,
        base_config={k: v for k, v in art.config.items() if k != "quantization_config"},
        quant_config=art.quant_config,
        records=art.records,
        raw=raw,
        tied=art.tied,
        overwrite=True,
    )


def test_overwrite_replaces_only_a_complete_artifact(art: Path, tmp_path: Path) -> None:
    user = tmp_path / "photos"
    user.mkdir()
    (user / "cat.jpg").write_bytes(b"meow")
    with pytest.raises(ArtifactError, match="not a complete leechq artifact"):
        _rewrite(art, user)
    assert (user / "cat.jpg").read_bytes() == b"meow"
    a_file = tmp_path / "notes.txt"
    a_file.write_text("keep")
    with pytest.raises(ArtifactError, match="not a directory"):
        _rewrite(art, a_file)
    assert a_file.read_text() == "keep"
    mixed = Path(shutil.copytree(art, tmp_path / "mixed"))
    (mixed / "my-notes.txt").write_text("mine")
    with pytest.raises(ArtifactError, match=r"my-notes\.txt"):
        _rewrite(art, mixed)
    assert (mixed / "my-notes.txt").read_text() == "mine"
    target = Path(shutil.copytree(art, tmp_path / "target"))
    _rewrite(art, target)  # a complete artifact is replaced
    read_artifact(target)
    check_replaceable(tmp_path / "absent")  # nothing there: fine


def test_cli_force_refuses_a_user_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from leechq.cli.main import main

    user = tmp_path / "docs"
    user.mkdir()
    (user / "thesis.tex").write_text("years of work")
    assert main(["quantize", "some/model", str(user), "--force", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a complete leechq artifact" in err[0]
    assert (user / "thesis.tex").read_text() == "years of work"


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_partials_are_cleaned(art: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    dead = _dead_pid()
    partial = tmp_path / f".out.partial-{dead}"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"half")
    live = tmp_path / f".out.partial-{os.getppid()}"  # a live process: a writer still running
    live.mkdir()
    _rewrite(art, out)
    assert not partial.exists() and live.exists()
    shutil.rmtree(live)
    # killed between the two renames of a replacement: the old artifact is put back
    old = tmp_path / f".out.old-{dead}"
    os.replace(out, old)
    assert clean_stale_partials(out) == [old]
    assert not old.exists()
    read_artifact(out)
