"""Every quantization stage shows a progress bar on stderr (tqdm, with a rate and an estimate):
the teacher logits, composing the model, the timing probe and the steps of tuning and row-scale
training, and the int4 sensitivity bar from the teacher's logits on; none when progress is off."""

from __future__ import annotations

import copy
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


pytest.importorskip("transformers")


def test_tuning_with_a_seconds_budget_shows_teacher_probe_and_step_bars(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from recipe_tiny import quantized, windows

    from leechq.quant.tune import TuneConfig, tune_model

    reference, student, enc = quantized("llama")
    cfg = TuneConfig(steps=0, time_budget_s=1e-6, probe_steps=2, monitor_every=1,
                     groups=("row_scales",), teacher_topk=8)  # a teacher cache to fill
    res = tune_model(student, reference, enc.records, enc.raw, windows(3, 16, seed=1), cfg,
                     monitor_windows=windows(2, 16, seed=2), progress=True)
    err = capsys.readouterr().err
    assert "tune: teacher logits" in err and "5/5" in err  # 3 training + 2 monitor windows
    done = re.findall(r"tune: composing the model: 100%\|[^|]*\| (\d+)/(\d+)", err)
    assert done and int(done[-1][0]) == int(done[-1][1]) >= len(enc.records)
    assert "tune: timing probe" in err and "2/2" in err
    assert "tune: 100%" in err and res.total_steps == 1  # the budget went to the probe
    student2 = copy.deepcopy(student)
    tune_model(student2, reference, res.records, enc.raw, windows(3, 16, seed=1),
               TuneConfig(steps=1, groups=("row_scales",)), progress=False)
    assert capsys.readouterr().err == ""


def test_row_scale_training_shows_probe_and_step_bars(capsys: pytest.CaptureFixture[str]) -> None:
    from recipe_tiny import quantized, windows

    from leechq.quant.row_scales import RowScaleConfig, train_row_scales

    reference, student, enc = quantized("llama")
    cfg = RowScaleConfig(steps=0, time_budget_s=1e-6, probe_steps=2, batch=2)
    train_row_scales(student, reference, enc.records, windows(3, 16), cfg, progress=True)
    err = capsys.readouterr().err
    assert "row scales: timing probe" in err and "2/2" in err
    assert "row scales: 100%" in err


def test_sensitivity_bar_counts_every_matrix(capsys: pytest.CaptureFixture[str]) -> None:
    from leechq_tiny import tiny_model
    from recipe_tiny import windows

    from leechq.quant.sensitivity import measure_swaps

    reference = tiny_model("llama", seed=3)
    names = [f"model.layers.{i}.mlp.down_proj" for i in range(2)]
    swaps = {n: reference.get_submodule(n).weight.detach() * 0.9 for n in names}
    res = measure_swaps(reference, reference, windows(2, 12), swaps, swaps_per_pass=1,
                        progress=True)
    err = capsys.readouterr().err
    assert "int4 sensitivity" in err and "2/2" in err and list(res) == names
    measure_swaps(reference, reference, windows(2, 12), swaps, progress=False)
    assert capsys.readouterr().err == ""
