"""The bare/full recipes: planned accounting against the artifact's report,
and end-to-end runs on tiny models whose artifacts load (int4 records, 4/8-bit tables, tied
head)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from leechq_tiny import int4_record, lattice_record

from leechq.errors import InvalidInput
from leechq.formats.accounting import artifact_report, record_served_bits, whole_model_bits
from leechq.formats.artifact import GroupAffine, read_artifact, write_artifact
from leechq.formats.quantized_weight import Int4Weight, QuantizedWeight
from leechq.quant.recipe import projected_bits, run_recipe, table_records, tune_result
from leechq.quant.recipe_spec import Recipe, resolve_recipe
from leechq.quant.row_scales import RowScaleConfig
from leechq.quant.tune import TuneConfig

pytest.importorskip("transformers")

EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"


def test_planned_bits_equal_the_artifact_report(tmp_path: Path) -> None:
    from leechq.config import QuantConfig

    g = torch.Generator().manual_seed(0)
    records = {
        "model.layers.0.self_attn.q_proj": lattice_record("tetra", 32, 100, seed=1),
        "model.layers.0.self_attn.v_proj": int4_record(24, 200, seed=3),
    }
    raw = {
        EMBED: GroupAffine.quantize(torch.randn(40, 100, generator=g), 4, 64),
        HEAD: GroupAffine.quantize(torch.randn(40, 100, generator=g), 8, 64),
        "model.norm.weight": torch.randn(100, generator=g),
        "model.layers.0.input_layernorm.weight": torch.randn(100, generator=g).half(),
    }
    bits = whole_model_bits(records, raw)
    path = write_artifact(tmp_path / "a", base_config={"model_type": "llama"},
                          quant_config=QuantConfig(codebook="tetra"), records=records, raw=raw)
    report = artifact_report(path)
    assert bits.bits_per_param == report["rates"]["whole_model_bits_per_param"]
    assert bits.parameters == report["counts"]["parameters"]
    assert projected_bits(records, raw) == bits
    # by hand: tetra 48 bits a block + f16 tail + f32 row scale + 2 f32 centroids; int4 4 bits +
    # f16 scale and offset per 128-group; tables code bits + 32 per 64-group; floats at 16 bits
    q = 32 * 4 * 48 + 16 * 32 * 4 + 32 * 32 + 2 * 32
    v = 24 * 200 * 4 + 32 * 24 * 2
    tables = 40 * 100 * 4 + 32 * 40 * 2 + 40 * 100 * 8 + 32 * 40 * 2
    assert bits.served_bits == q + v + tables + 16 * 200
    assert record_served_bits(records["model.layers.0.self_attn.q_proj"]) == q


def test_projected_bits_count_dense_projections_at_the_record_rate() -> None:
    rec = lattice_record("tetra", 8, 48, seed=0)
    rate = record_served_bits(rec) / (8 * 48)
    raw = {"dense.weight": torch.randn(8, 48), "norm": torch.randn(48)}
    p = projected_bits({"q": rec}, raw, ["dense.weight"])
    assert p.parameters == 2 * 8 * 48 + 48
    assert p.served_bits == pytest.approx(2 * rate * 8 * 48 + 16 * 48)
    with pytest.raises(InvalidInput, match="2-D"):
        projected_bits({"q": rec}, raw, ["norm"])


def _target_between(arch: str, fraction: float) -> float:
    """A whole-model budget that affords about ``fraction`` of all the int4 upgrades."""
    from recipe_tiny import quantized

    _, _, enc = quantized(arch)
    recipe = resolve_recipe("full")
    tables = table_records(enc.raw, enc.tied, recipe, EMBED, HEAD)
    base = whole_model_bits(enc.records, {**enc.raw, **tables})
    extra = 0.0
    ref = quantized(arch)[0]
    for name, rec in enc.records.items():
        w = ref.get_submodule(name).weight.detach()
        extra += record_served_bits(Int4Weight.quantize(w)) - record_served_bits(rec)
    return (base.served_bits + fraction * extra) / base.parameters


def test_full_recipe_end_to_end_writes_an_artifact_that_loads(tmp_path: Path) -> None:
    from recipe_tiny import config, logits, quantize_fn, quantized, windows

    from leechq.models.load import load

    arch = "qwen3"  # untied head, ragged widths
    reference = quantized(arch)[0]
    target = _target_between(arch, 0.3)
    recipe = resolve_recipe(
        "full", target, sensitivity_windows=2,
        row_scales=RowScaleConfig(steps=4, warmup_steps=1, lr=1e-2, batch=2), tune=None,
    )
    res = run_recipe(
        reference, windows(4, seed=100), config(), recipe, quantize_fn=quantize_fn,
        embed_name=EMBED, head_name=HEAD, train_windows=windows(4, seed=7),
        sensitivity_windows=windows(2, seed=8), monitor_windows=windows(2, seed=9),
    )
    meta = res.metadata
    chosen = meta["selection"]["int4"]
    upgraded = meta["selection"]["tables_upgraded"]
    assert meta["selection"]["chosen"] == [
        n for n in meta["selection"]["chosen"] if n in chosen or n + ".weight" in upgraded
    ]
    n_lattice = sum(isinstance(r, QuantizedWeight) for r in res.records.values())
    assert 0 < len(chosen) < n_lattice + len(chosen)
    assert sorted(n for n, r in res.records.items() if isinstance(r, Int4Weight)) == sorted(chosen)
    assert meta["selection"]["spent_bits"] <= meta["selection"]["budget_bits"]
    assert meta["whole_model_bits_per_param"] <= target + 1e-12
    assert meta["whole_model_bits_per_param"] > meta["bare_bits_per_param"] - 10  # sanity
    assert set(meta["sensitivity"]["matrices"]) >= set(chosen)
    assert [s["step"] for s in meta["steps"]] == ["encode", "int4_by_sensitivity", "tables",
                                                  "row_scales"]
    assert meta["row_scales"]["steps"] == 4 and meta["row_scales"]["rows_changed"] > 0
    assert res.config.int4_modules == tuple(chosen)  # re-encoded with the chosen set
    embed_bits = 8 if EMBED in upgraded else 4
    assert res.config.embedding_encoding == f"int{embed_bits}"
    assert isinstance(res.raw[EMBED], GroupAffine) and res.raw[EMBED].bits == embed_bits
    assert isinstance(res.raw[HEAD], GroupAffine) and res.raw[HEAD].bits == 8

    path = res.write(tmp_path / "full", base_config=reference.config.to_dict())
    art = read_artifact(path)
    assert art.quantization_config["provenance"]["recipe"]["selection"]["int4"] == chosen
    assert art.raw_quant[EMBED].bits == embed_bits and art.raw_quant[HEAD].bits == 8
    report = artifact_report(path)
    assert report["rates"]["whole_model_bits_per_param"] == meta["whole_model_bits_per_param"]
    assert report["counts"]["int4_records"] == len(chosen)
    loaded, _ = load(path, device="cpu", dtype="float32", tokenizer=False)
    ids = windows(2, 16, seed=11)
    torch.testing.assert_close(logits(loaded, ids), logits(res.model, ids), rtol=0, atol=1e-5)
    # the stored head is the 8-bit table, the embedding its own (both kept packed by load)
    assert torch.equal(loaded.lm_head.table.dequantize_rows(), art.raw_quant[HEAD].dequantize())
    assert torch.equal(loaded.model.embed_tokens.dequantize_rows(),
                       art.raw_quant[EMBED].dequantize())


def test_tied_head_post_hoc_swap_and_bare(tmp_path: Path) -> None:
    from recipe_tiny import config, logits, quantize_fn, quantized, windows

    from leechq.models.load import load

    reference, student, enc = quantized("qwen2")  # tied head, q/k/v biases
    kw = dict(quantize_fn=quantize_fn, embed_name=EMBED, head_name=HEAD)
    bare = run_recipe(reference, windows(4, seed=100), config(), resolve_recipe("bare"),
                      student=student, encoded=enc, **kw)
    assert [s["step"] for s in bare.metadata["steps"]] == ["encode"]
    assert bare.records == enc.records and bare.raw == enc.raw
    recipe = resolve_recipe("full", _target_between("qwen2", 0.5), requantize=False,
                            row_scales=None, sensitivity_windows=2, tune=None)
    res = run_recipe(reference, windows(4, seed=100), config(), recipe,
                     sensitivity_windows=windows(2, seed=8), **kw)
    chosen = res.metadata["selection"]["int4"]
    assert chosen and res.metadata["selection"]["applied"] == "post-hoc swap"
    assert res.config.int4_modules == ()  # the encode ran without them: recorded as it ran
    for name in chosen:  # the swapped record is round-to-nearest of the original tensor
        want = Int4Weight.quantize(reference.get_submodule(name).weight.detach())
        assert torch.equal(res.records[name].qweight, want.qweight)
    assert res.tied == {HEAD: EMBED}
    assert HEAD not in res.raw and res.raw[EMBED].bits == 4
    assert "model.embed_tokens" in res.metadata["sensitivity"]["matrices"]  # a measured candidate
    assert res.metadata["selection"]["tables_upgraded"] == []  # too expensive for this budget
    path = res.write(tmp_path / "tied", base_config=reference.config.to_dict())
    loaded, _ = load(path, device="cpu", dtype="float32", tokenizer=False)
    assert loaded.lm_head.table is loaded.model.embed_tokens  # one packed table
    ids = windows(2, 16, seed=3)
    torch.testing.assert_close(logits(loaded, ids), logits(res.model, ids), rtol=0, atol=1e-5)


def test_a_generous_budget_buys_the_8_bit_table_first() -> None:
    from recipe_tiny import config, quantize_fn, quantized, windows

    reference, student, enc = quantized("qwen2")
    recipe = resolve_recipe("full", 64.0, requantize=False, row_scales=None,
                            sensitivity_windows=2, tune=None)
    res = run_recipe(reference, windows(4, seed=100), config(), recipe, quantize_fn=quantize_fn,
                     embed_name=EMBED, head_name=HEAD, sensitivity_windows=windows(2, seed=8),
                     student=student, encoded=enc)
    sel = res.metadata["selection"]
    assert sel["tables_upgraded"] == [EMBED]
    assert res.raw[EMBED].bits == 8 and res.config.embedding_encoding == "int8"
    gains = res.metadata["sensitivity"]["matrices"]
    assert sel["chosen"][0] == max(gains, key=lambda n: gains[n]["gain"] / gains[n]["extra_bits"])
    # every matrix whose int4 swap helped is int4 under this budget, the others are not
    helped = sorted(n for n, v in gains.items() if v["gain"] > 0 and n != "model.embed_tokens")
    assert sorted(sel["int4"]) == helped


def test_a_target_below_the_floor_says_why() -> None:
    """A budget the lattice projections and the narrowest tables already exceed chooses nothing
    and says so with the floor and the tables' share; a reachable one says nothing."""
    from recipe_tiny import config, quantize_fn, quantized, windows

    reference, student, enc = quantized("qwen2")
    kw = dict(quantize_fn=quantize_fn, embed_name=EMBED, head_name=HEAD,
              sensitivity_windows=windows(2, seed=8), encoded=enc)
    results = {}
    for target in (1.0, 64.0):
        recipe = resolve_recipe("full", target, requantize=False, row_scales=None,
                                sensitivity_windows=2, tune=None)
        results[target] = run_recipe(reference, windows(4, seed=100), config(), recipe,
                                     student=copy.deepcopy(student), **kw).metadata
    low = results[1.0]
    assert low["whole_model_bits_per_param"] > 1.0
    assert low["floor"]["bits_per_param"] > 1.0 and 0 < low["floor"]["table_share"] < 1
    assert low["selection"]["int4"] == [] and low["selection"]["tables_upgraded"] == []
    assert low["over_target"].startswith(f"{low['whole_model_bits_per_param']:.3f} b/param, "
                                         "above the 1 target")
    assert "over_target" not in results[64.0] and "floor" not in results[64.0]
    assert "--lattice-embedding" not in low["over_target"]  # tied: no such advice
    assert "--lattice-head" not in low["over_target"]
    reference, student, enc = quantized("qwen3")  # untied: the lattice embedding is suggested
    recipe = resolve_recipe("full", 1.0, requantize=False, row_scales=None,
                            sensitivity_windows=2, tune=None)
    kw["encoded"] = enc
    meta = run_recipe(reference, windows(4, seed=100), config(), recipe, student=student,
                      **kw).metadata
    assert "--lattice-embedding" in meta["over_target"] and "--lattice-head" in meta["over_target"]


