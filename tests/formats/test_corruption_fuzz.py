"""Seeded corruption fuzz through every load path (docs/integrity.md).

A tiny leechq artifact and a tiny Tetra directory are corrupted in seeded random ways (truncated at
random offsets, random bytes flipped, tensors dropped / reshaped / retyped / added, JSON fields
mutated to values of other types, path entries added to the manifest, row scales blown up, files
deleted), with and without the manifest (or ``artifact_sha256``) refreshed so that the structural
checks are reached too. Every case must end in a leechq error (:class:`LeechqError`) or load output
bit-identical to the intact artifact's: never another exception, never different output.

A second tiny artifact with a 4-bit group-affine embedding and an 8-bit untied head goes through
the gate and ``leechq.load`` too. Load paths: :func:`read_artifact` through the gate,
``leechq.load``, ``from_pretrained``, ``leechq inspect`` (in-process CLI: exit 2 with one line
on stderr, or the intact report), and :func:`read_tetra_dir`. The slow paths take a smaller share
of the cases.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from leechq_tiny import ids, make_artifact
from packed_tiny import packed_artifact
from safetensors.torch import load_file, save_file

from leechq.errors import LeechqError
from leechq.formats.artifact import MANIFEST_FILE, read_artifact
from leechq.formats.tetra_dir import DIGEST_FILE
from leechq.formats.tetra_read import read_tetra_dir
from leechq.formats.tetra_write import artifact_to_tetra_dir

CASES = {
    "gate": 200, "load": 60, "inspect": 60, "from_pretrained": 30, "tetra": 200,
    "gate-packed": 60, "load-packed": 20,
}
JUNK: list[Any] = [
    "zz", 5, -1, 0, 1e300, -3e38, None, True, [], [1, 2], {}, {"a": 1}, "../../../etc/hostname",
    "x" * 300, 2**70,
]
BAD_NAMES = [
    "../../../etc/hostname", "/etc/hostname", "sub/model.safetensors", "..", ".", "",
    "a\x00b", "x" * 300, "..\\config.json",
]


# --------------------------------------------------------------------------------------------------
# mutations: each edits a directory in place and says whether it re-signed what it changed


def _files(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.is_file())


def _truncate(d: Path, rng: random.Random) -> None:
    f = rng.choice(_files(d))
    data = f.read_bytes()
    f.write_bytes(data[: rng.randrange(0, max(1, len(data)))])


def _flip(d: Path, rng: random.Random) -> None:
    f = rng.choice(_files(d))
    data = bytearray(f.read_bytes())
    if not data:
        return
    for _ in range(rng.choice([1, 1, 2, 8])):
        i = rng.randrange(len(data))
        data[i] ^= rng.randrange(1, 256)
    f.write_bytes(bytes(data))


def _delete(d: Path, rng: random.Random) -> None:
    rng.choice(_files(d)).unlink()


def _edit_tensors(d: Path, rng: random.Random) -> None:
    f = d / "model.safetensors"
    tensors = load_file(str(f))
    name = rng.choice(sorted(tensors))
    t = tensors[name]
    kind = rng.choice(["drop", "reshape", "retype", "add", "scale", "nan"])
    if kind == "drop":
        del tensors[name]
    elif kind == "reshape":
        tensors[name] = t.reshape(-1)[: max(0, t.numel() - rng.randrange(1, 3))].clone() \
            if t.numel() > 1 else torch.zeros(3, dtype=t.dtype)
    elif kind == "retype":
        new = rng.choice([torch.float16, torch.float32, torch.float64, torch.uint8, torch.int32])
        tensors[name] = t.to(new) if new != t.dtype else t.to(torch.int64)
    elif kind == "add":
        tensors[f"{name}.extra"] = torch.zeros(2)
    else:
        scales = [k for k in tensors if k.endswith(("row_scales", "centroids"))]
        key = rng.choice(scales)
        v = tensors[key].clone()
        v[rng.randrange(v.numel())] = rng.choice([1e300, 3e38, -1e300]) if kind == "scale" \
            else float("nan")
        tensors[key] = v
    save_file(tensors, str(f), metadata={"format": "pt"})


def _json_paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _json_paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _json_paths(v, (*prefix, i))
    return out


def _mutate_json(d: Path, rng: random.Random, name: str, section: str | None) -> None:
    f = d / name
    doc = json.loads(f.read_text())
    root = doc[section] if section else doc
    path = rng.choice(_json_paths(root))
    parent = root
    for k in path[:-1]:
        parent = parent[k]
    if rng.random() < 0.15 and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = rng.choice(JUNK)
    f.write_text(json.dumps(doc))


def _add_path_entry(d: Path, rng: random.Random) -> None:
    f = d / MANIFEST_FILE
    doc = json.loads(f.read_text())
    doc["files"][rng.choice(BAD_NAMES)] = {"bytes": 10, "sha256": "0" * 64}
    f.write_text(json.dumps(doc))


def _refresh_manifest(d: Path) -> None:
    f = d / MANIFEST_FILE
    if not f.is_file():
        return
    try:
        doc = json.loads(f.read_text())
        files = doc["files"]
        for name in list(files):
            p = d / name
            if "/" in name or "\\" in name or name in ("", ".", "..") or not p.is_file():
                continue
            files[name] = {"bytes": p.stat().st_size,
                           "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        f.write_text(json.dumps(doc))
    except (ValueError, KeyError, TypeError, AttributeError, OSError):
        return


def _refresh_tetra_sha(d: Path) -> None:
    """Re-sign ``artifact_sha256`` (the digest files, kept, still vouch for every field)."""
    cfg, model = d / "config.json", d / "model.safetensors"
    try:
        doc = json.loads(cfg.read_text())
        doc["quantization_config"]["artifact_sha256"] = hashlib.sha256(
            model.read_bytes()).hexdigest()
        cfg.write_text(json.dumps(doc))
    except (ValueError, KeyError, TypeError, OSError):
        return


def corrupt(d: Path, rng: random.Random, tetra: bool) -> str:
    """Apply one seeded corruption; returns its description."""
    kinds: list[tuple[str, Callable[[], None], bool]] = [
        ("truncate", lambda: _truncate(d, rng), False),
        ("flip", lambda: _flip(d, rng), False),
        ("delete", lambda: _delete(d, rng), False),
        ("tensors", lambda: _edit_tensors(d, rng), False),
        ("tensors+resign", lambda: _edit_tensors(d, rng), True),
        ("qc-json", lambda: _mutate_json(d, rng, "config.json", "quantization_config"), False),
        ("qc-json+resign",
         lambda: _mutate_json(d, rng, "config.json", "quantization_config"), True),
    ]
    if tetra:
        kinds += [("digest-json", lambda: _mutate_json(d, rng, DIGEST_FILE, None), False)]
    else:
        kinds += [
            ("manifest-json", lambda: _mutate_json(d, rng, MANIFEST_FILE, None), False),
            ("manifest-path", lambda: _add_path_entry(d, rng), False),
        ]
    name, fn, resign = rng.choice(kinds)
    fn()
    if resign:
        if tetra:
            _refresh_tetra_sha(d)
        else:
            _refresh_manifest(d)
    return name


# --------------------------------------------------------------------------------------------------
# load paths: each returns the output to compare bit for bit, or raises


def _dense(state: dict[str, torch.Tensor]) -> dict[str, bytes]:
    return {k: v.contiguous().view(torch.uint8).numpy().tobytes() + str(v.dtype).encode()
            for k, v in state.items()}


def _gate(d: Path) -> Any:
    return _dense(read_artifact(d).dense_state_dict())


def _load(d: Path) -> Any:
    from leechq.models.load import load

    model, _ = load(d, device="cpu", dtype="float32", tokenizer=False)
    with torch.no_grad():
        return model(ids()).logits.numpy().tobytes()


def _from_pretrained(d: Path) -> Any:
    from transformers import AutoModelForCausalLM

    import leechq.integrations.transformers  # noqa: F401

    model = AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32)
    with torch.no_grad():
        return model(ids()).logits.numpy().tobytes()


def names_leechq(d: Path) -> bool:
    """Whether ``config.json`` still routes ``from_pretrained`` to leechq: a parseable object
    whose ``quantization_config.quant_method`` is "leechq" and that has a ``model_type``.
    Otherwise transformers refuses the file (or loads another kind of model) before leechq is
    ever called: outside what leechq can check (docs/integrity.md)."""
    try:
        cfg = json.loads((d / "config.json").read_text())
        return (
            isinstance(cfg, dict)
            and isinstance(cfg.get("model_type"), str)
            and isinstance(cfg.get("quantization_config"), dict)
            and cfg["quantization_config"].get("quant_method") == "leechq"
        )
    except (OSError, ValueError):
        return False


def _inspect(d: Path, capsys: pytest.CaptureFixture[str]) -> Any:
    from leechq.cli.main import main

    capsys.readouterr()
    rc = main(["inspect", str(d), "--json"])
    out, err = capsys.readouterr()
    if rc != 0:
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1 and "error" in lines[0], (rc, err)
        raise LeechqError(lines[0])
    return out


def _tetra(d: Path) -> Any:
    return _dense(read_tetra_dir(d).dense_state_dict())


@pytest.fixture(scope="module")
def intact(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("fuzz")
    art, _ = make_artifact(base, "llama")
    tetra = artifact_to_tetra_dir(art, base / "tetra", allow_lossy_raw=True)
    packed, _ = packed_artifact(base, "qwen3", 4, 8)  # group-affine embedding and untied head
    return {"artifact": art, "tetra": Path(tetra), "packed": packed}


def _run_path(path: str, intact: dict[str, Path], tmp_path: Path,
              capsys: pytest.CaptureFixture[str]) -> dict[str, int]:
    tetra = path == "tetra"
    src = intact["tetra" if tetra else "packed" if path.endswith("-packed") else "artifact"]
    d = tmp_path / "case"  # one fixed path, so that outputs naming the directory compare equal
    loader: Callable[[Path], Any] = {
        "gate": _gate, "load": _load, "from_pretrained": _from_pretrained, "tetra": _tetra,
        "inspect": lambda p: _inspect(p, capsys), "gate-packed": _gate, "load-packed": _load,
    }[path]
    shutil.copytree(src, d)
    baseline = loader(d)
    outcomes = {"error": 0, "identical": 0, "not leechq": 0}
    failures: list[str] = []
    seed0 = {"gate": 0, "load": 10_000, "inspect": 20_000, "from_pretrained": 30_000,
             "tetra": 40_000, "gate-packed": 50_000, "load-packed": 60_000}[path]
    for case in range(CASES[path]):
        seed = seed0 + case
        shutil.rmtree(d)
        shutil.copytree(src, d)
        rng = random.Random(seed)
        what = corrupt(d, rng, tetra)
        if path == "from_pretrained" and not names_leechq(d):
            outcomes["not leechq"] += 1
            continue
        try:
            got = loader(d)
        except LeechqError:
            outcomes["error"] += 1
            continue
        except Exception as exc:
            failures.append(f"seed {seed} {what}: raw {type(exc).__name__}: {exc}"[:300])
            continue
        if got == baseline:
            outcomes["identical"] += 1
        else:
            failures.append(f"seed {seed} {what}: loaded different output without an error")
    assert not failures, "\n".join(failures[:20])
    return outcomes


@pytest.mark.parametrize("path", list(CASES))
def test_corruption_fuzz(path: str, intact: dict[str, Path], tmp_path: Path,
                         capsys: pytest.CaptureFixture[str]) -> None:
    outcomes = _run_path(path, intact, tmp_path, capsys)
    assert sum(outcomes.values()) == CASES[path]
    assert outcomes["error"] > CASES[path] // 2  # the fuzz really corrupts
    assert outcomes["not leechq"] <= CASES[path] // 5


def test_fuzz_case_count() -> None:
    assert sum(CASES.values()) >= 500
