"""The suite runner: report structure and provenance, and the command line end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from leechq.data.corpus import TokenWindows, token_fingerprint
from leechq.eval import runner
from leechq.eval.ppl import perplexity


def _windows(n: int = 3, t: int = 16) -> TokenWindows:
    ids = torch.randint(0, 96, (n, t), generator=torch.Generator().manual_seed(7))
    return TokenWindows(ids, token_fingerprint(ids), "test")


def test_run_suite_reports_provenance(make_tiny_model, toy_tokenizer, tmp_path: Path) -> None:
    model = make_tiny_model("llama")
    win = _windows()
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    (artifact / "a.bin").write_bytes(b"abc")
    info = runner.ModelInfo(name="tiny", artifact=str(artifact), extra={"bits": 2})
    report = runner.run_suite(
        model, toy_tokenizer, runner.SuiteConfig(corpus="test"), model_info=info, windows=win
    )
    json.dumps(report)  # serializable
    prov = report["provenance"]
    assert report["schema"] == "leechq-eval-v1"
    assert prov["tokens_fingerprint"] == win.fingerprint == report["ppl"]["tokens_fingerprint"]
    assert (
        prov["artifact_sha256"] == runner.artifact_sha256(artifact)
        and len(prov["artifact_sha256"]) == 64
    )
    assert prov["model"]["name"] == "tiny" and prov["dtype"] == "torch.float32"
    assert prov["protocol"]["n_windows"] == 3 and prov["protocol"]["window"] == 16
    assert report["ppl"]["ppl"] == perplexity(model, win).ppl
    assert "kl" not in report
    other = make_tiny_model("llama", seed=5)
    cmp = runner.run_suite(
        other, toy_tokenizer, runner.SuiteConfig(corpus="test"), reference=model, windows=win
    )
    assert cmp["kl"]["kl"] > 0 and cmp["ppl"]["reference_ppl"] == pytest.approx(
        report["ppl"]["ppl"], rel=1e-9
    )
    assert cmp["ppl"]["ratio"] == pytest.approx(cmp["ppl"]["ppl"] / cmp["ppl"]["reference_ppl"])


def test_artifact_sha256_of_file_and_dir(tmp_path: Path) -> None:
    f = tmp_path / "x"
    f.write_bytes(b"hello")
    assert (
        runner.artifact_sha256(f)
        == "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
    )
    d = tmp_path / "d"
    d.mkdir()
    (d / "x").write_bytes(b"hello")
    first = runner.artifact_sha256(d)
    (d / "x").write_bytes(b"hellp")
    assert runner.artifact_sha256(d) != first


def _local_model_dir(tmp_path: Path, text: str) -> Path:
    """A tiny transformers checkpoint with a real (trained-on-the-spot) byte-level BPE tokenizer."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=300, special_tokens=["<eos>"]))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
    out = tmp_path / "model"
    fast.save_pretrained(out)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=fast.vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    transformers.LlamaForCausalLM(cfg).save_pretrained(out)
    return out


def test_command_line_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    sources = tmp_path / "corpora" / "pydoc"
    for i in range(40):
        (sources / "library").mkdir(parents=True, exist_ok=True)
        (sources / "library" / f"m{i}.rst.txt").write_text(
            f"Module {i}\n========\n\nThe function f{i}(x) returns x plus {i}. " * 20
        )
    monkeypatch.setenv("LEECHQ_CORPUS_DIR", str(tmp_path / "corpora"))
    monkeypatch.setenv("LEECHQ_CACHE", str(tmp_path / "cache"))
    model_dir = _local_model_dir(tmp_path, (sources / "library" / "m1.rst.txt").read_text())
    assert runner.main(["--model", str(model_dir), "--windows", "2", "--window", "32"]) == 0
    ref = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert ref["provenance"]["model"]["source"]["kind"] == "hf_dir"
    assert ref["ppl"]["n_windows"] == 2 and ref["ppl"]["ppl"] > 1
    assert (
        ref["provenance"]["corpus"]["files"]["evaluation"]
        + ref["provenance"]["corpus"]["files"]["calibration"]
        == 40
    )
    out_file = tmp_path / "gptq.json"
    assert (
        runner.main(
            [
                "--model",
                str(model_dir),
                "--windows",
                "2",
                "--window",
                "32",
                "--baseline",
                "gptq-int2-g64",
                "--calib-windows",
                "2",
                "--calib-window",
                "32",
                "--out",
                str(out_file),
            ]
        )
        == 0
    )
    gptq = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert gptq == json.loads(out_file.read_text())
    assert gptq["provenance"]["tokens_fingerprint"] == ref["provenance"]["tokens_fingerprint"]
    assert gptq["ppl"]["reference_ppl"] == pytest.approx(ref["ppl"]["ppl"], rel=1e-6)
    assert gptq["kl"]["kl"] > 0 and 0 <= gptq["kl"]["agreement"] <= 1
    extra = gptq["provenance"]["model"]["extra"]
    assert extra["method"] == "gptq-int2-g64" and extra["accounting"]["bits_per_weight"] == 2.5
    assert extra["calibration"]["source"] == "pydoc:calibration"
