"""Module replacement on a meta skeleton (docs/architecture.md §2: count the swapped modules
without materializing any weight) and q/k/v, gate/up grouping."""

from __future__ import annotations

import pytest
import torch
from leechq_tiny import ARCHS, quantize_randomly, tiny_config, tiny_model

from leechq.errors import InvalidInput, UnsupportedArchitecture
from leechq.nn.linear import LeechqLinear
from leechq.nn.records import record_tensor_specs
from leechq.nn.replace import (
    leechq_modules,
    replace_with_placeholders,
    replace_with_records,
    share_groups,
)


def _meta_skeleton(arch: str):
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights():
        return AutoModelForCausalLM.from_config(tiny_config(arch))


def _descriptors(records: dict) -> dict:
    from leechq.formats.artifact import build_tensors

    lattice = {k: r for k, r in records.items() if hasattr(r, "codebook")}
    int4 = {k: r for k, r in records.items() if k not in lattice}
    _, desc, _, _ = build_tensors(lattice, {}, "tetra", 1)
    _, desc4, _, _ = build_tensors(int4, {}, "tetra", 1)
    return {**desc, **desc4}


@pytest.mark.parametrize("arch", ARCHS)
def test_placeholder_count_on_meta_skeleton(arch: str) -> None:
    records = quantize_randomly(tiny_model(arch))
    skeleton = _meta_skeleton(arch)
    n_linear = sum(isinstance(m, torch.nn.Linear) for m in skeleton.modules())
    swapped = replace_with_placeholders(skeleton, _descriptors(records))
    assert len(swapped) == len(records) == 7 * tiny_config(arch).num_hidden_layers
    assert len(leechq_modules(skeleton)) == len(records)
    # only the head stays an nn.Linear
    assert sum(isinstance(m, torch.nn.Linear) for m in skeleton.modules()) == n_linear - len(
        records
    )
    for name, mod in swapped.items():
        specs = record_tensor_specs(mod.descriptor)
        for suffix, (shape, dtype) in specs.items():
            buf = getattr(mod, suffix)
            assert buf.device.type == "meta" and tuple(buf.shape) == shape and buf.dtype == dtype
        has_bias = skeleton.config.model_type == "qwen2" and name.rsplit(".", 1)[-1] in (
            "q_proj",
            "k_proj",
            "v_proj",
        )
        assert (mod.bias is not None) == has_bias


@pytest.mark.parametrize("arch", ARCHS)
def test_replace_with_records_and_groups(arch: str) -> None:
    model = tiny_model(arch)
    records = quantize_randomly(model, int4=("self_attn.v_proj",))
    swapped = replace_with_records(model, records)
    for m in swapped.values():
        m.finalize("cpu")
    groups = share_groups(swapped)
    layers = tiny_config(arch).num_hidden_layers
    # q/k share (v is int4: no rotation) and gate/up share, per layer
    assert sorted(len(g) for g in groups) == [2] * (2 * layers)
    for g in groups:
        leaves = sorted(n.rsplit(".", 1)[-1] for n in g)
        assert leaves in (["k_proj", "q_proj"], ["gate_proj", "up_proj"])
        slots = {id(swapped[n]._shared_rotation) for n in g}
        assert len(slots) == 1
    out = model(torch.randint(4, 90, (1, 6))).logits
    assert torch.isfinite(out).all()


def test_errors_name_the_problem() -> None:
    model = tiny_model("llama")
    records = quantize_randomly(model)
    name = next(iter(records))
    bad = {"model.layers.9.self_attn.q_proj": records[name]}
    with pytest.raises(UnsupportedArchitecture, match="different architecture"):
        replace_with_records(model, bad)
    other = next(n for n, r in records.items() if r.d_out != records[name].d_out)
    with pytest.raises(UnsupportedArchitecture, match="in the artifact"):
        replace_with_records(model, {name: records[other]})
    with pytest.raises(UnsupportedArchitecture, match=r"not an nn\.Linear"):
        replace_with_records(model, {"model.norm": records[name]})
    with pytest.raises(InvalidInput, match="modules_to_not_convert"):
        replace_with_records(model, {name: records[name]}, skip=[name.rsplit(".", 2)[0]])
    assert not isinstance(model.get_submodule(name), LeechqLinear)
