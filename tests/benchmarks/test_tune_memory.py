"""The whole-model tuning memory benchmark (``benchmarks/tune_memory.py``), tiny shape, CPU."""

from __future__ import annotations

import json

import pytest
import torch
from bench_scripts import load_script


@pytest.fixture(scope="module")
def tm():
    return load_script("tune_memory")


def test_stored_parts_cover_every_layer_projection_and_set_the_tables(tm) -> None:
    from leechq.formats.group_affine import GroupAffine
    from leechq.serve.random_codes import SHAPES

    student = tm.build_model(SHAPES["qwen3-tiny"], torch.device("cpu"), torch.float32, 0)
    records, raw = tm.stored_parts(student, 1)
    linears = [n for n, m in student.named_modules()
               if isinstance(m, torch.nn.Linear) and ".layers." in n]
    assert sorted(records) == sorted(linears) and len(linears) == 2 * 7
    tables = {n: t for n, t in raw.items() if isinstance(t, GroupAffine)}
    assert {t.bits for t in tables.values()} == {4, 8}
    for name, table in tables.items():  # the student holds exactly what is stored
        assert torch.equal(student.get_parameter(name).detach(), table.dequantize(torch.float32))
    norms = [n for n, p in student.named_parameters() if p.dim() == 1 and "norm" in n]
    assert norms and all(n in raw for n in norms)


def test_a_dry_run_tunes_and_reports(tm, capsys) -> None:
    row = tm.main(["--shape", "qwen3-tiny", "--device", "cpu", "--steps", "2", "--windows", "4",
                   "--window", "32", "--topk", "8", "--monitor", "1"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == row
    assert row["steps"] == 2 and row["records"] == 14 and row["tables"] == 2
    assert row["estimate_gib"] > 0 and row["peak_gib"] is None  # no device counters on the CPU
    assert row["peak_steps_gib"] is None and row["topk"] == 8
    assert row["monitor_kl_before"] > 0 and row["seconds_per_step"] > 0
    assert row["seconds_before_steps"] > 0 and row["seconds_after_steps"] > 0


def test_the_default_teacher_is_the_recipes(tm, capsys) -> None:
    """Without ``--topk`` the run tunes as the recipe does (``TuneConfig``'s teacher: the full
    one every step, ``topk`` 0)."""
    from leechq.quant.tune import TuneConfig

    row = tm.main(["--shape", "qwen3-tiny", "--device", "cpu", "--steps", "1", "--windows", "2",
                   "--window", "16", "--monitor", "1", "--layers", "1"])
    capsys.readouterr()
    assert row["topk"] == TuneConfig().teacher_topk == 0 and row["steps"] == 1
    assert row["layers"] == 1 and row["records"] == 7  # one layer's seven projections


def test_bad_arguments_are_refused(tm) -> None:
    with pytest.raises(SystemExit):
        tm.parse_args(["--steps", "0"])
    with pytest.raises(SystemExit):
        tm.parse_args(["--topk", "-1"])
    with pytest.raises(SystemExit):
        tm.parse_args(["--layers", "0"])
    with pytest.raises(SystemExit, match="unknown --shape"):
        tm.main(["--shape", "qwen9", "--device", "cpu"])


def test_the_estimate_lies_above_the_measured_peaks_at_qwen3_8b_shapes(tm) -> None:
    """``tune_memory_bytes`` within 10 % above the peaks this benchmark measured (H100, GiB) at
    Qwen3-8B widths: 36 and 12 layers, 1 024 and 2 048 tokens per step (meta-device models)."""
    from leechq.quant.tune import tune_memory_bytes
    from leechq.serve.random_codes import SHAPES

    measured = {(36, 1024): 52.20, (12, 1024): 28.87, (12, 2048): 31.84}
    for (layers, tokens), peak in measured.items():
        shape = {**SHAPES["qwen3-8b"], "num_hidden_layers": layers}
        model = tm.build_model(shape, torch.device("meta"), torch.float32, 0)
        gib = tune_memory_bytes(model, on_cuda=True, tokens=tokens) / 1024**3
        assert peak < gib < 1.10 * peak, (layers, tokens, gib)
