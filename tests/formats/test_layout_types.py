"""Layouts are types: every registered layout packs into its own record type, whose ``layout``
names it, and the registry dispatches on that type; a ``tetra48`` record never passes for a
``tetra64`` one (or back); an artifact written as before loads into the ``tetra64`` type."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
import torch

from leechq.config import QuantConfig
from leechq.errors import InvalidInput
from leechq.formats import layouts
from leechq.formats.artifact import read_artifact, write_artifact
from leechq.formats.layouts import tetra48, tetra64
from leechq.formats.quantized_weight import QuantizedWeight
from leechq.formats.rotation import generate_rotation
from leechq.lattice.classes import ball_size


def _record(codebook: str, d_out: int, d_in: int, seed: int) -> QuantizedWeight:
    g = torch.Generator().manual_seed(seed)
    nb = d_in // 24
    high = 2**47 if codebook == "tetra" else ball_size(12) + 1
    return QuantizedWeight(
        codebook=codebook, d_out=d_out, d_in=d_in,
        labels=torch.randint(0, high, (d_out, nb), generator=g, dtype=torch.int64),
        gains=torch.randint(0, 2, (d_out, nb), generator=g).to(torch.uint8),
        row_scales=torch.rand(d_out, generator=g, dtype=torch.float64) + 0.1,
        centroids=torch.tensor([0.8, 1.2], dtype=torch.float64),
        tail=torch.randn(d_out, d_in % 24, generator=g),
        rotation=generate_rotation(d_in, 3),
    )


def _same(a: QuantizedWeight, b: QuantizedWeight) -> bool:
    return all(torch.equal(getattr(a, n), getattr(b, n))
               for n in ("labels", "gains", "row_scales", "centroids", "tail"))


@pytest.mark.parametrize("name", ["tetra48", "tetra64", "planes14"])
def test_each_layout_packs_into_its_own_type(name: str) -> None:
    """pack → the layout's record type (``layout`` = its name; ``layouts.of`` finds the entry),
    unpack → the canonical record bit for bit, concat_rows keeps the type; the other layouts'
    functions refuse the record."""
    lay = layouts.get(name)
    a, b = _record(lay.codebook, 3, 24 * 5 + 2, 1), _record(lay.codebook, 2, 24 * 5 + 2, 2)
    ra, rb = lay.pack(a), lay.pack(b)
    assert type(ra) is lay.record and ra.layout == name and layouts.of(ra) is lay
    assert tuple(getattr(ra, lay.data).shape) == (3, ra.stride)
    assert _same(lay.unpack(ra), a)
    cat = lay.concat_rows([ra, rb])
    assert type(cat) is lay.record and cat.d_out == 5
    for other in layouts.names():
        if other != name:
            with pytest.raises(InvalidInput):
                layouts.get(other).unpack(ra)


def test_registry_codebooks_and_unknown_records() -> None:
    assert layouts.for_codebook("tetra").name == "tetra48"  # tetra64 is derived from it
    assert layouts.get("tetra64").derived_from == "tetra48"
    assert layouts.for_codebook("ball").name == "planes14"
    assert layouts.for_codebook("int4") is None
    with pytest.raises(InvalidInput, match="registered layout"):
        layouts.of(_record("tetra", 2, 48, 0))  # a canonical record is no packed one
    base = tetra48.random_tetra48(2, 48)
    with pytest.raises(InvalidInput, match="registered layout"):  # the shared base: no layout
        layouts.of(tetra48.TetraRecord(**{f.name: getattr(base, f.name) for f in fields(base)}))


def test_tetra64_and_tetra48_are_distinct_types() -> None:
    w = tetra48.random_tetra48(4, 24 * 3, seed=5)
    t = tetra64.to_tetra64(w)
    assert not isinstance(t, tetra48.Tetra48Weight) and isinstance(t, tetra48.TetraRecord)
    assert t.stride == tetra64.t64_stride(3) != w.stride
    moved = t.to("cpu")
    assert type(moved) is tetra64.Tetra64Weight
    with pytest.raises(InvalidInput, match="not in the tetra64 layout"):
        tetra64.from_tetra64(w)


def test_artifact_written_as_before_loads_into_the_tetra64_type(tmp_path: Path) -> None:
    """The artifact stores canonical records, which the change leaves as they were: one written
    with ``write_artifact`` loads, packs into a ``Tetra64Weight`` and unpacks to the stored
    record bit for bit."""
    rec = _record("tetra", 6, 24 * 4 + 5, 7)
    path = write_artifact(
        tmp_path / "art", base_config={"model_type": "llama", "hidden_size": rec.d_in},
        quant_config=QuantConfig(codebook="tetra", calibration="unit test"),
        records={"model.layers.0.mlp.up_proj": rec}, raw={})
    got = read_artifact(path).records["model.layers.0.mlp.up_proj"]
    assert isinstance(got, QuantizedWeight) and _same(got, rec)
    packed = layouts.get("tetra64").pack(got)
    assert type(packed) is tetra64.Tetra64Weight
    assert packed.rotation is not None and np.array_equal(packed.rotation.signs,
                                                          rec.rotation.signs)
    assert _same(tetra64.unpack(packed), rec)
    assert torch.equal(tetra64.from_tetra64(packed).words, tetra48.pack(rec).words)
