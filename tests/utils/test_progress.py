"""The shared progress bar: on stderr only when enabled, and silenced by ``TQDM_DISABLE=1``."""

from __future__ import annotations

import sys

import pytest

from leechq.utils.progress import stage_bar


def test_stage_bar_writes_to_stderr_only_when_enabled(capsys: pytest.CaptureFixture[str]) -> None:
    with stage_bar("stage x", 3, "item", True) as bar:
        for _ in range(3):
            bar.update(1)
    out = capsys.readouterr()
    assert "stage x" in out.err and "3/3" in out.err and out.out == ""
    with stage_bar("stage y", 3, "item", False) as bar:
        bar.update(1)
        bar.set_postfix(kl="0.1")
    out = capsys.readouterr()
    assert out.err == "" and out.out == ""


def test_stage_bar_honours_tqdm_disable_in_the_environment() -> None:
    import os
    import subprocess

    import tqdm

    if tuple(int(p) for p in tqdm.__version__.split(".")[:2]) < (4, 66):
        pytest.skip("tqdm < 4.66 reads no TQDM_* variables")
    # tqdm reads its variables when it is imported: a fresh interpreter each time
    code = (
        "from leechq.utils.progress import stage_bar\n"
        "with stage_bar('stage z', 3, 'item', True) as bar:\n"
        "    bar.update(3)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TQDM_")}
    shown = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    env["TQDM_DISABLE"] = "1"
    hidden = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert shown.returncode == 0 and hidden.returncode == 0, shown.stderr + hidden.stderr
    assert "stage z" in shown.stderr
    assert hidden.stderr == "" and hidden.stdout == ""
