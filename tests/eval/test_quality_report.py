"""``benchmarks/quality.py --tiny`` runs end to end: table, paired intervals, JSON last line."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "quality.py"


def test_quality_report_on_the_tiny_model(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("quality_report", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        assert module.main(["--tiny", "--arms", "bare,full,full+tune,rtn", "--bits", "2,4",
                            "--boot", "50"]) == 0
    finally:
        from standin_codebook import unregister

        unregister()
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(out[-1])
    arms = {(r["arm"], r["set"]) for r in result["rows"]}
    assert arms == {(a, s) for a in ("bare", "full", "full+tune", "rtn-2", "rtn-4")
                    for s in ("in-domain", "unseen")}
    rows = {(r["arm"], r["set"]): r for r in result["rows"]}
    # the recipe beats the bare encoding on KL, and 4-bit RTN beats 2-bit RTN
    for s in ("in-domain", "unseen"):
        assert rows[("full", s)]["kl"] < rows[("bare", s)]["kl"]
        assert rows[("rtn-4", s)]["kl"] < rows[("rtn-2", s)]["kl"]
    iv = [i for i in result["intervals"] if i["arm"] == "bare"]
    assert len(iv) == 2 and all(i["ci95"]["kl"][0] <= i["ci95"]["kl"][1] for i in iv)
