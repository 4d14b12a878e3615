"""End-to-end tuning (leechq.quant.tune): exact composition, KL going down, the held-out monitor
keeping the best state, resume after a kill, and the written artifact giving the tuned logits."""

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
from leechq.formats.artifact import GroupAffine
from leechq.quant.composed import ComposedLinear, lattice_factors
from leechq.quant.tune import (
    DEFAULT_TUNE_STEPS,
    TuneConfig,
    cache_teacher,
    topk_kl_loss,
    tune_memory_bytes,
    tune_model,
    tune_settings,
)

pytest.importorskip("transformers")


def _setup(seed: int = 0):  # type: ignore[no-untyped-def]
    """A tiny qwen2 (tails, biases, tied head) with one int4 matrix and a 4-bit tied table."""
    from recipe_tiny import quantized

    reference, student, enc = quantized("qwen2", seed)
    records = dict(enc.records)
    v = "model.layers.0.self_attn.v_proj"
    ref_v = reference.get_submodule(v).weight.detach()
    records[v] = int4_record(ref_v.shape[0], ref_v.shape[1], weight=ref_v)
    raw = dict(enc.raw)
    emb = "model.embed_tokens.weight"
    raw[emb] = GroupAffine.quantize(raw[emb], 4, 8)
    with torch.no_grad():
        student.get_submodule(v).weight.copy_(records[v].dequantize())
        student.get_parameter(emb).copy_(raw[emb].dequantize())
    return reference, student, records, raw


