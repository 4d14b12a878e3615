"""Per-matrix sensitivity by swaps, and the greedy selection under a bit budget."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from leechq.errors import ArtifactError, InvalidInput
from leechq.quant.sensitivity import Candidate, measure_swaps, select_under_budget

pytest.importorskip("transformers")


def test_swaps_find_the_damaged_matrix_and_leave_the_model_unchanged() -> None:
    from leechq_tiny import tiny_model
    from recipe_tiny import logits, windows

    reference = tiny_model("llama", seed=3)
    model = copy.deepcopy(reference)
    g = torch.Generator().manual_seed(0)
    names = [f"model.layers.{i}.{p}" for i in range(2)
             for p in ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj")]
    noise = {names[0]: 0.02, names[1]: 0.3, names[2]: 0.02, names[3]: 0.02, names[4]: 0.05,
             names[5]: 0.02}
    originals = {}
    with torch.no_grad():
        for n, scale in noise.items():
            w = model.get_submodule(n).weight
            originals[n] = w.detach().clone()
            w.add_(scale * w.abs().mean() * 10 * torch.randn(w.shape, generator=g))
    before = {n: model.get_submodule(n).weight.detach().clone() for n in names}
    ids = windows(3, 20, seed=4)
    out_before = logits(model, ids)
    res = measure_swaps(model, reference, ids, originals, batch=2, swaps_per_pass=4)
    assert list(res) == names
    # batching windows and candidates changes nothing but rounding
    one_by_one = measure_swaps(model, reference, ids, originals, batch=1, swaps_per_pass=1)
    for n in names:
        assert res[n].kl_swapped == pytest.approx(one_by_one[n].kl_swapped, rel=1e-4, abs=1e-9)
    ranked = sorted(res, key=lambda n: -res[n].gain)
    assert ranked[:2] == [names[1], names[4]]  # the two most damaged ones, in order
    assert res[names[4]].gain > 10 * max(abs(res[n].gain) for n in ranked[2:])
    assert len({m.kl_base for m in res.values()}) == 1
    for n in names:  # restored bit for bit
        assert torch.equal(model.get_submodule(n).weight, before[n])
    assert torch.equal(logits(model, ids), out_before)
    # restoring every matrix gives KL 0: the swapped-in weight really is used
    res_all = measure_swaps(reference, reference, ids, {names[1]: originals[names[1]]})
    assert res_all[names[1]].kl_swapped == pytest.approx(0.0, abs=1e-7)


def test_a_tied_table_swap_changes_the_embedding_and_the_head() -> None:
    from leechq_tiny import tiny_model
    from recipe_tiny import logits, windows

    from leechq.quant.row_scales import kl_loss

    reference = tiny_model("qwen2")  # tied head
    model = copy.deepcopy(reference)
    emb = model.get_submodule("model.embed_tokens")
    assert emb.weight is model.lm_head.weight
    alt = emb.weight.detach() + 0.05 * torch.randn(emb.weight.shape,
                                                   generator=torch.Generator().manual_seed(1))
    ids = windows(2, 16, seed=5)
    res = measure_swaps(model, reference, ids, {"model.embed_tokens": alt},
                        swaps_per_pass=2)["model.embed_tokens"]
    swapped = copy.deepcopy(model)
    with torch.no_grad():
        swapped.get_submodule("model.embed_tokens").weight.copy_(alt)  # the head follows
        want = float(kl_loss(logits(reference, ids), logits(swapped, ids)))
    assert res.kl_swapped == pytest.approx(want, rel=1e-4)
    assert torch.equal(model.get_submodule("model.embed_tokens").weight,
                       reference.get_submodule("model.embed_tokens").weight)


def test_swaps_refuse_bad_input_before_touching_the_model() -> None:
    from leechq_tiny import tiny_model
    from recipe_tiny import windows

    model = tiny_model("llama")
    ref = copy.deepcopy(model)
    with pytest.raises(InvalidInput, match="swap for"):
        measure_swaps(model, ref, windows(1), {"model.layers.0.mlp.up_proj": torch.zeros(3, 3)})
    with pytest.raises(InvalidInput, match="int64"):
        measure_swaps(model, ref, windows(1).float(), {})


def test_a_killed_pass_resumes_from_its_checkpoint(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed after two probe passes, the run measures only the candidates it lacks when started
    again, with one base KL; a complete file is answered without any pass; a file of other
    candidates or an unreadable one is refused."""
    from leechq_tiny import tiny_model
    from recipe_tiny import windows

    import leechq.quant.sensitivity as sens_mod

    reference = tiny_model("llama", seed=3)
    model = copy.deepcopy(reference)
    g = torch.Generator().manual_seed(1)
    names = [f"model.layers.{i}.{p}" for i in range(2)
             for p in ("self_attn.q_proj", "self_attn.o_proj", "mlp.up_proj")]
    swaps = {}
    with torch.no_grad():
        for n in names:
            w = model.get_submodule(n).weight
            swaps[n] = w.detach().clone()
            w.add_(0.2 * w.abs().mean() * torch.randn(w.shape, generator=g))
    ids = windows(2, 16, seed=6)
    fresh = measure_swaps(model, reference, ids, swaps, swaps_per_pass=2)
    ckpt = tmp_path / "sens" / "run.json"
    real = sens_mod._pass_kl
    calls = []

    def dies_on_the_fourth(*a, **k):  # base pass, two probe passes, then the kill
        calls.append(len(a[5]))
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(sens_mod, "_pass_kl", dies_on_the_fourth)
    with pytest.raises(KeyboardInterrupt):
        measure_swaps(model, reference, ids, swaps, swaps_per_pass=2, checkpoint=ckpt)
    assert [p.name for p in ckpt.parent.iterdir()] == ["run.json"]  # no temporary left
    calls.clear()
    resumed = measure_swaps(model, reference, ids, swaps, swaps_per_pass=2, checkpoint=ckpt)
    assert calls == [1, 2]  # the base pass and the one pass of the two candidates left
    assert list(resumed) == names and len({m.kl_base for m in resumed.values()}) == 1
    for n in names:
        assert resumed[n].kl_swapped == pytest.approx(fresh[n].kl_swapped, rel=1e-5)
        assert resumed[n].kl_base == pytest.approx(fresh[n].kl_base, rel=1e-6)
    # everything kept: no teacher logits, no pass
    monkeypatch.setattr(sens_mod, "teacher_logits_cache",
                        lambda *a, **k: pytest.fail("measured again"))
    again = measure_swaps(model, reference, ids, swaps, checkpoint=ckpt)
    assert again == resumed
    with pytest.raises(InvalidInput, match="other windows or other candidates"):
        measure_swaps(model, reference, ids, {names[0]: swaps[names[0]]}, checkpoint=ckpt)
    with pytest.raises(InvalidInput, match="other windows or other candidates"):
        measure_swaps(model, reference, windows(2, 16, seed=7), swaps, checkpoint=ckpt)
    ckpt.write_text("{not json", encoding="utf-8")
    with pytest.raises(ArtifactError, match="unreadable"):
        measure_swaps(model, reference, ids, swaps, checkpoint=ckpt)


