"""QuantConfig: validation, JSON round trip, schema versions, digest."""

from __future__ import annotations

import json

import pytest

from leechq.config import SCHEMA_VERSION, QuantConfig
from leechq.errors import IncompatibleVersion, InvalidInput


def test_defaults_are_the_reference_recipe() -> None:
    cfg = QuantConfig()
    assert (cfg.codebook, cfg.gain_bits, cfg.damping, cfg.rotate) == ("ball", 1, 0.01, True)
    assert cfg.rotation_seed == 0x110FEED and cfg.tail_policy == "keep_exact"
    assert (cfg.calib_windows, cfg.calib_window_len) == (64, 2048)
    assert "ball + 1 gain bit" in cfg.describe() and "0x110feed" in cfg.describe()


def test_round_trip_through_json() -> None:
    cfg = QuantConfig(
        codebook="tetra", gain_bits=2, int4_modules=("self_attn.v_proj",), calibration="c4 shard 1"
    )
    back = QuantConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert back == cfg and back.digest() == cfg.digest()
    assert back.int4_modules == ("self_attn.v_proj",)


def test_digest_tracks_every_field() -> None:
    base = QuantConfig()
    assert base.replace(damping=0.02).digest() != base.digest()
    assert base.replace(rotation_seed=1).digest() != base.digest()
    assert base.replace(calib_batch=8).digest() != base.digest()


@pytest.mark.parametrize(
    "field,value",
    [
        ("gain_bits", 3),
        ("damping", 0.0),
        ("damping", -1.0),
        ("tail_policy", "pad"),
        ("device", "tpu"),
        ("calib_windows", 0),
        ("rotation_seed", -1),
        ("rotate", 1),
        ("embedding_encoding", "int2"),
        ("propagation", "eager"),
    ],
)
def test_invalid_values_name_the_field(field: str, value: object) -> None:
    with pytest.raises(InvalidInput, match=field.split("_")[0]):
        QuantConfig(**{field: value})  # type: ignore[arg-type]


def test_future_schema_and_unknown_keys() -> None:
    data = QuantConfig().to_dict()
    data["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(IncompatibleVersion):
        QuantConfig.from_dict(data)
    data = QuantConfig().to_dict()
    data["retraction"] = True
    with pytest.raises(InvalidInput, match="retraction"):
        QuantConfig.from_dict(data)
    data = QuantConfig().to_dict()
    data["rotation_seed_hex"] = "0x1"
    with pytest.raises(InvalidInput, match="disagree"):
        QuantConfig.from_dict(data)
