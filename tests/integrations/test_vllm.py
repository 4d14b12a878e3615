"""The vLLM plugin's tensor-parallel shares (no vLLM needed): the shares of every rank recombine to
the whole record's product; an optional tier runs the vLLM classes when vLLM is installed."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from leechq.errors import InvalidInput, UnsupportedShape
from leechq.integrations.vllm import (
    ShardedLinear,
    _part_index,
    even_split,
    logical_names,
    shard_record,
)
from leechq.nn.linear import LeechqLinear


def _full(record: object, x: torch.Tensor) -> torch.Tensor:
    m = LeechqLinear.from_record(record)  # type: ignore[arg-type]
    m.finalize("cpu", torch.float32)
    return m(x)


def _share_out(share: object, x: torch.Tensor, gather: object = None) -> torch.Tensor:
    m = ShardedLinear([share], gather)  # type: ignore[list-item, arg-type]
    m.finalize("cpu", torch.float32)
    return m(x)


def _lattice(d_out: int, d_in: int, rotate: bool = True):  # type: ignore[no-untyped-def]
    from leechq_tiny import have_codebook, lattice_record

    if not have_codebook("tetra"):
        pytest.skip("tetra codebook unavailable")
    return lattice_record("tetra", d_out, d_in, rotate=rotate, seed=3)


def test_even_split_covers_everything() -> None:
    for n, parts in ((10, 3), (7, 7), (96, 4)):
        runs = [even_split(n, parts, r) for r in range(parts)]
        assert runs[0][0] == 0 and runs[-1][1] == n
        assert all(a[1] == b[0] for a, b in itertools.pairwise(runs))


@pytest.mark.parametrize("world", [1, 2, 3])
def test_column_shares_concatenate_to_the_whole_product(world: int) -> None:
    rec = _lattice(30, 56)  # two blocks and an 8-column tail, rotated
    x = torch.randn(5, 56, generator=torch.Generator().manual_seed(0))
    parts = [_share_out(shard_record(rec, "column", r, world), x) for r in range(world)]
    torch.testing.assert_close(torch.cat(parts, -1), _full(rec, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("world", [2, 3])
def test_rotated_row_shares_sum_to_the_whole_product(world: int) -> None:
    rec = _lattice(16, 80)  # three blocks and an 8-column tail
    x = torch.randn(4, 80, generator=torch.Generator().manual_seed(1), dtype=torch.float32)
    total = torch.zeros(4, 16)
    for r in range(world):
        c0, c1 = even_split(80, world, r)
        share = shard_record(rec, "row", r, world)
        assert share.rotation is rec.rotation and share.columns is not None
        total += _share_out(share, x[:, c0:c1], gather=lambda _xs: x)
    torch.testing.assert_close(total, _full(rec, x), rtol=1e-4, atol=1e-4)


def test_unrotated_row_shares_need_block_boundaries() -> None:
    rec = _lattice(8, 96, rotate=False)
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(2))
    total = sum(_share_out(shard_record(rec, "row", r, 2), x[:, 48 * r : 48 * (r + 1)])
                for r in range(2))
    torch.testing.assert_close(total, _full(rec, x), rtol=1e-4, atol=1e-4)
    with pytest.raises(UnsupportedShape, match="24-column"):
        shard_record(rec, "row", 0, 3)  # 32 columns per rank


def test_int4_shares() -> None:
    from leechq_tiny import int4_record

    rec = int4_record(12, 256)
    x = torch.randn(2, 256, generator=torch.Generator().manual_seed(4))
    cols = torch.cat([_share_out(shard_record(rec, "column", r, 2), x) for r in range(2)], -1)
    torch.testing.assert_close(cols, _full(rec, x), rtol=1e-5, atol=1e-5)
    rows = sum(_share_out(shard_record(rec, "row", r, 2), x[:, 128 * r : 128 * (r + 1)])
               for r in range(2))
    torch.testing.assert_close(rows, _full(rec, x), rtol=1e-4, atol=1e-4)
    with pytest.raises(UnsupportedShape):
        shard_record(rec, "row", 0, 4)  # 64-column shards split a 128-column group


def test_names_and_shard_ids() -> None:
    assert logical_names("model.layers.0.self_attn.qkv_proj") == [
        "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
        "model.layers.0.self_attn.v_proj"]
    assert logical_names("model.layers.1.mlp.down_proj") == ["model.layers.1.mlp.down_proj"]
    names = ["a.q_proj", "a.k_proj", "a.v_proj"]
    assert [_part_index(names, s) for s in ("q", "k", "v")] == [0, 1, 2]
    assert _part_index(["g", "u"], 1) == 1 and _part_index(["o"], None) == 0
    with pytest.raises(InvalidInput):
        _part_index(names, None)
    with pytest.raises(InvalidInput):
        shard_record(_lattice(4, 24), "diagonal", 0, 1)


def test_a_lattice_coded_embedding_is_refused_by_name() -> None:
    from leechq.integrations.vllm import check_servable

    check_servable({"quant_method": "leechq", "config": {"embedding_encoding": "int4"}})
    with pytest.raises(InvalidInput, match=r"lattice-coded.*leechq serve"):
        check_servable({"quant_method": "leechq", "config": {"embedding_encoding": "lattice"}})


def test_a_lattice_coded_head_is_refused_by_name() -> None:
    from leechq.integrations.vllm import check_servable

    check_servable({"quant_method": "leechq", "config": {"lattice_head": False}})
    with pytest.raises(InvalidInput, match=r"output head is lattice-coded.*leechq serve"):
        check_servable({"quant_method": "leechq", "config": {"lattice_head": True}})


@pytest.fixture(scope="module")
def vllm_tp1() -> object:
    """vLLM's own layers on this process: tensor-parallel size 1 over gloo, on the CPU.

    vLLM pins its own torch, so this tier runs only where vLLM is importable (its own
    environment, ``VLLM_TARGET_DEVICE=cpu`` on a CPU machine)."""
    pytest.importorskip("vllm")
    import socket

    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        # vLLM's CPU platform insists on triton-cpu for its own kernels; no layer here uses them.
        current_platform.check_and_update_config = lambda _cfg: None  # type: ignore[method-assign]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{port}")
        initialize_model_parallel(1)
        yield


def test_vllm_layers_serve_an_artifact(vllm_tp1: object, tmp_path: Path) -> None:
    """The registered method in vLLM's QKVParallelLinear and RowParallelLinear: weights loaded
    the way vLLM's model loaders call them, outputs equal to the leechq-loaded model's."""
    from leechq_tiny import make_artifact
    from safetensors import safe_open
    from vllm.model_executor.layers.linear import QKVParallelLinear, RowParallelLinear
    from vllm.model_executor.layers.quantization import get_quantization_config

    from leechq.integrations.vllm import artifact_quant_config, register
    from leechq.models.load import load

    register()
    out, dense = make_artifact(tmp_path, "llama", int4=())
    cfg = get_quantization_config("leechq").from_config(artifact_quant_config(out))
    cfg.maybe_update_config(str(out))
    mapper = cfg.get_checkpoint_weight_mapper()
    key = next(iter(cfg.rotations))
    assert mapper.map_name(f"leechq.rotations.{key}.signs") is None  # not a layer's weight
    name = "model.layers.0.self_attn.q_proj.codes"
    assert mapper.map_name(name) == name
    c = dense.config
    hd = c.hidden_size // c.num_attention_heads
    pre = "model.layers.0.self_attn."
    qkv = QKVParallelLinear(c.hidden_size, hd, c.num_attention_heads, c.num_key_value_heads,
                            bias=False, quant_config=cfg, prefix=pre + "qkv_proj")
    o = RowParallelLinear(c.num_attention_heads * hd, c.hidden_size, bias=False,
                          quant_config=cfg, prefix=pre + "o_proj")
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        for name in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
            if not name.startswith(pre):
                continue
            module, suffix = name[len(pre):].split(".", 1)
            if module in ("q_proj", "k_proj", "v_proj"):
                p = getattr(qkv, suffix)
                p.weight_loader(p, f.get_tensor(name), module[0])
            elif module == "o_proj":
                p = getattr(o, suffix)
                p.weight_loader(p, f.get_tensor(name))
    qkv.quant_method.process_weights_after_loading(qkv)
    o.quant_method.process_weights_after_loading(o)
    model, _ = load(out, device="cpu")
    attn = model.model.layers[0].self_attn
    x = torch.randn(3, c.hidden_size, generator=torch.Generator().manual_seed(0))
    want = torch.cat([attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)], -1)
    torch.testing.assert_close(qkv(x)[0], want, rtol=1e-6, atol=1e-6)
    z = torch.randn(3, c.num_attention_heads * hd, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(o(z)[0], attn.o_proj(z), rtol=1e-6, atol=1e-6)


def test_vllm_registers_the_method() -> None:
    """Optional tier: only where vLLM is installed (its own environment)."""
    pytest.importorskip("vllm")
    from vllm.model_executor.layers.quantization import get_quantization_config

    from leechq.integrations.vllm import register

    register()
    cls = get_quantization_config("leechq")
    cfg = cls.from_config({"quant_method": "leechq", "records": {}, "rotations": {}})
    assert cfg.get_name() == "leechq"
