"""leechq.formats.safetensors_io: TensorFile hands tensors out checked and refuses strays."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from leechq.errors import ArtifactError
from leechq.formats.safetensors_io import TensorFile


@pytest.fixture
def stored(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"a": torch.arange(6, dtype=torch.float32).reshape(2, 3),
               "b": torch.zeros(4, dtype=torch.uint8),
               "bad": torch.tensor([1.0, float("nan")])}, str(path))
    return TensorFile(path)


def test_take_returns_the_tensor_and_checks_dtype_shape_and_finiteness(stored):
    assert torch.equal(stored.take("a", torch.float32, (2, 3), "rec a"),
                       torch.arange(6, dtype=torch.float32).reshape(2, 3))
    with pytest.raises(ArtifactError, match=r"model\.safetensors \(rec b\): tensor 'b' has dtype"):
        stored.take("b", torch.int8, (4,), "rec b")
    with pytest.raises(ArtifactError, match=r"tensor 'b' has shape \[4\], expected \[2, 2\]"):
        stored.take("b", torch.uint8, (2, 2), "rec b")
    with pytest.raises(ArtifactError, match="tensor 'bad' has NaN or inf"):
        stored.take("bad", torch.float32, (2,), "raw")
    with pytest.raises(ArtifactError, match="missing tensor 'c'"):
        stored.take("c", torch.float32, (1,), "raw")


def test_check_all_taken_names_what_no_descriptor_took(stored):
    stored.take("a", torch.float32, (2, 3), "rec a")
    with pytest.raises(ArtifactError, match=r"2 tensor\(s\) not described by config\.json, "
                                            r"e\.g\. \['b', 'bad'\]"):
        stored.check_all_taken("config.json")
    stored.take("b", torch.uint8, (4,), "rec b")
    with pytest.raises(ArtifactError, match=r"1 tensor\(s\).*\['bad'\]"):
        stored.check_all_taken("config.json")
    stored.tensors.pop("bad")  # a failed take does not count as taken: only the header decides
    with pytest.raises(ArtifactError, match="bad"):
        stored.check_all_taken("config.json")


def test_an_unreadable_file_names_itself(tmp_path):
    path = tmp_path / "junk.safetensors"
    path.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(ArtifactError, match=r"junk\.safetensors"):
        TensorFile(path)