def _unrotate(rec, x: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
    from leechq.formats.rotation import apply_rotation_transpose

    return x if rec.rotation is None else apply_rotation_transpose(x, rec.rotation)


def test_lattice_factors_compose_the_decode_and_the_factors_fold_exactly() -> None:
    from leechq.codebooks import BLOCK

    rec = lattice_record("tetra", 7, 56, seed=4, gain_bits=1)
    unit, gidx, tail = lattice_factors(rec)
    assert unit.shape == (7, 48) and gidx.shape == (7, 2) and tail is not None
    scale = rec.centroids.double()[gidx.long()].repeat_interleave(BLOCK, dim=1)
    composed = _unrotate(rec, torch.cat((scale * unit, tail), dim=1))
    torch.testing.assert_close(composed.float(), rec.dequantize(torch.float32), rtol=0, atol=2e-6)
    bias = torch.randn(7)
    m = ComposedLinear(rec, bias, ("row_scales", "centroids", "biases"), torch.device("cpu"),
                       torch.float32)
    with torch.no_grad():
        m.lam.copy_(torch.linspace(0.5, 1.5, 7))
        m.gamma.copy_(torch.tensor([1.25, 0.9]))  # crosses over: the fold re-sorts
    x = torch.randn(3, 56)
    folded = m.fold()
    assert bool((folded.centroids[1:] >= folded.centroids[:-1]).all())
    want = torch.nn.functional.linear(x, folded.dequantize(torch.float32), bias)
    torch.testing.assert_close(m(x), want, rtol=1e-5, atol=1e-5)
    q = int4_record(6, 48, seed=1)
    m4 = ComposedLinear(q, None, ("int4",), torch.device("cpu"), torch.float32)
    torch.testing.assert_close(m4(x[:, :48]), x[:, :48] @ q.dequantize().T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["gemma3", "gemma", "llama"])
def test_the_composed_model_gives_the_students_logits_scaled_embeddings_too(family: str) -> None:
    """Attaching changes nothing before training, also where the embedding scales its rows
    (``embed_scale``, the Gemma families); an embedding that does more than that is refused."""
    from leechq_tiny import family_model
    from recipe_tiny import config, quantize_fn, shift_embedding, windows

    from leechq.quant.composed import GROUPS, attach, detach

    student = family_model(family)
    enc = quantize_fn(student, windows(4, seed=100), config())
    raw = dict(enc.raw)
    emb = "model.embed_tokens.weight"
    raw[emb] = GroupAffine.quantize(raw[emb], 4, 8)
    with torch.no_grad():
        student.get_parameter(emb).copy_(raw[emb].dequantize())
    stored = {n: t for n, t in raw.items() if n not in enc.tied}
    ids = windows(2, 16, seed=3)
    with torch.no_grad():
        before = student(input_ids=ids).logits
    att = attach(student, enc.records, stored, GROUPS, torch.device("cpu"), torch.float32)
    with torch.no_grad():
        after = student(input_ids=ids).logits
    detach(student, att)
    torch.testing.assert_close(after, before, rtol=0, atol=1e-5)
    # detaching released the frozen parts (a GPU never holds them beside the returned weights)
    for composed in (*att.linears.values(), *att.embeddings.values()):
        assert all(b is None for b in composed._buffers.values())

    shift_embedding(student)
    with pytest.raises(InvalidInput, match="not a table lookup"):
        attach(student, enc.records, stored, GROUPS, torch.device("cpu"), torch.float32)


@pytest.mark.parametrize("d_in,gain_bits,rotate,zero", [
    (56, 1, True, False), (48, 2, True, True), (56, 1, False, True), (72, 0, True, False)])
def test_lattice_factors_split_the_rotated_decode_by_centroid_and_compose_it(
        d_in: int, gain_bits: int, rotate: bool, zero: bool) -> None:
    """U·c_G is the rotated decode of the blocks (U zero where the centroid is 0), T its tail and
    G the gain indices, exactly; at init the composed weight is the record's decode."""
    import dataclasses

    from leechq.codebooks import BLOCK

    rec = lattice_record("tetra", 9, d_in, seed=d_in + gain_bits, gain_bits=gain_bits,
                         rotate=rotate)
    if zero:
        c = rec.centroids.clone()
        c[0] = 0.0
        rec = dataclasses.replace(rec, centroids=c)
    unit, gidx, tail = lattice_factors(rec)
    rot = rec.dequantize_rotated()
    cut = rec.n_blocks * BLOCK
    assert unit.dtype == torch.float64 and unit.shape == (9, cut)
    assert gidx.dtype == torch.int32 and torch.equal(gidx.long(), rec.gains.long())
    picked = rec.centroids.double()[rec.gains.long()].repeat_interleave(BLOCK, dim=1)
    torch.testing.assert_close(unit * picked, rot[:, :cut], rtol=1e-15, atol=0)
    assert bool((unit[picked == 0.0] == 0.0).all())
    if rec.tail_cols:
        assert tail is not None and torch.equal(tail, rot[:, cut:])
    else:
        assert tail is None
    m = ComposedLinear(rec, None, ("row_scales", "centroids"), torch.device("cpu"), torch.float32)
    w, _ = m.compose()
    torch.testing.assert_close(w, rec.dequantize(torch.float32), rtol=0, atol=2e-6)


@pytest.mark.parametrize("width", [56, 96, 576, 1536, 4096])
def test_the_tuners_unrotation_is_the_exact_one_to_float32_accuracy(width: int) -> None:
    """Two Hadamard-factor products (and the odd mix folded into the left one) give Qᵀ."""
    from leechq.formats.rotation import apply_rotation_transpose, generate_rotation
    from leechq.quant.composed import _Unrotation

    tables = generate_rotation(width, 11)
    x = torch.randn(5, width, dtype=torch.float64)
    want = apply_rotation_transpose(x, tables)
    got = _Unrotation(tables, torch.device("cpu"))(x.float())
    torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-6 * float(x.abs().max()))
    assert not torch.equal(got, x.float())


def test_bf16_parts_under_autocast_compose_in_f32_and_train_like_f32() -> None:
    """The CUDA set-up (bf16 frozen parts, bf16 autocast forward) emulated on the CPU: the composed
    weight stays f32 and within bf16 rounding of the decode, and the factor gradients are those
    of the f32 module to bf16 accuracy."""
    rec = lattice_record("tetra", 16, 200, seed=5, gain_bits=1)
    groups = ("row_scales", "centroids")
    m32 = ComposedLinear(rec, None, groups, torch.device("cpu"), torch.float32)
    m16 = ComposedLinear(rec, None, groups, torch.device("cpu"), torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        w16, _ = m16.compose()
    assert w16.dtype == torch.float32
    dec = rec.dequantize(torch.float32)
    torch.testing.assert_close(w16, dec, rtol=0, atol=2**-8 * float(dec.abs().max()))
    x = torch.randn(6, 200)
    for m, ctx in ((m32, False), (m16, True)):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=ctx):
            y = m(x)
        y.float().square().sum().backward()
    for a, b in zip(m16.trainable(), m32.trainable(), strict=True):
        assert a.grad is not None and bool(torch.isfinite(a.grad).all())
        torch.testing.assert_close(a.grad, b.grad, rtol=0.05, atol=0.05 * float(b.grad.abs().max()))


