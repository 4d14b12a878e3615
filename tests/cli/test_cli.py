"""The ``leechq`` CLI: lazy help (no torch), inspect's three rates, run, eval and error handling."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from leechq_tiny import make_artifact, tiny_model, tiny_tokenizer

from leechq.cli.main import COMMANDS, main


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_help_does_not_import_torch() -> None:
    names = [c.name for c in COMMANDS]
    code = (
        "import sys\n"
        "from leechq.cli.main import main\n"
        f"for argv in [['--help']] + [[n, '--help'] for n in {names!r}]:\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 0, (argv, e.code)\n"
        "heavy = [m for m in ('torch', 'triton', 'transformers', 'numpy') if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    res = _python(code)
    assert res.returncode == 0, res.stderr
    assert "HEAVY []" in res.stdout
    for name in names:
        assert name in res.stdout


def test_console_script_entry_point() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "leechq.cli.main", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0 and res.stdout.startswith("leechq ")
    res = subprocess.run(
        [sys.executable, "-m", "leechq.cli.main"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 2 and "quantize" in res.stdout


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out, _ = make_artifact(tmp_path_factory.mktemp("cli"), "llama")
    return out


def test_inspect_prints_the_three_rates(artifact: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from leechq.formats.accounting import artifact_report

    assert main(["inspect", str(artifact)]) == 0
    out = capsys.readouterr().out
    rates = artifact_report(artifact)["rates"]
    for label, key in (
        ("kernel rate", "kernel_bits_per_weight"),
        ("whole-model rate", "whole_model_bits_per_param"),
        ("on-disk rate", "on_disk_bits_per_param"),
    ):
        line = next(ln for ln in out.splitlines() if label in ln)
        assert f"{rates[key]:.4f}" in line  # each rate on its own line, with its own unit
    assert "bits per quantized weight" in out and "bits per parameter" in out
    assert "*.q_proj (2)" in out and "*.v_proj (2)" in out and "int4" in out
    assert main(["inspect", str(artifact), "--matrices"]) == 0
    assert "model.layers.1.mlp.down_proj" in capsys.readouterr().out
    assert main(["inspect", str(artifact), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rates"] == rates


def test_run_streams_an_answer(artifact: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "run",
            str(artifact),
            "--prompt",
            "the water is",
            "--max-new-tokens",
            "5",
            "--device",
            "cpu",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert out.endswith("\n") and len(out.split()) >= 1


def test_prompt_uses_the_chat_template() -> None:
    from leechq.cli.generate import prompt_ids

    tok = tiny_tokenizer()
    templated = prompt_ids(tok, "the water")
    raw = prompt_ids(tok, "the water", raw=True)
    assert templated != raw
    assert tok.decode(templated) == "user the water assistant"
    plain = tiny_tokenizer(chat_template=False)
    assert prompt_ids(plain, "the water") != prompt_ids(plain, "the water", raw=True)


def test_eval_reports_ppl_and_kl(
    artifact: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], fixture_corpus: Path
) -> None:
    ref = tmp_path / "ref"
    tiny_model("llama").save_pretrained(ref)
    tiny_tokenizer().save_pretrained(ref)
    rc = main(
        [
            "eval",
            str(artifact),
            "--reference",
            str(ref),
            "--windows",
            "2",
            "--window",
            "32",
            "--device",
            "cpu",
            "--out",
            str(tmp_path / "r.json"),
        ]
    )
    assert rc == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out.strip().splitlines()[-1])
    assert report == json.loads((tmp_path / "r.json").read_text())
    assert report["ppl"]["n_predicted"] == 2 * 31
    assert report["kl"]["kl"] >= 0 and "ratio" in report["ppl"]
    assert "perplexity" in captured.err


def test_errors_are_one_line_with_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("leechq inspect: error:") and "not a directory" in err
    out, _ = make_artifact(tmp_path, "llama", tokenizer=False)
    assert main(["run", str(out), "--prompt", "hi", "--device", "cpu"]) == 2
    assert "no tokenizer files" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["quantize", "m", "o", "--codebook", "nope"])


def test_demo_readiness_checks() -> None:
    from leechq.cli.demo import codebook_ready, quantizer_ready

    assert codebook_ready("tetra") == (True, "")
    ok, why = codebook_ready("no-such-codebook")
    assert not ok and "no-such-codebook" in why
    assert quantizer_ready() == (True, "")


def test_chat_reads_turns_until_exit(artifact: Path) -> None:
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "leechq.cli.main",
            "chat",
            str(artifact),
            "--device",
            "cpu",
            "--max-new-tokens",
            "3",
            "--temperature",
            "0",
        ],
        input="the water\n/reset\n/exit\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert "leechq chat" in res.stdout and "(conversation reset)" in res.stdout


def _tiny_model_dir(tmp_path: Path, arch: str = "llama", name: str = "tiny") -> Path:
    """A tiny random model of ``arch`` (default a Llama, whose head is tied) saved as a transformers
    directory ``tmp_path / name`` (calibrated on ``fixture_corpus``)."""
    src = tmp_path / name
    tiny_model(arch).save_pretrained(src)
    tiny_tokenizer().save_pretrained(src)
    return src


def test_quantize_then_demo_on_a_tiny_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    fixture_corpus: Path
) -> None:
    """The real pipeline (quantizer, artifact, load, generate, eval) on a tiny random model: the
    quantize command, then the demo reusing nothing (its own cache)."""
    src = _tiny_model_dir(tmp_path)
    out = tmp_path / "q"
    assert (
        main(
            [
                "quantize",
                str(src),
                str(out),
                "--calib-tokens",
                "512",
                "--window",
                "256",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    assert "on-disk rate" in capsys.readouterr().out
    from leechq.cli.demo import main as demo_main

    assert (
        demo_main(
            [
                "--model",
                str(src),
                "--out",
                str(tmp_path / "demo"),
                "--calib-tokens",
                "512",
                "--max-new-tokens",
                "4",
                "--eval-windows",
                "1",
                "--tune-seconds",
                "3",
            ]
        )
        == 0
    )
    last = capsys.readouterr().out.strip().splitlines()[-1]
    summary = json.loads(last)
    assert summary["codebook"] == "tetra" and not summary["reused_artifact"]
    assert summary["tune"]["summary"]["steps"] >= 1
    assert summary["kl"]["kl"] >= 0 and summary["ppl"]["ratio"] > 0
    assert summary["counts"]["lattice_records"] == 14


@pytest.mark.parametrize(("flag", "value"), [("--target-bpp", "3"), ("--head-bits", "4")])
def test_full_recipe_flags_need_the_full_recipe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    argv = ["quantize", "no-such-model", str(tmp_path / "q"), flag, value]
    assert main(argv) == 2
    assert f"{flag} applies to --recipe full only" in capsys.readouterr().err
    assert not (tmp_path / "q").exists()


def test_head_bits_sets_the_untied_heads_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fixture_corpus: Path
) -> None:
    """``--head-bits 4``: the full recipe starts an untied head (tiny Qwen3) at 4 bits (8 by
    default), and under a budget too tight to buy it 8 stores it so; a width other than 4 or 8
    is refused by the parser."""
    from leechq.formats.artifact import read_artifact

    src = tmp_path / "tiny"
    tiny_model("qwen3").save_pretrained(src)
    tiny_tokenizer().save_pretrained(src)
    out = tmp_path / "q"
    argv = ["quantize", str(src), str(out), "--recipe", "full", "--target-bpp", "3",
            "--head-bits", "4", "--calib-tokens", "256", "--window", "128", "--train-steps",
            "1", "--train-tokens", "256", "--tune-steps", "0", "--device", "cpu"]
    assert main(argv) == 0
    recipe = read_artifact(out).quantization_config["provenance"]["recipe"]
    tables = next(s["tables"] for s in recipe["steps"] if s["step"] == "tables")
    assert tables["lm_head.weight"]["bits"] == 4
    assert tables["model.embed_tokens.weight"]["bits"] in (4, 8)
    with pytest.raises(SystemExit):
        main(["quantize", str(src), str(tmp_path / "r"), "--recipe", "full", "--head-bits", "2"])
    assert "invalid choice" in capsys.readouterr().err


def test_lattice_embedding_flag_in_both_recipes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fixture_corpus: Path
) -> None:
    """``--lattice-embedding``: the bare and the full recipe store the untied embedding of a tiny
    Qwen3 as a lattice record (the full recipe's table step says so) that ``leechq.load``
    serves; a tied model (tiny Llama) is refused by name and nothing is written."""
    from leechq.formats.artifact import read_artifact
    from leechq.models.load import load
    from leechq.nn.lattice_embedding import LatticeEmbedding

    src = _tiny_model_dir(tmp_path, "qwen3")
    common = ["--lattice-embedding", "--calib-tokens", "256", "--window", "128", "--device",
              "cpu"]
    assert main(["quantize", str(src), str(tmp_path / "bare"), *common]) == 0
    assert main(["quantize", str(src), str(tmp_path / "full"), "--recipe", "full",
                 "--target-bpp", "6", "--train-steps", "1", "--train-tokens", "256",
                 "--tune-steps", "0", *common]) == 0
    for name in ("bare", "full"):
        art = read_artifact(tmp_path / name)
        assert "model.embed_tokens" in art.records, name
        assert art.quant_config.embedding_encoding == "lattice"
        model, _ = load(tmp_path / name, device="cpu", tokenizer=False)
        assert isinstance(model.model.embed_tokens, LatticeEmbedding)
    recipe = read_artifact(tmp_path / "full").quantization_config["provenance"]["recipe"]
    step = next(s for s in recipe["steps"] if s["step"] == "tables")
    assert list(step["lattice"]) == ["model.embed_tokens.weight"]
    tied = _tiny_model_dir(tmp_path, name="tied")
    capsys.readouterr()
    assert main(["quantize", str(tied), str(tmp_path / "no"), *common]) == 2
    assert "tied to it" in capsys.readouterr().err
    assert not (tmp_path / "no").exists()


def test_lattice_head_flag_in_both_recipes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fixture_corpus: Path
) -> None:
    """``--lattice-head``: the bare and the full recipe store the untied head of a tiny Qwen3 as
    a record (the full recipe stores no head table, and its int4 step may take the head) that
    ``leechq.load`` serves as a LeechqLinear; ``--head-bits`` beside it and a tied model (tiny
    Llama) are refused by name, and nothing is written."""
    from leechq.formats.artifact import read_artifact
    from leechq.models.load import load
    from leechq.nn.linear import LeechqLinear

    src = _tiny_model_dir(tmp_path, "qwen3")
    common = ["--lattice-head", "--calib-tokens", "256", "--window", "128", "--device", "cpu"]
    full = ["--recipe", "full", "--target-bpp", "3", "--train-steps", "1", "--train-tokens",
            "256", "--tune-steps", "0"]
    assert main(["quantize", str(src), str(tmp_path / "bare"), *common]) == 0
    assert main(["quantize", str(src), str(tmp_path / "full"), *full, *common]) == 0
    for name in ("bare", "full"):
        art = read_artifact(tmp_path / name)
        assert "lm_head" in art.records and "lm_head.weight" not in art.raw, name
        assert "lm_head.weight" not in art.raw_quant and art.quant_config.lattice_head
        model, _ = load(tmp_path / name, device="cpu", tokenizer=False)
        assert isinstance(model.lm_head, LeechqLinear)
    recipe = read_artifact(tmp_path / "full").quantization_config["provenance"]["recipe"]
    assert recipe["recipe"]["head_bits"] is None
    assert "lm_head" in recipe["sensitivity"]["matrices"]
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "bare")]) == 0
    assert "head on the lattice" in capsys.readouterr().out
    assert main(["quantize", str(src), str(tmp_path / "no"), *full, *common,
                 "--head-bits", "4"]) == 2
    assert "--lattice-head codes the head on the lattice" in capsys.readouterr().err
    tied = _tiny_model_dir(tmp_path, name="tied")
    assert main(["quantize", str(tied), str(tmp_path / "no"), *common]) == 2
    assert "head must be untied" in capsys.readouterr().err
    assert not (tmp_path / "no").exists()


def test_damping_is_checked_then_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fixture_corpus: Path
) -> None:
    """``--damping``: a value outside (0, 1) is refused by name before the model is read, and
    nothing is written; a valid one is the encoder's, recorded in the artifact's config."""
    from leechq.formats.artifact import read_artifact

    for bad in ("0", "1", "-0.1", "nan"):
        assert main(["quantize", "no-such-model", str(tmp_path / "no"), "--damping", bad]) == 2
        err = capsys.readouterr().err
        assert "--damping: " in err and "damping must be in (0, 1)" in err
        assert not (tmp_path / "no").exists()
    src = _tiny_model_dir(tmp_path)
    argv = ["quantize", str(src), str(tmp_path / "q"), "--calib-tokens", "256", "--window",
            "128", "--device", "cpu"]
    assert main([*argv, "--damping", "0.2"]) == 0
    assert read_artifact(tmp_path / "q").quant_config.damping == 0.2
    assert "damping 0.2" in capsys.readouterr().err


def test_quantize_full_recipe_on_a_tiny_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fixture_corpus: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--recipe full``: int4 choice under the budget, 4-bit embedding, trained row scales,
    end-to-end tuning (on by default), all recorded in the artifact, which loads and matches the
    recorded accounting; the sensitivity pass kept its checkpoint beside OUT while it ran, and no
    checkpoint is left behind."""
    from leechq.formats.accounting import artifact_report
    from leechq.formats.artifact import read_artifact
    from leechq.quant.sensitivity import MeasurementCheckpoint

    # the CLI tunes for leechq.quant.tune.DEFAULT_TUNE_STEPS steps; fewer here keep the test short
    monkeypatch.setattr("leechq.quant.tune.DEFAULT_TUNE_STEPS", 40)
    saved = []
    real_save = MeasurementCheckpoint.save

    def save(self, done):  # type: ignore[no-untyped-def]
        real_save(self, done)
        saved.append(self.path)

    monkeypatch.setattr(MeasurementCheckpoint, "save", save)

    src = _tiny_model_dir(tmp_path)
    out = tmp_path / "q"
    argv = [
        "quantize",
        str(src),
        str(out),
        "--recipe",
        "full",
        "--target-bpp",
        "6",
        "--calib-tokens",
        "256",
        "--window",
        "128",
        "--train-steps",
        "3",
        "--train-tokens",
        "512",
        "--damping",
        "0.05",
        "--device",
        "cpu",
    ]
    assert main(argv) == 0
    assert "on-disk rate" in capsys.readouterr().out
    art = read_artifact(out)
    assert art.quant_config.damping == 0.05
    recipe = art.quantization_config["provenance"]["recipe"]
    assert recipe["recipe"]["name"] == "full"
    assert [s["step"] for s in recipe["steps"]] == [
        "encode",
        "int4_by_sensitivity",
        "tables",
        "row_scales",
        "tune",
    ]
    assert recipe["row_scales"]["steps"] == 3
    assert recipe["tune"]["total_steps"] == 40  # tuning is on by default
    assert recipe["whole_model_bits_per_param"] <= 6.0 + 1e-9
    report = artifact_report(out)
    assert report is not None
    assert saved and {p.parent for p in saved} == {tmp_path / "q.sens-ckpt"}
    for left in ("q.ckpt", "q.rows-ckpt", "q.tune-ckpt", "q.sens-ckpt"):
        assert not (tmp_path / left).exists()
    assert main(argv) == 2
    assert "already exists" in capsys.readouterr().err


def test_demo_requantizes_a_cached_artifact_that_is_stale() -> None:
    """The demo reuses its cached artifact only when it stands for this run: same codebook, at
    least the calibration tokens asked for, the demo's embedding table, and today's default
    calibration text (an artifact from before a change of default is made again)."""
    from types import SimpleNamespace

    from leechq.cli.demo import DEMO_EMBEDDING, stale_reason
    from leechq.data.code_corpus import MIXED_SOURCE

    good = SimpleNamespace(codebook="tetra", calib_windows=16, calib_window_len=256,
                           embedding_encoding=DEMO_EMBEDDING,
                           calibration=f"{MIXED_SOURCE} 16x256 tokens, fingerprint 0123")
    assert stale_reason(good, "tetra", 4096) is None
    assert "ball codebook" in stale_reason(SimpleNamespace(**{**vars(good), "codebook": "ball"}),
                                           "tetra", 4096)
    assert "2048 tokens" in stale_reason(SimpleNamespace(**{**vars(good), "calib_windows": 8}),
                                         "tetra", 4096)
    old = SimpleNamespace(**{**vars(good), "calibration": "pydoc+pystdlib:calibration 16x256"})
    assert "pydoc+pystdlib:calibration" in stale_reason(old, "tetra", 4096)


def test_eval_on_named_sets_and_on_the_users_text(
    artifact: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], fixture_corpus: Path
) -> None:
    """``leechq eval --data`` takes the evaluation split of a named corpus or the user's own text
    (a file here); text too short for the windows is refused naming --data and the sizes, and
    nothing is written to --out."""
    from leechq_tiny import WORDS

    common = ["--windows", "2", "--window", "32", "--device", "cpu"]
    assert main(["eval", str(artifact), "--data", "pystdlib", *common]) == 0
    named = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert named["provenance"]["config"]["corpus"] == "pystdlib"
    assert named["ppl"]["n_predicted"] == 2 * 31
    mine = tmp_path / "mine.txt"
    mine.write_text(" ".join(WORDS[i % len(WORDS)] for i in range(400)), encoding="utf-8")
    assert main(["eval", str(artifact), "--data", str(mine), *common]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    cfg = report["provenance"]["config"]
    assert cfg["corpus"] == "user" and "mine.txt" in cfg["split"]
    assert report["ppl"]["n_predicted"] == 2 * 31 and report["ppl"]["ppl"] > 0
    short = tmp_path / "short.txt"
    short.write_text(" ".join(WORDS[:5]), encoding="utf-8")
    out = tmp_path / "r.json"
    rc = main(["eval", str(artifact), "--data", str(short), *common, "--out", str(out)])
    assert rc == 2 and not out.exists()
    assert "--data" in capsys.readouterr().err


def _mmlu_dir(root: Path) -> Path:
    """A two-subject MMLU in cais/mmlu JSON lines (dev: 5 shots each; test: 4 questions each)."""
    root.mkdir(parents=True)
    answers = {"anatomy": "ABAC", "virology": "DAAB"}
    for split in ("dev", "test"):
        with (root / f"{split}.jsonl").open("w") as fh:
            for subject, letters in answers.items():
                for i, a in enumerate("ABCDA" if split == "dev" else letters):
                    fh.write(json.dumps({"question": f"the water {i}", "subject": subject,
                                         "choices": ["one", "two", "three", "four"],
                                         "answer": "ABCD".index(a)}) + "\n")
    return root


def test_eval_scores_tasks_on_the_artifact_and_the_reference(
    artifact: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], fixture_corpus: Path
) -> None:
    """``--tasks mmlu`` scores the same prompts on the artifact and on the reference; bad task
    flags are refused before any model loads, and nothing is written to --out."""
    ref = tmp_path / "ref"
    tiny_model("llama").save_pretrained(ref)
    tiny_tokenizer().save_pretrained(ref)
    data = _mmlu_dir(tmp_path / "mmlu")
    common = ["--reference", str(ref), "--windows", "2", "--window", "32", "--device", "cpu"]
    rc = main(["eval", str(artifact), *common, "--tasks", "mmlu", "--mmlu", str(data),
               "--task-limit", "3"])
    assert rc == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out.strip().splitlines()[-1])
    got, want = report["tasks"]["mmlu"], report["reference_tasks"]["mmlu"]
    assert got["n"] == want["n"] == 6  # 3 sampled questions of each of the two subjects
    assert got["prompts_fingerprint"] == want["prompts_fingerprint"]
    assert 0.0 <= got["value"] <= 1.0 and 0.0 <= want["value"] <= 1.0
    assert report["provenance"]["config"]["tasks"] == ["mmlu"]
    assert "[eval] mmlu: accuracy_micro" in captured.err and "vs reference" in captured.err
    out = tmp_path / "r.json"
    for bad, needle in ((["--tasks", "mmlu,trivia"], "unknown task 'trivia'"),
                        (["--mmlu", str(data)], "--tasks does not ask for mmlu"),
                        (["--tasks", "mmlu", "--task-limit", "0"], "--task-limit")):
        assert main(["eval", str(artifact), *common, *bad, "--out", str(out)]) == 2
        assert needle in capsys.readouterr().err and not out.exists()
