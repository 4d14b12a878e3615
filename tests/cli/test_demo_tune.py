"""The demo's tuning stage and sampling preset on a tiny artifact (the offline corpus replaced by
a word stream): quality printed before and after, the tuned artifact written and loadable."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from leechq_tiny import WORDS, make_artifact, tiny_tokenizer

pytest.importorskip("transformers")


def test_tune_stage_improves_the_tiny_artifact_and_writes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    import leechq.data
    import leechq.eval.runner as runner
    from leechq.cli import demo
    from leechq.data import token_windows
    from leechq.models.load import load
    from leechq.serve.sampling import SamplingConfig

    tok = tiny_tokenizer()
    text = " ".join(WORDS[(i * 7) % len(WORDS)] for i in range(6000))
    monkeypatch.setattr(leechq.data, "calibration_text", lambda *a, **k: text)
    monkeypatch.setattr(runner, "eval_windows",
                        lambda tokenizer, cfg: token_windows(tokenizer, text[::-1], cfg.n_windows,
                                                             cfg.window))
    monkeypatch.setitem(demo.DEMO_TUNE, "monitor_every", 2)
    bare, reference = make_artifact(tmp_path, "llama", int4=())
    ref = SimpleNamespace(model=reference, tokenizer=tok)
    out = demo.tune_stage(ref, bare, 4.0, 2, 64, 32)
    printed = capsys.readouterr().out
    assert "before tuning: perplexity x" in printed and "after tuning : perplexity x" in printed
    before, after = out["before"]["kl"]["kl"], out["after"]["kl"]["kl"]
    assert after < before  # random records: far from the reference, tuning closes some of it
    assert out["summary"]["steps"] >= 1 and out["artifact"].name.endswith("-tuned")
    model, _ = load(out["artifact"], device="cpu", dtype=torch.float32, tokenizer=False)
    assert model is not None
    SamplingConfig(**demo.DEMO_SAMPLING)  # the preset is a valid configuration