def test_a_composed_lattice_linear_keeps_one_copy_of_the_weight_whatever_the_centroids() -> None:
    """The frozen buffers are U and T in the compute dtype and an int32 index per block: the same
    bytes for 1 and 4 centroids (only the centroid vector grows)."""

    def weight_bytes(gain_bits: int) -> int:
        rec = lattice_record("tetra", 8, 96, seed=3, gain_bits=gain_bits)
        m = ComposedLinear(rec, None, ("row_scales", "centroids"), torch.device("cpu"),
                           torch.bfloat16)
        return sum(b.numel() * b.element_size() for n, b in m.named_buffers()
                   if n in ("unit", "tail", "gidx"))

    assert weight_bytes(0) == weight_bytes(2) == 8 * 96 * 2 + 8 * 4 * 4


def test_composed_gradients_match_autograd_through_the_plain_composition() -> None:
    rec = lattice_record("tetra", 5, 48, seed=2)
    m = ComposedLinear(rec, torch.randn(5), ("row_scales", "centroids", "biases"),
                       torch.device("cpu"), torch.float64)
    with torch.no_grad():
        m.lam.copy_(torch.linspace(0.8, 1.2, 5))
    x = torch.randn(4, 48, dtype=torch.float64, requires_grad=True)
    m(x).pow(2).sum().backward()
    got = [p.grad.clone() for p in m.trainable()] + [x.grad.clone()]
    for p in m.trainable():
        p.grad = None
    x2 = x.detach().clone().requires_grad_(True)
    w, b = m.compose()
    torch.nn.functional.linear(x2, w.double(), b.double()).pow(2).sum().backward()
    want = [p.grad for p in m.trainable()] + [x2.grad]
    for a, e in zip(got, want, strict=True):
        torch.testing.assert_close(a.double(), e.double(), rtol=1e-4, atol=1e-6)


def test_topk_loss_is_the_full_kl_when_k_covers_the_vocab_and_a_lower_bound_otherwise() -> None:
    from recipe_tiny import windows

    reference, student, _, _ = _setup()
    ids = windows(2, 12, seed=3)
    from leechq.quant.row_scales import kl_loss, model_logits

    with torch.no_grad():
        t, s = model_logits(reference, ids), model_logits(student, ids)
    full = float(kl_loss(t, s))
    exact = cache_teacher(reference, ids, topk=10_000)
    assert float(topk_kl_loss(exact, [0, 1], s)) == pytest.approx(full, rel=1e-5)
    coarse = float(topk_kl_loss(cache_teacher(reference, ids, topk=8), [0, 1], s))
    assert 0 < coarse <= full + 1e-6


def test_tuning_lowers_kl_on_the_calibration_windows_and_the_model_is_the_folded_records(
) -> None:
    from recipe_tiny import windows

    from leechq.quant.row_scales import mean_kl

    reference, student, records, raw = _setup()
    train = windows(8, 24, seed=1)
    before = mean_kl(student, reference, train)
    # the default teacher: the full one every step (the exact KL)
    cfg = TuneConfig(steps=12, warmup_steps=2, lr=2e-2)
    res = tune_model(student, reference, records, raw, train, cfg, progress=False)
    assert mean_kl(student, reference, train) < 0.8 * before
    assert res.loss_history[-1] < res.loss_history[0]
    assert set(res.parameters) == {"row_scales", "centroids", "int4", "tables", "norms",
                                   "biases"}
    for name, rec in res.records.items():
        assert torch.equal(student.get_submodule(name).weight, rec.dequantize(torch.float32))
    emb = res.raw["model.embed_tokens.weight"]
    assert torch.equal(student.get_parameter("model.embed_tokens.weight"), emb.dequantize())
    norm = "model.layers.1.input_layernorm.weight"
    assert torch.equal(student.get_parameter(norm), res.raw[norm])
    assert not torch.equal(res.raw[norm], raw[norm])


def test_the_held_out_monitor_keeps_the_best_state() -> None:
    from recipe_tiny import windows

    reference, student, records, raw = _setup()
    train, monitor = windows(8, 24, seed=1), windows(3, 24, seed=2)
    cfg = TuneConfig(steps=12, warmup_steps=2, lr=2e-2, monitor_every=4, teacher_topk=32,
                     groups=("row_scales", "norms"))
    res = tune_model(student, reference, records, raw, train, cfg, monitor_windows=monitor,
                     progress=False)
    kls = dict((int(s), kl) for s, kl in res.monitor_history)
    assert res.best_step == min(kls, key=kls.get) and res.best_step > 0
    assert res.monitor_kl_after < 0.95 * res.monitor_kl_before
    assert res.monitor_kl_after == pytest.approx(res.monitor_kl_best, rel=1e-4)