def test_another_budget_reuses_the_sensitivity_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """A second budget over the same encode takes the first run's measurements (no second pass)
    and chooses from them as a fresh measurement would; measurements of other candidates are
    refused."""
    import copy

    from recipe_tiny import config, quantize_fn, quantized, windows

    import leechq.quant.recipe as recipe_mod

    reference, student, enc = quantized("qwen2")
    kw = dict(quantize_fn=quantize_fn, embed_name=EMBED, head_name=HEAD,
              sensitivity_windows=windows(2, seed=8), encoded=enc)

    def full(target: float):  # type: ignore[no-untyped-def]
        return resolve_recipe("full", target, requantize=False, row_scales=None,
                              sensitivity_windows=2, tune=None)

    first = run_recipe(reference, windows(4, seed=100), config(), full(64.0),
                       student=copy.deepcopy(student), **kw)
    fresh = run_recipe(reference, windows(4, seed=100), config(), full(3.0),
                       student=copy.deepcopy(student), **kw)
    monkeypatch.setattr(recipe_mod, "measure_swaps",
                        lambda *a, **k: pytest.fail("the sensitivity pass ran again"))
    reused = run_recipe(reference, windows(4, seed=100), config(), full(3.0),
                        student=copy.deepcopy(student), sensitivity=first.sensitivity, **kw)
    assert set(first.sensitivity) == set(fresh.sensitivity)
    assert reused.metadata["selection"] == fresh.metadata["selection"]
    assert reused.metadata["sensitivity"] == fresh.metadata["sensitivity"]
    with pytest.raises(InvalidInput, match="do not cover"):
        run_recipe(reference, windows(4, seed=100), config(), full(3.0),
                   student=copy.deepcopy(student),
                   sensitivity=dict(list(first.sensitivity.items())[1:]), **kw)


