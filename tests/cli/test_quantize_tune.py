"""``leechq quantize --recipe full --tune-steps N``: the tuning step runs after the row scales, is
recorded in the artifact, and leaves no checkpoint behind."""

from __future__ import annotations

from pathlib import Path

import pytest
from leechq_tiny import tiny_model, tiny_tokenizer

from leechq.cli.main import main


@pytest.mark.slow
def test_quantize_full_recipe_with_tuning(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from leechq.data.corpus import pydoc_sources_dir
    from leechq.errors import ArtifactError
    from leechq.formats.artifact import read_artifact

    try:
        pydoc_sources_dir(fetch=False)
    except ArtifactError:
        pytest.skip("offline corpus not fetched on this machine")
    src = tmp_path / "tiny"
    tiny_model("llama").save_pretrained(src)
    tiny_tokenizer().save_pretrained(src)
    out = tmp_path / "q"
    argv = ["quantize", str(src), str(out), "--recipe", "full", "--target-bpp", "6",
            "--calib-tokens", "256", "--window", "128", "--train-steps", "2",
            "--train-tokens", "512", "--tune-steps", "3", "--device", "cpu"]
    assert main(argv) == 0
    assert "[quantize] tune: steps 3" in capsys.readouterr().err
    recipe = read_artifact(out).quantization_config["provenance"]["recipe"]
    assert [s["step"] for s in recipe["steps"]][-2:] == ["row_scales", "tune"]
    assert recipe["tune"]["total_steps"] == 3
    assert not (tmp_path / "q.tune-ckpt").exists()
    assert main(["quantize", str(src), str(tmp_path / "r"), "--recipe", "full",
                 "--tune-steps", "-1"]) == 2
