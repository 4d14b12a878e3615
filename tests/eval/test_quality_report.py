"""``benchmarks/quality.py --tiny`` runs end to end: table, paired intervals, JSON last line."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "quality.py"


def _script(name: str) -> ModuleType:
    """A fresh copy of the report script, imported as module ``name``."""
    spec = importlib.util.spec_from_file_location(name, SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tiny_result(module: ModuleType, argv: list[str],
                 capsys: pytest.CaptureFixture[str]) -> dict:
    """Run ``module.main(argv)`` (a ``--tiny`` run, which registers the stand-in codebook), check
    it exits 0, drop the stand-in again and return the JSON last line of its output."""
    try:
        assert module.main(argv) == 0
    finally:
        from standin_codebook import unregister

        unregister()
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _refused(module: ModuleType, arms: str, cases: tuple[tuple[list[str], str], ...],
             capsys: pytest.CaptureFixture[str]) -> None:
    """Each ``(argv, says)`` of ``cases`` (with ``--arms arms`` unless it names its own) exits
    before any model loads with an error on stderr containing ``says``."""
    for bad, says in cases:
        with pytest.raises(SystemExit):
            module.main(["--tiny", *(["--arms", arms] if "--arms" not in bad else []), *bad])
        assert says in capsys.readouterr().err


def test_quality_report_on_the_tiny_model(capsys: pytest.CaptureFixture[str]) -> None:
    module = _script("quality_report")
    result = _tiny_result(module, ["--tiny", "--arms", "bare,full,full+tune,rtn", "--bits", "2,4",
                                   "--boot", "50"], capsys)
    arms = {(r["arm"], r["set"]) for r in result["rows"]}
    assert arms == {(a, s) for a in ("bare", "full", "full+tune", "rtn-2", "rtn-4")
                    for s in ("in-domain", "unseen")}
    rows = {(r["arm"], r["set"]): r for r in result["rows"]}
    # the recipe beats the bare encoding on KL, and 4-bit RTN beats 2-bit RTN
    for s in ("in-domain", "unseen"):
        assert rows[("full", s)]["kl"] < rows[("bare", s)]["kl"]
        assert rows[("rtn-4", s)]["kl"] < rows[("rtn-2", s)]["kl"]
        # the recipe arms say how the int4 selection ended
        full = rows[("full", s)]
        assert {"int4", "int4_gain_nonpositive", "int4_over_budget", "tables_upgraded"} <= set(full)
    iv = [i for i in result["intervals"] if i["arm"] == "bare"]
    assert len(iv) == 2 and all(i["ci95"]["kl"][0] <= i["ci95"]["kl"][1] for i in iv)
    tuned = rows[("full+tune", "in-domain")]  # the recipe's teacher: the full one, no cache
    assert tuned["tune_teacher_topk"] == 0 and tuned["tune_teacher_rest_mass"] is None


def test_tune_topk_sets_the_teacher_of_the_tuning_arms(capsys: pytest.CaptureFixture[str]) -> None:
    """``--tune-topk 8,0`` tunes the full arm's result twice: ``full+tune`` against an 8-entry
    teacher cache, ``full+tune topk=0`` against the full teacher every step (no cache, no rest
    mass), with a paired interval between the two; bad sizes are refused before any model
    loads."""
    module = _script("quality_tune_topk")
    result = _tiny_result(module, ["--tiny", "--arms", "full,full+tune", "--tune-topk", "8,0",
                                   "--boot", "20", "--compare-to", "full+tune"], capsys)
    topk = {r["arm"]: (r.get("tune_teacher_topk"), r.get("tune_teacher_rest_mass"))
            for r in result["rows"]}
    assert topk["full"] == (None, None)
    assert topk["full+tune"][0] == 8 and 0.0 <= topk["full+tune"][1] <= 1.0
    assert topk["full+tune topk=0"] == (0, None)
    pairs = {(i["arm"], i["vs"]) for i in result["intervals"]}
    assert pairs == {("full", "full+tune"), ("full+tune topk=0", "full+tune")}
    assert result["plot"] == "no plot (pass --plot PATH)"  # docs/quality.png is left alone
    _refused(module, "full+tune", (
        (["--tune-topk", "-1"], "--tune-topk: give one or more sizes >= 0"),
        (["--tune-topk", "8,x"], "not a comma-separated list of numbers"),
        (["--tune-topk", "8,8"], "a value is repeated"),
        (["--arms", "full+tune", "--tune-topk", "8,0"], "--arms needs full"),
    ), capsys)


def test_tune_steps_add_arms_tuned_for_other_step_counts(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--tune-steps 6,3`` tunes the full arm's result twice on the same training text:
    ``full+tune`` for 6 steps, ``full+tune steps=3`` for 3, with a paired interval between the
    two; bad counts are refused before any model loads."""
    module = _script("quality_tune_steps")
    result = _tiny_result(module, ["--tiny", "--arms", "full,full+tune", "--tune-steps", "6,3",
                                   "--boot", "20", "--compare-to", "full+tune"], capsys)
    arms = {r["arm"]: r for r in result["rows"] if r["set"] == "unseen"}
    assert set(arms) == {"full", "full+tune", "full+tune steps=3"}
    assert arms["full+tune"]["kl"] != arms["full+tune steps=3"]["kl"] != arms["full"]["kl"]
    assert (arms["full+tune"]["tune_steps"], arms["full+tune steps=3"]["tune_steps"]) == (6, 3)
    for arm in arms.values():  # each step's seconds, under the step names the row lists
        assert list(arm["step_seconds"]) == arm["steps"]
        assert all(t >= 0 for t in arm["step_seconds"].values())
    assert "tune" in arms["full+tune"]["step_seconds"]
    assert "tune" not in arms["full"]["step_seconds"]
    assert {(i["arm"], i["vs"]) for i in result["intervals"]} == {
        ("full", "full+tune"), ("full+tune steps=3", "full+tune")}
    _refused(module, "full,full+tune", (
        (["--tune-steps", "6,-1"], "--tune-steps: give one or more counts >= 0"),
        (["--tune-steps", "6,6"], "a value is repeated"),
        (["--tune-steps", "6,0"], "needs --tune-steps >= 1"),
        (["--arms", "full+tune", "--tune-steps", "6,3"], "--arms needs full"),
    ), capsys)