def test_recipe_refuses_inconsistent_inputs() -> None:
    from recipe_tiny import config, quantize_fn, quantized, windows

    reference = quantized("llama")[0]
    kw = dict(quantize_fn=quantize_fn, embed_name=EMBED, head_name=HEAD)
    with pytest.raises(InvalidInput, match="keep the tables"):
        run_recipe(reference, windows(4), config(embedding_encoding="int8"),
                   resolve_recipe("bare"), **kw)
    with pytest.raises(InvalidInput, match="sensitivity_windows"):
        run_recipe(reference, windows(4), config(), resolve_recipe("full"), **kw)
    with pytest.raises(InvalidInput, match="train_windows"):
        run_recipe(reference, windows(4), config(), Recipe(row_scales=RowScaleConfig()), **kw)
    with pytest.raises(InvalidInput, match=r"lattice_head.*head_bits must then be None"):
        run_recipe(reference, windows(4), config(lattice_head=True), Recipe(head_bits=8), **kw)


def test_tuning_is_skipped_with_the_reason_when_the_gpu_lacks_the_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a CUDA device whose free memory is below the estimate the step is dropped before the
    encode, and the reason recorded; the CPU and a recipe without tuning are never checked."""
    from recipe_tiny import config, quantize_fn, quantized, windows

    import leechq.quant.recipe as recipe_mod
    from leechq.quant.tune import tune_memory_bytes

    reference, student, enc = quantized("qwen2")
    full = resolve_recipe("full", _target_between("qwen2", 0.5), requantize=False,
                          row_scales=None, sensitivity_windows=2, device="cpu")
    assert recipe_mod.tuning_fits(full, reference, 16) is None  # the CPU
    need = tune_memory_bytes(reference, on_cuda=True, tokens=full.tune.batch * 16)
    monkeypatch.setattr(recipe_mod, "_device_dtype",
                        lambda r: (torch.device("cuda"), torch.bfloat16))
    for free, fits in ((need, True), (need - 1, False)):
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a, f=free: (f, 2 * need))
        reason = recipe_mod.tuning_fits(full, reference, 16)
        assert (reason is None) is fits
    assert "GiB" in reason and "--tune-steps 0" in reason
    assert recipe_mod.tuning_fits(full.replace(tune=None), reference, 16) is None

    monkeypatch.undo()
    monkeypatch.setattr(recipe_mod, "tuning_fits", lambda *a: "no room for it")
    res = run_recipe(reference, windows(4, seed=100), config(), full, quantize_fn=quantize_fn,
                     embed_name=EMBED, head_name=HEAD, sensitivity_windows=windows(2, seed=8),
                     train_windows=windows(4, seed=7), student=student, encoded=enc)
    assert res.metadata["tune"] == {"skipped": "no room for it"} and res.recipe.tune is None
    assert "tune" not in [s["step"] for s in res.metadata["steps"]]
    assert res.metadata["recipe"]["tune"] is None


def test_a_model_tuning_cannot_compose_gets_the_recipe_without_the_step() -> None:
    """An embedding whose forward is more than a lookup times ``embed_scale``: the tuning step is
    refused and left out with the reason recorded; the model is steps 1-4's, unchanged."""
    from recipe_tiny import config, logits, quantize_fn, quantized, shift_embedding, windows

    reference, student, enc = quantized("qwen2")
    for model in (reference, student):
        shift_embedding(model)
    recipe = resolve_recipe("full", _target_between("qwen2", 0.5), requantize=False,
                            row_scales=None, sensitivity_windows=2,
                            tune=TuneConfig(steps=2, warmup_steps=1, monitor_every=1))
    kw = dict(quantize_fn=quantize_fn, embed_name=EMBED, head_name=HEAD,
              sensitivity_windows=windows(2, seed=8))
    res = run_recipe(reference, windows(4, seed=100), config(), recipe, **kw,
                     train_windows=windows(4, seed=7), student=copy.deepcopy(student),
                     encoded=enc)
    plain = run_recipe(reference, windows(4, seed=100), config(), recipe.replace(tune=None),
                       **kw, student=copy.deepcopy(student), encoded=enc)
    assert "not a table lookup" in res.metadata["tune"]["skipped"] and res.recipe.tune is None
    assert res.metadata["recipe"]["tune"] is None
    assert [s["step"] for s in res.metadata["steps"]][-1] != "tune"
    ids = windows(2, 16, seed=3)
    torch.testing.assert_close(logits(res.model, ids), logits(plain.model, ids), rtol=0, atol=0)