def _c(name: str, gain: float, bits: float) -> Candidate:
    return Candidate(name=name, gain=gain, extra_bits=bits, weights=100)


def test_greedy_takes_the_best_gain_per_bit_within_budget() -> None:
    cands = [
        _c("a", 1.0, 100.0),  # 0.010 per bit
        _c("b", 3.0, 100.0),  # 0.030
        _c("c", 2.0, 400.0),  # 0.005 — does not fit after a, b
        _c("d", 0.5, 10.0),  # 0.050
        _c("e", -1.0, 10.0),  # harmful: never taken
        _c("f", 0.0, 1.0),  # useless: never taken
    ]
    sel = select_under_budget(cands, 250.0)
    assert sel.chosen == ["d", "b", "a"]
    assert sel.spent_bits == 210.0 and sel.spent_bits <= sel.budget_bits
    assert sel.predicted_gain == pytest.approx(4.5)
    assert sel.rejected_over_budget == ["c"]
    assert sel.skipped_nonpositive == ["e", "f"]
    assert select_under_budget(cands, 0.0).chosen == []
    assert select_under_budget(cands, 1e9).chosen == ["d", "b", "a", "c"]
    # a candidate that does not fit is skipped and a cheaper one later still goes in
    sel2 = select_under_budget([_c("big", 10.0, 100.0), _c("small", 0.1, 5.0)], 50.0)
    assert sel2.chosen == ["small"] and sel2.rejected_over_budget == ["big"]
    # ties break by name, deterministically
    assert select_under_budget([_c("y", 1, 1), _c("x", 1, 1)], 1.0).chosen == ["x"]
    with pytest.raises(InvalidInput, match="duplicate"):
        select_under_budget([_c("a", 1, 1), _c("a", 2, 1)], 10.0)
    assert sel.to_dict()["chosen"] == ["d", "b", "a"]
    assert sel.summary() == ("3 taken, 2 with gain <= 0 skipped, 1 over the budget; "
                             "0.00 of 0.00 Mbit spent")
    big = select_under_budget([_c("p", 1.0, 2e6), _c("q", 1.0, 3e6)], 2.5e6)
    assert big.summary().endswith("1 over the budget; 2.00 of 2.50 Mbit spent")
