"""leechq.quant.recipe_spec: the named recipes' defaults, their steps, descriptions and records."""

from __future__ import annotations

import pytest

from leechq.errors import InvalidInput
from leechq.quant.recipe_spec import Recipe, resolve_recipe
from leechq.quant.row_scales import RowScaleConfig
from leechq.quant.tune import DEFAULT_TUNE_STEPS, TuneConfig, tune_settings


def test_resolve_describe_and_round_trip() -> None:
    bare = resolve_recipe("bare")
    assert bare.steps == ["encode"] and bare.row_scales is None
    full = resolve_recipe("full")
    assert full.steps == ["encode", "int4_by_sensitivity", "tables", "row_scales", "tune"]
    assert (full.target_bpp, full.embedding_bits, full.head_bits) == (2.7, 4, 8)
    assert full.row_scales == RowScaleConfig()
    assert full.tune == tune_settings() and full.tune.steps == DEFAULT_TUNE_STEPS
    assert resolve_recipe("full", tune=None).steps[-1] == "row_scales"
    tuned = resolve_recipe("full", tune=TuneConfig(steps=5, groups=("norms", "tables")))
    assert tuned.steps[-1] == "tune" and "end-to-end tuning of norms, tables" in tuned.describe()
    assert Recipe.from_dict(tuned.to_dict()) == tuned
    assert resolve_recipe("full", 3.1).target_bpp == 3.1
    custom = resolve_recipe("full", 2.5, embedding_bits=8, row_scales=None, requantize=False,
                            tune=None)
    assert custom.steps == ["encode", "int4_by_sensitivity", "tables"]
    text = custom.describe()
    assert "2.5 b/param" in text and "swapped post hoc" in text and "8-bit g64 embedding" in text
    assert "row scales" not in text and "row scales" in full.describe()
    assert "end-to-end tuning" not in text
    assert f"{DEFAULT_TUNE_STEPS} steps, held-out" in full.describe()
    for r in (bare, full, custom):
        assert Recipe.from_dict(r.to_dict()) == r
    with pytest.raises(InvalidInput, match="full recipe only"):
        resolve_recipe("bare", 2.7)
    with pytest.raises(InvalidInput, match="unknown recipe"):
        resolve_recipe("sealed")
    for bad in ({"embedding_bits": 3}, {"int4_selection": True}, {"device": "tpu"},
                {"int4_group": 3}):
        with pytest.raises(InvalidInput):
            Recipe(**bad)