def test_the_monitor_keeps_the_best_state_and_patience_stops() -> None:
    from recipe_tiny import windows

    reference, student, records, raw = _setup()
    train, monitor = windows(4, 24, seed=1), windows(2, 24, seed=2)
    # a learning rate far too high: the held-out KL gets worse, the start is kept
    cfg = TuneConfig(steps=10, warmup_steps=0, lr=3.0, monitor_every=2, patience=2,
                     teacher_topk=0, groups=("norms",))
    before = copy.deepcopy(student)
    res = tune_model(student, reference, records, raw, train, cfg, monitor_windows=monitor,
                     progress=False)
    kls = [kl for _, kl in res.monitor_history]
    assert res.best_step == 0 and min(kls[1:]) > kls[0]
    assert res.stopped_early and res.steps == 4
    for name in raw:
        if name.endswith("layernorm.weight"):
            assert torch.equal(student.get_parameter(name), before.get_parameter(name))


def test_resume_after_a_kill_gives_the_same_parameters(tmp_path: Path) -> None:
    from recipe_tiny import windows

    reference, student, records, raw = _setup()
    train, monitor = windows(6, 24, seed=1), windows(2, 24, seed=2)
    cfg = TuneConfig(steps=8, warmup_steps=2, lr=1e-2, monitor_every=3, checkpoint_every=2,
                     teacher_topk=16)
    clean = tune_model(copy.deepcopy(student), reference, records, raw, train, cfg,
                       monitor_windows=monitor, progress=False)

    class Kill(Exception):
        pass

    def kill(step: int, loss: float) -> None:
        if step == 4:
            raise Kill

    ckpt = tmp_path / "tune"
    with pytest.raises(Kill):
        tune_model(copy.deepcopy(student), reference, records, raw, train, cfg,
                   monitor_windows=monitor, checkpoint_dir=ckpt, on_step=kill, progress=False)
    with pytest.raises(InvalidInput, match="another run"):
        tune_model(copy.deepcopy(student), reference, records, raw, train,
                   TuneConfig(steps=8, lr=5e-3), checkpoint_dir=ckpt, progress=False)
    resumed = tune_model(copy.deepcopy(student), reference, records, raw, train, cfg,
                         monitor_windows=monitor, checkpoint_dir=ckpt, progress=False)
    assert resumed.resumed_from == 4 and not ckpt.exists()
    assert resumed.monitor_history == clean.monitor_history
    for name, rec in clean.records.items():
        other = resumed.records[name]
        for field in ("row_scales", "centroids", "scales", "biases"):
            if hasattr(rec, field):
                assert torch.equal(getattr(rec, field), getattr(other, field)), (name, field)
    for name, t in clean.raw.items():
        a = t.scales if isinstance(t, GroupAffine) else t
        b = resumed.raw[name].scales if isinstance(t, GroupAffine) else resumed.raw[name]
        assert torch.equal(a, b), name


def test_config_validation_and_round_trip() -> None:
    cfg = TuneConfig(steps=3, groups=["norms", "int4"])
    assert TuneConfig.from_dict(cfg.to_dict()) == cfg
    for bad in ({"groups": ("nope",)}, {"groups": ()}, {"teacher_topk": -1}, {"lr": 0},
                {"monitor_every": 0}):
        with pytest.raises(InvalidInput):
            TuneConfig(**bad)


def test_the_recipe_settings_for_a_budget() -> None:
    """Steps: a tenth of warm-up and a monitor score every tenth; seconds replace the steps; no
    budget is no tuning; a negative budget is refused."""
    cfg = tune_settings()
    tenth = DEFAULT_TUNE_STEPS // 10
    assert (cfg.steps, cfg.lr, cfg.warmup_steps, cfg.monitor_every) == (DEFAULT_TUNE_STEPS, 2e-3,
                                                                        tenth, tenth)
    assert (tune_settings(30).warmup_steps, tune_settings(30).monitor_every) == (3, 3)
    assert (tune_settings(5).warmup_steps, tune_settings(5).monitor_every) == (1, 1)
    timed = tune_settings(30, 90.0)
    assert (timed.steps, timed.time_budget_s, timed.warmup_steps) == (0, 90.0, 10)
    assert tune_settings(0) is None and tune_settings(0, 0.0) is None
    for bad in ((-1, 0.0), (10, -5.0)):
        with pytest.raises(InvalidInput, match="tuning budget"):
            tune_settings(*bad)