def test_the_tuning_step_writes_an_artifact_that_gives_the_tuned_logits(tmp_path: Path) -> None:
    from recipe_tiny import config, logits, quantize_fn, quantized, windows

    from leechq.models.load import load

    reference, _student, _enc = quantized("qwen2")  # tied 4-bit table, biases, tails
    recipe = resolve_recipe(
        "full", _target_between("qwen2", 0.5), sensitivity_windows=2, row_scales=None,
        tune=TuneConfig(steps=6, warmup_steps=1, lr=2e-2, monitor_every=3),
    )
    kw = dict(quantize_fn=quantize_fn, embed_name=EMBED, head_name=HEAD)
    res = run_recipe(reference, windows(4, seed=100), config(), recipe, **kw,
                     train_windows=windows(6, seed=7), sensitivity_windows=windows(2, seed=8))
    untuned = run_recipe(reference, windows(4, seed=100), config(), recipe.replace(tune=None),
                         **kw, sensitivity_windows=windows(2, seed=8))
    tune = res.metadata["tune"]
    assert [s["step"] for s in res.metadata["steps"]][-1] == "tune"
    assert tune["steps"] == 6 and tune["best_step"] == 6  # no monitor: the last state
    assert set(tune["parameters"]) >= {"row_scales", "centroids", "tables", "norms", "biases"}
    ids = windows(2, 16, seed=11)
    assert not torch.allclose(logits(res.model, ids), logits(untuned.model, ids))
    path = res.write(tmp_path / "tuned", base_config=reference.config.to_dict())
    loaded, _ = load(path, device="cpu", dtype="float32", tokenizer=False)
    torch.testing.assert_close(logits(loaded, ids), logits(res.model, ids), rtol=0, atol=1e-5)
    assert read_artifact(path).quantization_config["provenance"]["recipe"]["tune"]["steps"] == 6

    # the tuning step added to the finished untuned result: the same model, the result unchanged
    before = logits(untuned.model, ids)
    continued = tune_result(untuned, reference, recipe.tune, windows(6, seed=7))
    torch.testing.assert_close(logits(continued.model, ids), logits(res.model, ids), rtol=0,
                               atol=1e-5)
    assert torch.equal(logits(untuned.model, ids), before) and "tune" not in untuned.metadata
    assert continued.metadata["tune"]["steps"] == 6 and continued.recipe.tune == recipe.tune
    assert [s["step"] for s in continued.metadata["steps"]][-1] == "tune"
    with pytest.raises(InvalidInput, match="already has a tuning step"):
        tune_result(res, reference, recipe.tune, windows(6, seed=7))


