"""The demo's pieces on a tiny artifact (the offline corpus replaced by a word stream): the tuning
stage and its budget, the low-bit sampling preset reaching the sampler, the quality table."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from leechq_tiny import WORDS, make_artifact, tiny_model, tiny_tokenizer

pytest.importorskip("transformers")


def test_tune_budget_gives_the_stage_what_the_target_leaves_within_cap_and_floor() -> None:
    from leechq.cli.demo import tune_budget

    # a cached artifact: the whole cap
    assert tune_budget(180.0, 30.0, target_s=900.0, rest_s=120.0, floor_s=60.0) == 180.0
    # a slow encode: what is left of the target after the rest
    assert tune_budget(180.0, 650.0, target_s=900.0, rest_s=120.0, floor_s=60.0) == 130.0
    # past the target already: the floor, so the stage still shows what it buys
    assert tune_budget(180.0, 1000.0, target_s=900.0, rest_s=120.0, floor_s=60.0) == 60.0
    # 0 skips the stage whatever the clock says; a cap under the floor is kept
    assert tune_budget(0.0, 0.0) == 0.0
    assert tune_budget(20.0, 0.0, floor_s=60.0) == 20.0


def test_tune_stage_improves_the_tiny_artifact_and_writes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    import leechq.data
    from leechq.cli import demo
    from leechq.data import token_windows
    from leechq.eval.runner import SuiteConfig, run_suite
    from leechq.models.load import load

    tok = tiny_tokenizer()
    text = " ".join(WORDS[(i * 7) % len(WORDS)] for i in range(6000))
    monkeypatch.setattr(leechq.data, "calibration_text", lambda *a, **k: text)
    monkeypatch.setitem(demo.DEMO_TUNE, "monitor_every", 2)
    bare, reference = make_artifact(tmp_path, "llama", int4=())
    ref = SimpleNamespace(model=reference, tokenizer=tok)
    out = demo.tune_stage(ref, bare, 4.0, 64, 32)
    captured = capsys.readouterr()
    assert "held-out calibration KL" in captured.out and "tune: teacher logits" in captured.err
    assert out["summary"]["steps"] >= 1 and out["artifact"].name.endswith("-tuned")
    held_out = token_windows(tok, text[::-1], 2, 32)  # text the stage never saw
    kls = []
    for path in (bare, out["artifact"]):
        model, _ = load(path, device="cpu", dtype=torch.float32, tokenizer=False)
        suite = run_suite(model, tok, SuiteConfig(n_windows=2, window=32), reference=reference,
                          windows=held_out)
        kls.append(suite["kl"]["kl"])
    assert kls[1] < kls[0]  # random records: far from the reference, tuning closes some of it


def test_the_low_bit_preset_reaches_the_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    import leechq.serve.generate as gen
    from leechq.cli.generate import answer
    from leechq.serve.sampling import LOW_BIT_SAMPLING

    seen: list[tuple[float, float, float, float, tuple[bool, ...]]] = []
    real = gen.select_tokens

    def spy(logits, state, key, mask=None):  # type: ignore[no-untyped-def]
        seen.append((float(state.temperature), float(state.top_p), float(state.min_p),
                     float(state.penalty), tuple(key)))
        return real(logits, state, key, mask)

    monkeypatch.setattr(gen, "select_tokens", spy)
    model, tok = tiny_model("llama"), tiny_tokenizer()
    ids = list(tok.encode("the water runs"))
    first = answer(model, tok, ids, 6, LOW_BIT_SAMPLING, lambda _piece: None)
    p = LOW_BIT_SAMPLING
    want = (p.temperature, p.top_p, p.min_p, p.repetition_penalty)
    assert seen and all(s[:4] == pytest.approx(want) for s in seen)
    # sampled (not greedy), top-p, min-p and the repetition penalty on; no top-k
    assert all(s[4] == (False, False, True, True, True) for s in seen)
    assert p.seed is not None and p.temperature > 0 and p.repetition_penalty > 1
    torch.manual_seed(123)  # the preset's own seed wins: the same answer again
    assert answer(model, tok, ids, 6, LOW_BIT_SAMPLING, lambda _piece: None) == first


def test_quality_table_has_one_row_per_model() -> None:
    from leechq.cli.demo import QUALITY_LEGEND, quality_table

    def suite(ratio: float, kl: float, agree: float) -> dict:  # type: ignore[type-arg]
        return {"ppl": {"ratio": ratio}, "kl": {"kl": kl, "agreement": agree}}

    table = quality_table([("bare 2-bit", suite(2.5, 0.75, 0.4)),
                           ("tuned 2-bit", suite(1.25, 0.345, 0.61))])
    lines = table.splitlines()
    assert len(lines) == 3 and "perplexity ratio" in lines[0]
    assert lines[1].split() == ["bare", "2-bit", "x2.500", "0.7500", "0.400"]
    assert lines[2].split() == ["tuned", "2-bit", "x1.250", "0.3450", "0.610"]
    assert "x1.00 = no loss" in QUALITY_LEGEND


def test_reference_logits_run_the_reference_once_per_window_and_change_no_number() -> None:
    from leechq.cli.demo import ReferenceLogits
    from leechq.data import token_windows
    from leechq.eval.runner import SuiteConfig, run_suite

    tok = tiny_tokenizer()
    reference, student = tiny_model("llama", seed=0), tiny_model("llama", seed=1)
    text = " ".join(WORDS[(i * 5) % len(WORDS)] for i in range(800))
    windows = token_windows(tok, text, 3, 16)
    cfg = SuiteConfig(n_windows=3, window=16)
    cached = ReferenceLogits(reference)
    for model in (student, student):
        got = run_suite(model, tok, cfg, reference=cached, windows=windows)
        want = run_suite(model, tok, cfg, reference=reference, windows=windows)
        assert got["kl"] == {**want["kl"], "seconds": got["kl"]["seconds"]}
        assert got["ppl"] == want["ppl"]
    assert cached.forwards == 3  # one per window (batch size 1), not one per window and model


def test_the_demo_sets_a_passive_openmp_wait_before_torch_loads_unless_the_user_chose() -> None:
    import os
    import subprocess
    import sys

    code = ("import sys, os, leechq.cli.demo; "
            "print('torch' in sys.modules, os.environ.get('OMP_WAIT_POLICY'))")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "PASSIVE"]  # set before torch (and its OpenMP runtime) is loaded
    env["OMP_WAIT_POLICY"] = "ACTIVE"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "ACTIVE"]