def test_tune_batch_adds_arms_tuned_with_more_windows_a_step(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--tune-batch 4`` tunes the full arm's result a second time with 4 windows a step for the
    same steps, on as many windows as those steps read, with a paired interval to ``full+tune``;
    bad batches and a run without the full arm are refused before any model loads."""
    module = _script("quality_tune_batch")
    result = _tiny_result(module, ["--tiny", "--arms", "full,full+tune", "--tune-steps", "3",
                                   "--tune-batch", "4", "--boot", "20", "--compare-to",
                                   "full+tune"], capsys)
    arms = {r["arm"]: r for r in result["rows"] if r["set"] == "unseen"}
    assert set(arms) == {"full", "full+tune", "full+tune batch=4"}
    assert (arms["full+tune"]["tune_batch"], arms["full+tune batch=4"]["tune_batch"]) == (2, 4)
    assert arms["full+tune"]["tune_steps"] == arms["full+tune batch=4"]["tune_steps"] == 3
    assert arms["full+tune batch=4"]["kl"] != arms["full+tune"]["kl"]
    assert ("full+tune batch=4", "full+tune") in {(i["arm"], i["vs"])
                                                  for i in result["intervals"]}
    # auto: the batch arm's windows are as many as its steps read (3 x 4 = 12 > 3 x 2)
    from quality_arms import train_windows

    assert train_windows("auto", 64, 0, 3, 4) == [12]
    assert train_windows("auto", 64, 0, 3) == [6]
    _refused(module, "full,full+tune", (
        (["--tune-batch", "0"], "--tune-batch: give one or more batches >= 1"),
        (["--tune-batch", "4,4"], "a value is repeated"),
        (["--arms", "full+tune", "--tune-batch", "4"], "--arms needs full"),
    ), capsys)


def _variant_arms(module: ModuleType, flag: str, value: str, arm: str,
                  capsys: pytest.CaptureFixture[str]) -> dict[str, dict]:
    """The tiny report with ``flag value`` beside full and full+tune (3 steps): the arm ``arm``
    is the same full result tuned again for the same steps, its KL differs from full+tune's and
    it carries a paired interval to full+tune; the unseen set's rows by arm."""
    result = _tiny_result(module, ["--tiny", "--arms", "full,full+tune", "--tune-steps", "3",
                                   flag, value, "--boot", "20", "--compare-to", "full+tune"],
                          capsys)
    arms = {r["arm"]: r for r in result["rows"] if r["set"] == "unseen"}
    assert set(arms) == {"full", "full+tune", arm}
    assert arms["full+tune"]["tune_steps"] == arms[arm]["tune_steps"] == 3
    assert arms[arm]["kl"] != arms["full+tune"]["kl"]
    assert (arm, "full+tune") in {(i["arm"], i["vs"]) for i in result["intervals"]}
    return arms


def test_tune_lr_adds_arms_tuned_at_another_peak_rate(capsys: pytest.CaptureFixture[str]) -> None:
    """``--tune-lr 0.02`` tunes the full arm's result a second time at that peak learning rate for
    the same steps on the same windows, with a paired interval to ``full+tune``; bad rates and a
    run without the full arm are refused before any model loads."""
    module = _script("quality_tune_lr")
    arms = _variant_arms(module, "--tune-lr", "0.02", "full+tune lr=0.02", capsys)
    assert (arms["full+tune"]["tune_lr"], arms["full+tune lr=0.02"]["tune_lr"]) == (2e-3, 0.02)
    # distinct rates, however close, name distinct arms (and checkpoints)
    assert module.lr_arm(1e-3) != module.lr_arm(0.0010000001)
    assert module.lr_arm(4e-3) == "full+tune lr=0.004"
    _refused(module, "full,full+tune", (
        (["--tune-lr", "0"], "--tune-lr: give one or more finite rates > 0"),
        (["--tune-lr", "inf"], "finite rates > 0"),
        (["--tune-lr", "fast"], "--tune-lr: not a comma-separated list"),
        (["--tune-lr", "1e-3,0.001"], "a value is repeated"),
        (["--arms", "full+tune", "--tune-lr", "1e-3"], "--arms needs full"),
    ), capsys)


def test_tune_temperature_adds_arms_tuned_at_another_kl_temperature(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--tune-temperature 2`` tunes the full arm's result a second time with the KL at that
    temperature, for the same steps on the same windows, with a paired interval to ``full+tune``;
    bad temperatures and a run without the full arm are refused before any model loads."""
    module = _script("quality_tune_temperature")
    arms = _variant_arms(module, "--tune-temperature", "2", "full+tune tau=2.0", capsys)
    assert (arms["full+tune"]["tune_temperature"],
            arms["full+tune tau=2.0"]["tune_temperature"]) == (1.0, 2.0)
    _refused(module, "full,full+tune", (
        (["--tune-temperature", "0"], "give one or more finite temperatures > 0"),
        (["--tune-temperature", "nan"], "finite temperatures > 0"),
        (["--tune-temperature", "2,2.0"], "a value is repeated"),
        (["--arms", "full+tune", "--tune-temperature", "2"], "--arms needs full"),
    ), capsys)


def test_tune_without_adds_arms_with_a_group_frozen(capsys: pytest.CaptureFixture[str]) -> None:
    """``--tune-without norms`` tunes the full arm's result a second time with the norm weights
    frozen, for the same steps on the same windows, with a paired interval to ``full+tune``;
    unknown or repeated groups and a run without the full arm are refused before any model
    loads."""
    module = _script("quality_tune_without")
    _variant_arms(module, "--tune-without", "norms", "full+tune without=norms", capsys)
    _refused(module, "full,full+tune", (
        (["--tune-without", "layers"], "--tune-without: give one or more groups of row_scales"),
        (["--tune-without", "norms, norms"], "a value is repeated"),
        (["--arms", "full+tune", "--tune-without", "norms"], "--arms needs full"),
    ), capsys)


def test_tune_text_adds_arms_tuned_on_text_the_reference_samples(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--tune-text generated`` tunes the full arm's result a second time, for the same steps, on
    windows the reference samples itself, with a paired interval to ``full+tune``; unknown or
    repeated kinds and a run without the full arm are refused before any model loads."""
    module = _script("quality_tune_text")
    _variant_arms(module, "--tune-text", "generated", "full+tune text=generated", capsys)
    _refused(module, "full,full+tune", (
        (["--tune-text", "web"], "--tune-text: give one or more kinds of generated, mix"),
        (["--tune-text", "mix,mix"], "a value is repeated"),
        (["--arms", "full+tune", "--tune-text", "mix"], "--arms needs full"),
    ), capsys)


def test_teacher_windows_sample_the_model_and_never_a_banned_token() -> None:
    """``teacher_windows`` gives int64 [n, length] windows, the same for the same seed and other
    windows for another; no banned id nor id >= vocab is ever drawn, first tokens included; a
    model that always prefers one allowed token writes only that token after the first; ``mix``
    replaces the odd windows."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    _script("quality_text_windows")  # benchmarks/ on sys.path
    from quality_text import TEXT_KINDS, mixed_windows, teacher_windows

    assert TEXT_KINDS == ("generated", "mix")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    model = LlamaForCausalLM(cfg).eval()
    banned = [0, 1, 2, 7]
    a = teacher_windows(model, 5, 12, banned, 60, seed=3, batch=2)
    assert a.dtype == torch.int64 and tuple(a.shape) == (5, 12)
    assert torch.equal(a, teacher_windows(model, 5, 12, banned, 60, seed=3, batch=2))
    assert not torch.equal(a, teacher_windows(model, 5, 12, banned, 60, seed=4, batch=2))
    assert not torch.isin(a, torch.tensor(banned)).any() and int(a.max()) < 60
    head = torch.nn.Linear(32, 64)  # every logit 0 but token 9's, 60: only 9 is ever sampled
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        head.bias[9] = 60.0
    model.lm_head = head
    one = teacher_windows(model, 3, 6, banned, 60, seed=0, batch=3)
    assert (one[:, 1:] == 9).all() and not torch.isin(one[:, 0], torch.tensor(banned)).any()
    calib = torch.arange(5 * 12).reshape(5, 12)
    mixed = mixed_windows(calib, a)
    assert torch.equal(mixed[0::2], calib[0::2]) and torch.equal(mixed[1::2], a[:2])


def test_table_group_sets_the_full_arms_table_groups(capsys: pytest.CaptureFixture[str]) -> None:
    """``--table-group 64,32`` builds one set of full arms per group from one bare encode: the
    recipe's (64) with the plain names, 32 named ``full tables-g32`` …, both within the budget,
    with paired intervals against the recipe's tables; bad groups are refused before any model
    loads."""
    module = _script("quality_table_group")
    result = _tiny_result(module, ["--tiny", "--arms", "full,full+tune", "--table-group",
                                   "64,32", "--tune-steps", "3", "--boot", "20",
                                   "--compare-to", "full+tune"], capsys)
    arms = {r["arm"]: r for r in result["rows"] if r["set"] == "unseen"}
    assert set(arms) == {"full", "full+tune", "full tables-g32", "full+tune tables-g32"}
    assert {a: r["table_group"] for a, r in arms.items()} == {
        "full": 64, "full+tune": 64, "full tables-g32": 32, "full+tune tables-g32": 32}
    assert all(r["bpp"] <= 2.7 + 1e-9 for r in arms.values())
    assert arms["full tables-g32"]["kl"] != arms["full"]["kl"]
    assert ("full+tune tables-g32", "full+tune") in {(i["arm"], i["vs"])
                                                     for i in result["intervals"]}
    for bad, says in ((["--table-group", "1"], "--table-group: give one or more group sizes"),
                      (["--table-group", "32,32"], "a value is repeated")):
        with pytest.raises(SystemExit):
            module.main(["--tiny", "--arms", "full", *bad])
        assert says in capsys.readouterr().err


def test_int4_post_hoc_adds_arms_without_the_re_encode(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--int4-post-hoc`` adds ``full int4=post-hoc`` and ``full+tune int4=post-hoc``: the same
    int4 choice at the same bits, swapped in without the recipe's re-encode (so other measures),
    with a paired interval to ``full+tune``; without a full arm it is refused."""
    module = _script("quality_int4_post_hoc")
    result = _tiny_result(module, ["--tiny", "--arms", "full,full+tune", "--int4-post-hoc",
                                   "--boot", "20", "--compare-to", "full+tune"], capsys)
    arms = {r["arm"]: r for r in result["rows"] if r["set"] == "unseen"}
    assert set(arms) == {"full", "full+tune", "full int4=post-hoc", "full+tune int4=post-hoc"}
    assert arms["full"]["int4"] > 0  # a choice to apply two ways
    for name in ("full", "full+tune"):
        swapped = arms[f"{name} int4=post-hoc"]
        assert (swapped["int4"], swapped["bpp"]) == (arms[name]["int4"], arms[name]["bpp"])
        assert swapped["kl"] != arms[name]["kl"]
    assert "tune" in arms["full+tune int4=post-hoc"]["steps"]
    assert ("full+tune int4=post-hoc", "full+tune") in {
        (i["arm"], i["vs"]) for i in result["intervals"]}
    with pytest.raises(SystemExit):
        module.main(["--tiny", "--arms", "rtn", "--int4-post-hoc"])
    assert "--int4-post-hoc varies the full arms" in capsys.readouterr().err


def test_train_tokens_add_arms_trained_on_less_text(capsys: pytest.CaptureFixture[str]) -> None:
    """``--train-tokens auto,256`` trains a second full+tune arm on the first 4 of the training
    windows (the tiny run's 64-token windows), from the same encode, with a paired interval to
    ``full+tune``; bad values are refused before any model loads."""
    module = _script("quality_train_tokens")
    result = _tiny_result(module, ["--tiny", "--arms", "full+tune", "--train-tokens", "auto,256",
                                   "--boot", "20", "--compare-to", "full+tune"], capsys)
    arms = {r["arm"]: r for r in result["rows"] if r["set"] == "unseen"}
    assert set(arms) == {"full+tune", "full+tune train=256"}
    assert arms["full+tune"]["kl"] != arms["full+tune train=256"]["kl"]
    assert {(i["arm"], i["vs"]) for i in result["intervals"]} == {
        ("full+tune train=256", "full+tune")}
    _refused(module, "full+tune", (
        (["--train-tokens", "8"], "nor a token count >= --window"),
        (["--train-tokens", "x"], "neither 'auto'"),
        (["--train-tokens", "auto,auto"], "distinct window counts"),
        (["--arms", "rtn", "--train-tokens", "auto,256"], "--arms needs full"),
    ), capsys)


def test_unknown_arms_are_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    """A misspelt arm (or an empty list) stops the run before any model loads, naming it and
    the choices."""
    module = _script("quality_bad_arms")
    for arms, said in (("full,ful+tune", "'ful+tune'"), (",", "empty list")):
        with pytest.raises(SystemExit):
            module.main(["--tiny", "--arms", arms])
        err = capsys.readouterr().err
        assert said in err and "full+tune" in err


def test_plot_from_earlier_results(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--plot-from`` reads the rows of earlier result files (a JSON last line, or one
    pretty-printed object), plots them together (a row measured again: once, unless its file
    carries a label) and measures nothing; a file that is not a result is refused with its
    name."""
    module = _script("quality_plot")
    row = {"model": "m", "arm": "bare", "set": "unseen", "bpp": 2.5, "ppl_ratio": 1.5, "kl": 0.3}
    a = tmp_path / "a.json"
    a.write_text("a table line\n" + json.dumps({"rows": [row]}) + "\n", encoding="utf-8")
    b = tmp_path / "b.json"
    b.write_text(json.dumps({"rows": [{**row, "arm": "rtn-2"}]}, indent=2), encoding="utf-8")
    png = tmp_path / "q.png"
    assert module.main(["--plot-from", f"{a},{b}", "--plot", str(png)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["rows"] == 2
    assert png.exists() == out["plot"].startswith("wrote")  # no matplotlib: the note says so
    c = tmp_path / "c.json"  # the same model, arm and set again: one row, the later file's
    c.write_text(json.dumps({"rows": [{**row, "ppl_ratio": 1.4}]}), encoding="utf-8")
    assert module.main(["--plot-from", f"{a},{b},{c}", "--plot", str(png)]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"] == 2
    # a label keeps the same arms of another run apart: "bare [mix]" is a row of its own
    assert module.main(["--plot-from", f"{a},{c}=mix", "--plot", str(png)]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"] == 2
    bad = tmp_path / "bad.json"
    bad.write_text("not json\n", encoding="utf-8")
    with pytest.raises(SystemExit, match=r"bad\.json: not a quality\.py result file"):
        module.main(["--plot-from", str(bad), "--plot", str(png)])


def test_baseline_arms_only_skip_the_lattice_encode(monkeypatch: pytest.MonkeyPatch) -> None:
    """Asked for scalar baselines only, the report encodes nothing with the lattice."""
    import argparse

    import torch

    import leechq.models.quantize as quantize

    module = _script("quality_arms")
    monkeypatch.setattr(quantize, "quantize_model_in_place",
                        lambda *a, **k: pytest.fail("a lattice encode for baseline arms"))
    args = argparse.Namespace(codebook="tetra", device="cpu", tiny=True, checkpoint_dir=None,
                              seed=0, lattice_head=False)
    calib = torch.zeros(2, 8, dtype=torch.long)
    assert module.leechq_arms(object(), {"calib": calib}, args, ["rtn", "gptq", "hqq"]) == {}
    with pytest.raises(pytest.fail.Exception, match="lattice encode"):
        module.leechq_arms(object(), {"calib": calib}, args, ["bare"])


def test_arms_of_another_codebook_are_named_after_it() -> None:
    """Tetra's arms are ``bare`` / ``full`` / ``full+tune``; another codebook's carry its name, so
    that results of both codebooks plot and table side by side."""
    import argparse

    module = _script("quality_names")
    assert module.arm_prefix(argparse.Namespace(codebook="tetra", tiny=False)) == ""
    assert module.arm_prefix(argparse.Namespace(codebook="ball", tiny=False)) == "ball "
    assert module.arm_prefix(argparse.Namespace(codebook="standin", tiny=True)) == ""


def test_calib_data_is_what_the_report_calibrates_on(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """``--calib-data FILE`` gives the calibration, sensitivity, training and monitor windows (the
    same loader as ``leechq quantize --calib-data``); the held-out sets stay the named corpora."""
    import argparse
    import sys

    sys.path.insert(0, str(SCRIPT.parents[1] / "tests"))
    from leechq_tiny import WORDS, save_family_model

    import leechq.data.corpus as corpus

    model_dir, _ = save_family_model(tmp_path, "llama")
    words = [w for w in WORDS if w.isalpha()][:40]
    calib_words, held_words = words[:20], words[20:]
    (tmp_path / "mine.txt").write_text(" ".join(calib_words * 300), encoding="utf-8")
    monkeypatch.setattr(corpus, "load_text", lambda name, split, **kw: " ".join(held_words * 300))
    module = _script("quality_calib")
    args = argparse.Namespace(window=16, calib_tokens=64, train_windows=[4], windows=2,
                              in_domain="pydoc", unseen_domain="fortunes",
                              calib_data=str(tmp_path / "mine.txt"))
    _, sets, roles = module.real_setup(str(model_dir), args)
    assert args.calibration.startswith("user:")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    calib_ids = set(tok.convert_tokens_to_ids(calib_words))
    held_ids = set(tok.convert_tokens_to_ids(held_words))
    assert [tuple(t.shape) for t in roles["train"]] == [(4, 16)]
    for role in ("calib", "sens", "train", "monitor"):
        ids = roles[role][0] if role == "train" else roles[role]
        assert set(ids.flatten().tolist()) <= calib_ids | {tok.bos_token_id}, role
    for ids in sets.values():
        assert set(ids.flatten().tolist()) <= held_ids | {tok.bos_token_id}


def test_loader_arms_are_loaded_one_at_a_time(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """An arm given as a loader (llama.cpp's files) is loaded once, when it is evaluated, and
    measured on both sets like a model arm; without a GGUF source the llamacpp arms refuse."""
    module = _script("quality_loader")
    with pytest.raises(SystemExit, match="GGUF source"):
        module.llamacpp_arms({"calib": None}, None)
    loads: list[str] = []

    def fake_arms(reference, roles, args, wanted):  # type: ignore[no-untyped-def]
        import copy

        import torch

        def loader(name: str, noise: float):  # type: ignore[no-untyped-def]
            def load():  # type: ignore[no-untyped-def]
                loads.append(name)
                model = copy.deepcopy(reference)
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(noise * torch.randn_like(p))
                return model
            return load

        return {"exact": (loader("exact", 0.0), 16.0, {"seconds": 0.0}),
                "noisy": (loader("noisy", 0.05), 16.0, {"seconds": 0.0})}

    monkeypatch.setattr(module, "baseline_arms", fake_arms)
    # `rtn` alone makes the lattice arms empty (no encode); the fake replaces the baselines
    assert module.main(["--tiny", "--arms", "rtn", "--boot", "20", "--compare-to", "exact"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = {(r["arm"], r["set"]): r for r in result["rows"]}
    assert loads == ["exact", "noisy"]
    for s in ("in-domain", "unseen"):
        assert rows[("exact", s)]["kl"] == pytest.approx(0.0, abs=1e-9)  # the reference itself
        assert rows[("noisy", s)]["kl"] > 1e-4
    assert {(i["arm"], i["vs"]) for i in result["intervals"]} == {("noisy", "exact")}


def test_several_budgets_make_one_pair_of_full_arms_each(capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    """``--target-bpp 2.5,4`` makes ``full @2.5`` … ``full+tune @4`` from one encode, each tuned arm
    compared with the full arm of its own budget; a bad budget list is refused by name."""
    module = _script("quality_budgets")
    for bad, why in (("2,x", "not a comma-separated list"), ("0", "budgets > 0"),
                     ("3,3", "repeated")):
        with pytest.raises(SystemExit):
            module.main(["--tiny", "--arms", "full", "--target-bpp", bad])
        assert why in capsys.readouterr().err
    result = _tiny_result(module, ["--tiny", "--arms", "full,full+tune", "--target-bpp", "2.5,4",
                                   "--boot", "20", "--tune-steps", "2"], capsys)
    rows = {(r["arm"], r["set"]): r for r in result["rows"]}
    names = ("full @2.5", "full+tune @2.5", "full @4", "full+tune @4")
    assert {a for a, _ in rows} == set(names)
    for s in ("in-domain", "unseen"):
        assert rows[("full @2.5", s)]["target_bpp"] == 2.5
        assert rows[("full @2.5", s)]["bpp"] <= rows[("full @4", s)]["bpp"]
    pairs = {(i["arm"], i["vs"]) for i in result["intervals"]}
    assert pairs == {("full+tune @2.5", "full @2.5"), ("full+tune @4", "full @4")}
    assert module.compared_arm("full+tune @4", "full", {"full @4": 0}) == "full @4"
    assert module.compared_arm("rtn-4", "full", {"full @4": 0}) == "full"
    lat = {"full lattice-emb": 0, "full lattice-emb @4": 0}
    assert module.compared_arm("full+tune lattice-emb", "full", lat) == "full lattice-emb"
    assert module.compared_arm("full+tune lattice-emb @4", "full", lat) == "full lattice-emb @4"
    import argparse

    args = argparse.Namespace(lattice_embedding=True, target_bpp=[2.5, 4.0])
    assert module.budget_suffix(args, 4.0) == " lattice-emb @4"
    args.target_bpp = [2.7]
    assert module.budget_suffix(args, 2.7) == " lattice-emb"


def test_a_run_with_a_checkpoint_dir_resumes_to_the_same_rows(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--checkpoint-dir``: the same command run again takes the encodes and the sensitivity pass
    from the checkpoints (no block encoded, no probe pass); the row scales and the tuning, whose
    checkpoints go once they finish, run again to the same measures."""
    import leechq.quant.layerwise as layerwise
    import leechq.quant.sensitivity as sensitivity

    module = _script("quality_resume")
    argv = ["--tiny", "--arms", "full+tune", "--boot", "20", "--tune-steps", "2",
            "--checkpoint-dir", str(tmp_path / "ckpt")]
    runs = []
    try:
        for again in (False, True):
            if again:
                monkeypatch.setattr(layerwise, "_quantize_block",
                                    lambda *a, **k: pytest.fail("a block was encoded again"))
                monkeypatch.setattr(sensitivity, "teacher_logits_cache",
                                    lambda *a, **k: pytest.fail("the sensitivity pass ran again"))
            assert module.main(argv) == 0
            runs.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    finally:
        from standin_codebook import unregister

        unregister()
    measures = [{(r["arm"], r["set"]): (r["bpp"], r["ppl_ratio"], r["kl"]) for r in run["rows"]}
                for run in runs]
    assert measures[0] == measures[1] and len(measures[0]) == 2
    assert {p.name for p in (tmp_path / "ckpt").iterdir()} == {"encode", "sensitivity"}


def test_tasks_are_scored_on_every_arm_and_the_reference(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        toy_tokenizer) -> None:  # type: ignore[no-untyped-def]
    """``--tasks mmlu``: the reference and each arm are scored on the same prompts (one
    fingerprint), the reference's score is what the task gives on its own, and a setup without a
    tokenizer or an unknown task is refused."""
    import csv

    from leechq.eval.tasks import MMLUTask, mmlu

    for subject, answers in (("anatomy", "ABCDABCD"), ("virology", "DDCBA")):
        for split, rows in (("dev", "ABCDA"), ("test", answers)):
            (tmp_path / split).mkdir(exist_ok=True)
            with (tmp_path / split / f"{subject}_{split}.csv").open("w", newline="") as fh:
                for i, a in enumerate(rows):
                    csv.writer(fh).writerow([f"{subject} {split} q{i}?", "w", "x", "y", "z", a])
    module = _script("quality_tasks")
    tiny = module.tiny_setup
    seen: list = []

    def with_tokenizer(args):  # type: ignore[no-untyped-def]
        model, sets, roles = tiny(args)
        seen.append(model)
        return model, sets, {**roles, "tokenizer": toy_tokenizer}

    argv = ["--tiny", "--arms", "rtn", "--bits", "4", "--boot", "20", "--compare-to", "rtn-4",
            "--tasks", "mmlu", "--mmlu", str(tmp_path)]
    try:
        with pytest.raises(SystemExit, match="tokenizer"):
            module.main(argv)
        capsys.readouterr()
        monkeypatch.setattr(module, "tiny_setup", with_tokenizer)
        assert module.main(argv) == 0
    finally:
        from standin_codebook import unregister

        unregister()
    captured = capsys.readouterr()
    result = json.loads(captured.out.strip().splitlines()[-1])
    ref = result["reference_tasks"]["tiny"]["mmlu"]
    direct = MMLUTask(data=mmlu.load_mmlu(tmp_path), per_subject=None).run(seen[0], toy_tokenizer)
    assert ref["n"] == 13 and ref["value"] == pytest.approx(direct.value)
    assert ref["fingerprint"] == direct.prompts_fingerprint
    assert ref["picked_letters"] == direct.details["picked_letters"]
    assert sum(ref["picked_letters"].values()) == 13
    for r in result["rows"]:
        assert r["tasks"]["mmlu"]["fingerprint"] == ref["fingerprint"]
        assert r["tasks"]["mmlu"]["n"] == 13 and 0.0 <= r["tasks"]["mmlu"]["value"] <= 1.0
    assert "mmlu (rtn-4)" in captured.err and "mmlu (reference)" in captured.err
    with pytest.raises(SystemExit):
        module.main(["--tiny", "--tasks", "arc"])
    assert "unknown task 'arc'" in capsys.readouterr().err


def test_damping_adds_arms_from_another_encode(capsys: pytest.CaptureFixture[str]) -> None:
    """``--damping 0.01,0.3`` encodes twice: the encoder's damping keeps the plain arm names, the
    other's arms end in `` damp=0.3``, measure otherwise and carry a paired interval to the plain
    arm of their kind (``--compare-to full+tune``); the damping each arm was encoded with is in
    its row; bad values are refused before any model loads."""
    module = _script("quality_damping")
    result = _tiny_result(module, ["--tiny", "--arms", "bare,full,full+tune", "--tune-steps", "3",
                                   "--damping", "0.01,0.3", "--boot", "20",
                                   "--compare-to", "full+tune"], capsys)
    arms = {r["arm"]: r for r in result["rows"] if r["set"] == "unseen"}
    plain = ("bare", "full", "full+tune")
    assert set(arms) == {*plain, *(f"{a} damp=0.3" for a in plain)}
    assert {arms[a]["damping"] for a in plain} == {0.01}
    assert {arms[f"{a} damp=0.3"]["damping"] for a in plain} == {0.3}
    assert all(arms[a]["kl"] != arms[f"{a} damp=0.3"]["kl"] for a in plain)
    pairs = {(i["arm"], i["vs"]) for i in result["intervals"]}
    assert ("full+tune damp=0.3", "full+tune") in pairs
    assert ("full damp=0.3", "full+tune damp=0.3") in pairs
    assert module.damping_suffix(0.01) == "" and module.damping_suffix(0.1) == " damp=0.1"
    _refused(module, "full", (
        (["--damping", "0"], "--damping: give one or more dampings in (0, 1)"),
        (["--damping", "1"], "dampings in (0, 1)"),
        (["--damping", "some"], "--damping: not a comma-separated list"),
        (["--damping", "0.1,0.10"], "a value is repeated"),
    ), capsys)


def test_seed_draws_another_encode_and_is_recorded(capsys: pytest.CaptureFixture[str]) -> None:
    """``--seed N`` re-draws the rotations (another bare encode, other measures) and the JSON says
    which draw it was; a seed outside 0..65535 is refused by name."""
    module = _script("quality_seed")
    argv = ["--tiny", "--arms", "bare", "--boot", "20"]
    first, other = (_tiny_result(module, argv + extra, capsys) for extra in ([], ["--seed", "7"]))
    assert (first["seed"], other["seed"]) == (0, 7)
    kl = [{r["set"]: r["kl"] for r in run["rows"]} for run in (first, other)]
    assert kl[0].keys() == kl[1].keys() == {"in-domain", "unseen"} and kl[0] != kl[1]
    with pytest.raises(SystemExit):
        module.main([*argv, "--seed", "65536"])
    assert "--seed" in capsys.readouterr().err


def test_lattice_head_codes_the_head_in_every_arm_of_ours(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--lattice-head``: the bare encode and the full arms code the tiny model's untied head on
    the lattice (named `` lattice-head``; the full arm's int4 step may take the head, and it stores
    no head table); ``--head-bits`` beside it is refused before any model loads."""
    module = _script("quality_lattice_head")
    result = _tiny_result(module, ["--tiny", "--arms", "bare,full", "--lattice-head",
                                   "--boot", "20"], capsys)
    rows = {r["arm"]: r for r in result["rows"] if r["set"] == "unseen"}
    assert set(rows) == {"bare lattice-head", "full lattice-head"}
    assert all(r["kl"] > 0 for r in rows.values())
    full = rows["full lattice-head"]  # the int4 choice by name, the head a candidate among them
    assert len(full["int4_matrices"]) == full["int4"]
    import argparse

    args = argparse.Namespace(lattice_embedding=True, lattice_head=True, target_bpp=[2.7])
    assert module.budget_suffix(args, 2.7) == " lattice-emb lattice-head"
    _refused(module, "full", (
        (["--lattice-head", "--head-bits", "4"], "--lattice-head codes the head on the lattice"),
    ), capsys)