def test_a_lattice_coded_embedding_through_the_full_recipe(tmp_path: Path) -> None:
    """``lattice_embedding``: the untied embedding is coded right after the encode (every later
    step sees it), stored as a record under its module's name, counted at its coded rate in the
    budget and the report, and loads as a LatticeEmbedding with the recipe model's logits; a tied
    table is refused before any work, and the flag excludes a group-affine embedding width."""
    from leechq_tiny import tiny_model
    from recipe_tiny import config, logits, quantize_fn, windows

    from leechq.models.load import load
    from leechq.nn.lattice_embedding import LatticeEmbedding

    reference = tiny_model("qwen3")  # untied head
    cfg = config(codebook="tetra")  # the lattice embedding decodes Tetra or ball codes
    recipe = resolve_recipe(
        "full", 6.0, sensitivity_windows=2, embedding_bits=None, lattice_embedding=True,
        row_scales=RowScaleConfig(steps=2, warmup_steps=1, lr=1e-2, batch=2), tune=None,
    )
    assert "lattice-coded embedding" in recipe.describe() and "tables" in recipe.steps
    res = run_recipe(
        reference, windows(4, seed=100), cfg, recipe, quantize_fn=quantize_fn,
        embed_name=EMBED, head_name=HEAD, train_windows=windows(4, seed=7),
        sensitivity_windows=windows(2, seed=8), monitor_windows=windows(2, seed=9),
    )
    meta = res.metadata
    rec = res.records["model.embed_tokens"]
    assert isinstance(rec, QuantizedWeight) and rec.codebook == "tetra"
    assert EMBED not in res.raw and isinstance(res.raw[HEAD], GroupAffine)
    assert res.config.embedding_encoding == "lattice"
    assert [s["step"] for s in meta["steps"]] == ["encode", "lattice_embedding",
                                                  "int4_by_sensitivity", "tables", "row_scales"]
    assert torch.equal(res.model.model.embed_tokens.weight.detach(), rec.dequantize())
    assert "model.embed_tokens" not in meta["sensitivity"]["matrices"]  # never an int4 candidate
    path = res.write(tmp_path / "lat", base_config=reference.config.to_dict())
    report = artifact_report(path)
    assert report["rates"]["whole_model_bits_per_param"] == pytest.approx(
        meta["whole_model_bits_per_param"], rel=1e-12)
    loaded, _ = load(path, device="cpu", dtype="float32", tokenizer=False)
    assert isinstance(loaded.model.embed_tokens, LatticeEmbedding)
    ids = windows(2, 16, seed=11)
    torch.testing.assert_close(logits(loaded, ids), logits(res.model, ids), rtol=0, atol=1e-5)

    tuned = tune_result(res, reference, TuneConfig(steps=2, warmup_steps=1, batch=2,
                                                   teacher_topk=0, monitor_every=1),
                        windows(4, seed=7))  # quality.py's full+tune arm
    assert tuned.records["model.embed_tokens"] is rec and EMBED not in tuned.raw
    assert torch.equal(tuned.model.model.embed_tokens.weight.detach(), rec.dequantize())
    assert tuned.metadata["tune"]["steps"] == 2
    with pytest.raises(InvalidInput, match="embedding_bits must then be None"):
        resolve_recipe("full", lattice_embedding=True)
    with pytest.raises(InvalidInput, match="tied to"):
        run_recipe(tiny_model("llama"), windows(4), cfg, recipe, quantize_fn=quantize_fn,
                   embed_name=EMBED, head_name=HEAD, train_windows=windows(4, seed=7),
                   sensitivity_windows=windows(2, seed=8))