def test_the_memory_estimate_counts_student_teacher_parts_and_a_steps_transients() -> None:
    """The larger of the placed models (CUDA: student f32 + teacher bf16) and training: the
    student's dense weights replaced by their parts on CUDA (bf16 parts, an int32 per 24 linear
    weights; on the CPU f32 parts beside the kept weights, teacher f32), plus the step's
    transients (f32 copies of the largest weight, activations per token per linear feature); a
    tied tensor once."""
    import leechq.quant.tune as tune

    model = torch.nn.Sequential(torch.nn.Embedding(10, 48), torch.nn.Linear(48, 6),
                                torch.nn.Linear(6, 10, bias=False))
    params = 10 * 48 + 48 * 6 + 6 + 6 * 10
    linear, tables = 48 * 6 + 6 * 10, 10 * 48
    features = 48 + 6 + 6 + 10

    def transient(tokens: int, largest: int) -> int:
        return (tune.TRANSIENT_WEIGHT_COPIES * 4 * largest
                + int(tokens * tune.ACTIVATION_BYTES * features))

    for tokens in (1, 1000):
        gpu = (params - linear - tables) * 4 + (linear + tables) * 2 + linear // 24 * 4
        gpu += params * 2 + transient(tokens, 480)
        assert tune_memory_bytes(model, on_cuda=True, tokens=tokens) == max(params * 6, gpu)
        parts = (linear + tables) * 4 + linear // 24 * 4
        assert (tune_memory_bytes(model, on_cuda=False, tokens=tokens)
                == params * 8 + parts + transient(tokens, 480))
    assert tune_memory_bytes(model, on_cuda=True, tokens=1000) > tune_memory_bytes(
        model, on_cuda=True, tokens=1)
    model[0] = torch.nn.Embedding(10, 6)
    model[2].weight = model[0].weight  # tied, [10, 6] both
    tied = 10 * 6 + 48 * 6 + 6
    # the tied tensor is a table (no gain indices), counted once
    assert (tune_memory_bytes(model, on_cuda=False, tokens=1)
            == tied * 8 + (48 * 6 + 60) * 4 + 12 * 4 + transient(1, 288))


@pytest.mark.gpu
def test_tuning_on_cuda_in_bf16_autocast_lowers_kl_and_folds_exactly() -> None:
    from recipe_tiny import windows

    from leechq.quant.row_scales import mean_kl

    reference, student, records, raw = _setup()
    reference, student = reference.cuda(), student.cuda()
    train, monitor = windows(8, 24, seed=1), windows(3, 24, seed=2)
    before = mean_kl(student, reference, train)
    cfg = TuneConfig(steps=12, warmup_steps=2, lr=2e-2, monitor_every=4)
    res = tune_model(student, reference, records, raw, train, cfg, monitor_windows=monitor,
                     progress=False)
    assert mean_kl(student, reference, train) < before
    assert res.monitor_kl_after <= res.monitor_kl_before
    for name, rec in res.records.items():
        w = student.get_submodule(name).weight
        assert w.is_cuda and torch.equal(w.cpu(), rec.dequantize(torch.float32))


def test_a_seconds_budget_is_training_time_the_teacher_and_composing_come_on_top(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import time

    from recipe_tiny import windows

    import leechq.quant.tune as tune

    reference, student, records, raw = _setup()
    real = tune.cache_teacher

    def slow_teacher(*args, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(1.5)  # longer than the whole budget
        return real(*args, **kwargs)

    monkeypatch.setattr(tune, "cache_teacher", slow_teacher)
    cfg = TuneConfig(steps=0, time_budget_s=1.0, probe_steps=1, groups=("norms",),
                     teacher_topk=32)  # the one-off teacher cache
    res = tune_model(student, reference, records, raw, windows(4, 16, seed=1), cfg,
                     progress=False)
    assert res.teacher_seconds >= 1.5
    assert res.total_steps > 1  # the budget was not spent on the teacher (a step is ~0.05 s)
