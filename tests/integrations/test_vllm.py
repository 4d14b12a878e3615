"""The vLLM plugin's tensor-parallel shares (no vLLM needed): the shares of every rank recombine to
the whole record's product; an optional tier runs the vLLM classes when vLLM is installed."""

from __future__ import annotations

import itertools

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


def test_vllm_registers_the_method(tmp_path: object) -> None:
    """Optional tier: only where vLLM is installed (its own environment)."""
    pytest.importorskip("vllm")
    from vllm.model_executor.layers.quantization import get_quantization_config

    from leechq.integrations.vllm import register

    register()
    cls = get_quantization_config("leechq")
    cfg = cls.from_config({"quant_method": "leechq", "records": {}, "rotations": {}})
    assert cfg.get_name() == "leechq"
