"""The user's calibration text: a file, a JSONL file, a folder, a local ``datasets`` dataset, and
clear errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from leechq.data.user_text import load_user_text
from leechq.errors import InvalidInput


def test_text_file(tmp_path: Path) -> None:
    p = tmp_path / "a.txt"
    p.write_text("  hello world \n", encoding="utf-8")
    got = load_user_text(str(p))
    assert got.text == "hello world" and got.documents == 1
    assert got.source.startswith(f"user:{p} (1 documents, 11 characters, sha256 ")


def test_jsonl_text_field(tmp_path: Path) -> None:
    p = tmp_path / "a.jsonl"
    p.write_text('{"text": "one"}\n\n{"text": "two", "id": 3}\n{"text": "  "}\n', encoding="utf-8")
    got = load_user_text(str(p))
    assert got.text == "one\n\ntwo" and got.documents == 2


def test_folder_sorted_recursive_known_suffixes(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / ".hidden").mkdir()
    (tmp_path / "b.md").write_text("B", encoding="utf-8")
    (tmp_path / "a.rst").write_text("A", encoding="utf-8")
    (tmp_path / "sub" / "c.jsonl").write_text(json.dumps({"text": "C"}), encoding="utf-8")
    (tmp_path / "sub" / "d.txt").write_text("D", encoding="utf-8")
    (tmp_path / "skip.bin").write_bytes(b"\xff\xfe")
    (tmp_path / ".hidden" / "e.txt").write_text("E", encoding="utf-8")
    got = load_user_text(str(tmp_path))
    assert got.text == "A\n\nB\n\nC\n\nD" and got.documents == 4


def test_bad_inputs_are_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="no such file or folder"):
        load_user_text(str(tmp_path / "missing.txt"))
    with pytest.raises(InvalidInput, match=r"no \.txt, \.md, \.rst, \.jsonl files"):
        load_user_text(str(tmp_path))
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok \xff")
    with pytest.raises(InvalidInput, match=r"bad\.txt: not UTF-8"):
        load_user_text(str(bad))
    j = tmp_path / "x.jsonl"
    j.write_text('{"text": "ok"}\n{"body": "no"}\n', encoding="utf-8")
    with pytest.raises(
        InvalidInput, match=r'x\.jsonl:2: expected a JSON object with a string "text"'
    ):
        load_user_text(str(j))
    j.write_text('{"text": "ok"}\n{nope\n', encoding="utf-8")
    with pytest.raises(InvalidInput, match=r"x\.jsonl:2: not JSON"):
        load_user_text(str(j))
    empty = tmp_path / "e.txt"
    empty.write_text("   \n", encoding="utf-8")
    with pytest.raises(InvalidInput, match="no text"):
        load_user_text(str(empty))
    with pytest.raises(InvalidInput, match="hf:NAME"):
        load_user_text("hf:")


def test_hf_spec_reads_a_local_dataset_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``hf:NAME[:SPLIT]`` goes through ``datasets.load_dataset``; a local folder of JSON lines
    files stands in for a hub dataset (no network)."""
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    ds = tmp_path / "ds"
    ds.mkdir()
    (ds / "train.jsonl").write_text(
        "\n".join(json.dumps({"text": t, "n": i}) for i, t in enumerate(["x y", "z"])),
        encoding="utf-8",
    )
    (ds / "test.jsonl").write_text(json.dumps({"text": "held out", "n": 0}), encoding="utf-8")
    assert load_user_text(f"hf:{ds}").text == "x y\n\nz"
    assert load_user_text(f"hf:{ds}:test").text == "held out"
    (tmp_path / "nt").mkdir()
    (tmp_path / "nt" / "train.jsonl").write_text(json.dumps({"body": "b"}), encoding="utf-8")
    with pytest.raises(InvalidInput, match="no 'text' column"):
        load_user_text(f"hf:{tmp_path / 'nt'}")
