"""How many training windows ``leechq quantize --recipe full`` cuts: unnamed, as many as the
row-scale and tuning steps read (fewer, with a note, where the text ends first); named with
``--train-tokens``, exactly that many (a text too short for them is refused)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from leechq_tiny import WORDS, tiny_model, tiny_tokenizer

from leechq.cli.main import main
from leechq.cli.quantize import training_windows
from leechq.config import QuantConfig
from leechq.quant.row_scales import RowScaleConfig
from leechq.quant.tune import DEFAULT_TUNE_STEPS, TuneConfig


class _Stop(Exception):
    """Raised by the stand-in recipe once it has seen its windows."""


def test_quantize_help_states_the_tuning_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    """``leechq quantize --help`` gives today's step default and the windows it reads, and the
    encoder's damping default."""
    with pytest.raises(SystemExit):
        main(["quantize", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    steps = DEFAULT_TUNE_STEPS
    assert f"[default: {steps}]" in text
    assert f"({steps} tuning steps of 2 windows: {2 * steps})" in text
    assert f"second moments less [default: {QuantConfig.damping:g}]" in text


def test_training_windows_is_the_larger_stage() -> None:
    rows, tune = RowScaleConfig(steps=30, batch=2), TuneConfig(steps=70, batch=3)
    assert training_windows(rows, tune) == 210
    assert training_windows(rows, None) == 60
    assert training_windows(None, None) == 1
    timed = RowScaleConfig(steps=0, time_budget_s=5.0, batch=2)  # a time budget
    assert training_windows(timed, None) == DEFAULT_TUNE_STEPS * 2


@pytest.mark.parametrize(("words", "extra", "want", "note"), [
    (6000, [], 14, False),                          # 7 tuning steps of 2 windows
    (6000, ["--tune-steps", "0"], 10, False),       # 5 row-scale steps of 2
    (6000, ["--train-tokens", "192"], 3, False),    # named: exactly 3 windows of 64
    (2000, [], 9, True),                            # the text ends first: 592 tokens left
])
def test_the_training_role_follows_the_steps_and_the_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    words: int, extra: list[str], want: int, note: bool,
) -> None:
    seen: dict[str, tuple[int, ...]] = {}

    def recipe(*args: object, train_windows: object, monitor_windows: object,
               **kwargs: object) -> None:
        seen.update(train=tuple(train_windows.shape), monitor=tuple(monitor_windows.shape))
        raise _Stop

    monkeypatch.setattr("leechq.quant.recipe.run_recipe", recipe)
    src = tmp_path / "tiny"
    tiny_model("llama").save_pretrained(src)
    tiny_tokenizer().save_pretrained(src)
    rng = random.Random(0)
    text = tmp_path / "calib.txt"
    text.write_text(" ".join(rng.choice(WORDS[3:]) for _ in range(words)))
    argv = ["quantize", str(src), str(tmp_path / "q"), "--recipe", "full", "--calib-data",
            str(text), "--calib-tokens", "256", "--window", "64", "--train-steps", "5",
            "--tune-steps", "7", "--device", "cpu", *extra]
    with pytest.raises(_Stop):
        main(argv)
    assert seen == {"train": (want, 64), "monitor": (2, 64)}
    err = capsys.readouterr().err
    assert ("training windows of the" in err) is note


def test_a_named_count_the_text_cannot_hold_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    src = tmp_path / "tiny"
    tiny_model("llama").save_pretrained(src)
    tiny_tokenizer().save_pretrained(src)
    text = tmp_path / "calib.txt"
    text.write_text(" ".join(random.Random(0).choice(WORDS[3:]) for _ in range(1000)))
    argv = ["quantize", str(src), str(tmp_path / "q"), "--recipe", "full", "--calib-data",
            str(text), "--calib-tokens", "256", "--window", "64", "--train-tokens", "6400",
            "--device", "cpu"]
    assert main(argv) == 2
    assert "fewer than" in capsys.readouterr().err
    assert not (tmp_path / "q").exists()
