"""Offline corpus: split rule, .deb extraction, token windows and fingerprints, online-data path."""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from pathlib import Path

import pytest
import torch

from leechq.data import corpus, debian
from leechq.errors import ArtifactError, InvalidInput
from leechq.utils.hashing import sha256_file


class WordTokenizer:
    """Deterministic toy tokenizer: whitespace-attached words → stable ids (hash based)."""

    def encode(self, text: str) -> list[int]:
        return [
            int.from_bytes(hashlib.blake2b(w.encode(), digest_size=4).digest(), "little") % 50000
            for w in re.findall(r"\s*\S+", text)
        ]


def make_sources(root: Path, n: int = 60) -> Path:
    src = root / "_sources"
    for i in range(n):
        sub = src / ("library" if i % 2 else "howto")
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"doc{i:03d}.rst.txt").write_text(
            f"\n  Title {i}\n=====\n\nBody text number {i}. " * 3 + "\n"
        )
    return src


def test_split_rule_is_the_documented_one() -> None:
    for rel in ["library/os.rst.txt", "howto/logging.rst.txt", "faq/index.rst.txt", "a/b/c.txt"]:
        h = int.from_bytes(hashlib.sha256(rel.encode("utf-8")).digest()[:8], "big")
        assert corpus.split_of(rel) == ("evaluation" if h % 10 == 0 else "calibration")
    text = corpus.describe_split()
    assert "sha256" in text and "% 10 == 0" in text and "sorted" in text
    # spot values of the real package (3.11.2-6+deb12u8 puts these files in the evaluation split)
    assert corpus.split_of("library/heapq.rst.txt") == "evaluation"
    assert corpus.split_of("library/os.rst.txt") == "calibration"


def test_splits_disjoint_complete_and_joined_in_order(tmp_path: Path) -> None:
    src = make_sources(tmp_path)
    files = corpus.corpus_files(src)
    cal, ev = corpus.split_files("calibration", src), corpus.split_files("evaluation", src)
    assert set(cal).isdisjoint(ev) and sorted(cal + ev) == files and cal and ev
    expected = "\n\n".join((src / r).read_text().strip() for r in sorted(ev))
    assert corpus.evaluation_text(src) == expected
    assert corpus.calibration_text(src).startswith((src / sorted(cal)[0]).read_text().strip())
    with pytest.raises(InvalidInput, match="unknown split"):
        corpus.split_files("train", src)
    info = corpus.corpus_info(src)
    assert info["files"] == {"calibration": len(cal), "evaluation": len(ev)}
    assert re.match(r"^[0-9a-f]{16}$", info["fingerprint"]) and info["version"] is None
    (src / "howto" / "doc000.rst.txt").write_text("changed")
    assert corpus.corpus_info(src)["fingerprint"] != info["fingerprint"]


def _tar_xz(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for name, data in files.items():
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def make_deb(path: Path, files: dict[str, bytes], version: str = "3.11.2-6+test1") -> Path:
    """A minimal .deb (ar archive: debian-binary, control.tar.xz, data.tar.xz)."""
    members = [
        ("debian-binary", b"2.0\n"),
        (
            "control.tar.xz",
            _tar_xz({"./control": f"Package: python3.11-doc\nVersion: {version}\n".encode()}),
        ),
        ("data.tar.xz", _tar_xz(files)),
    ]
    out = bytearray(b"!<arch>\n")
    for name, data in members:
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode()
        out += data + (b"\n" if len(data) % 2 else b"")
    path.write_bytes(bytes(out))
    return path


def test_fetch_pydoc_from_a_deb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEECHQ_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("LEECHQ_CORPUS_DIR", raising=False)
    monkeypatch.setattr(corpus, "PYDOC_SYSTEM_SOURCES", tmp_path / "not-installed")
    prefix = "./usr/share/doc/python3.11/html/_sources/"
    deb = make_deb(
        tmp_path / "python3.11-doc_test_all.deb",
        {
            prefix + "library/os.rst.txt": b"os module docs",
            prefix + "library/heapq.rst.txt": b"heapq docs",
            prefix + "index.rst.txt": b"index",
            "./usr/share/doc/python3.11/html/index.html": b"<html>",
        },
    )
    with pytest.raises(ArtifactError, match="no copy"):
        corpus.pydoc_sources_dir(fetch=False)
    src = corpus.fetch_pydoc(deb)
    assert src == tmp_path / "cache" / "pydoc" / "python3.11-doc" / "_sources"
    assert corpus.corpus_files(src) == [
        "index.rst.txt",
        "library/heapq.rst.txt",
        "library/os.rst.txt",
    ]
    manifest = json.loads((src.parent / "manifest.json").read_text())
    assert manifest["version"] == "3.11.2-6+test1" and manifest[
        "deb_sha256"
    ] == sha256_file(deb)
    assert corpus.pydoc_sources_dir(fetch=False) == src
    assert corpus.corpus_info(src)["version"] == "3.11.2-6+test1"
    contents = {
        "index.rst.txt": "index",
        "library/heapq.rst.txt": "heapq docs",
        "library/os.rst.txt": "os module docs",
    }
    assert corpus.evaluation_text(src) == "\n\n".join(
        v for k, v in sorted(contents.items()) if corpus.split_of(k) == "evaluation"
    )
    assert "heapq docs" in corpus.evaluation_text(src)
    assert deb.exists()  # a user-supplied .deb is left alone
    hostile = make_deb(tmp_path / "bad.deb", {prefix + "../../../../evil.txt": b"x"})
    with pytest.raises(ArtifactError, match="unsafe member path"):
        debian._extract_sources(hostile, tmp_path / "out", corpus.PYDOC.prefix, ".txt")
    empty = make_deb(tmp_path / "empty.deb", {"./usr/share/doc/other.txt": b"x"})
    with pytest.raises(ArtifactError, match=r"no usr/share/doc/python3\.11/html/_sources"):
        debian._extract_sources(empty, tmp_path / "out2", corpus.PYDOC.prefix, ".txt")
    not_deb = tmp_path / "x.deb"
    not_deb.write_bytes(b"hello")
    with pytest.raises(ArtifactError, match="bad magic"):
        debian._extract_sources(not_deb, tmp_path / "out3", corpus.PYDOC.prefix, ".txt")


def test_corpus_dir_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = make_sources(tmp_path, 4)
    src.rename(tmp_path / "pydoc")
    monkeypatch.setenv("LEECHQ_CORPUS_DIR", str(tmp_path))
    assert corpus.pydoc_sources_dir() == tmp_path / "pydoc"
    assert len(corpus.corpus_files()) == 4
    monkeypatch.setenv("LEECHQ_CORPUS_DIR", str(tmp_path / "nope"))
    with pytest.raises(ArtifactError, match=r"LEECHQ_CORPUS_DIR=.*has no pydoc/ directory"):
        corpus.pydoc_sources_dir()


def test_offline_hints_name_the_deb_route_and_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEECHQ_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("LEECHQ_CORPUS_DIR", raising=False)
    monkeypatch.setattr(corpus, "PYDOC_SYSTEM_SOURCES", tmp_path / "not-installed")
    with pytest.raises(ArtifactError) as err:
        corpus.pydoc_sources_dir(fetch=False)
    assert "fetch_pydoc(deb=PATH)" in str(err.value) and "$LEECHQ_CORPUS_DIR" in str(err.value)
    monkeypatch.setattr(corpus.shutil, "which", lambda name: None)
    with pytest.raises(ArtifactError, match=r"apt-get not found: download python3\.11-doc_\*\.deb"):
        corpus.fetch_pydoc()
    assert not (tmp_path / "cache" / "pydoc" / "python3.11-doc").exists()  # nothing half-written


def test_consecutive_windows_are_disjoint_runs_from_token_zero() -> None:
    tok = WordTokenizer()
    text = " ".join(f"w{i % 997}" for i in range(30000))
    full = tok.encode(text)
    sizes = [(3, 16), (2, 8), (1, 32)]
    parts, fingerprint = corpus.consecutive_windows(tok, text, sizes, source="t")
    assert [tuple(p.shape) for p in parts] == sizes
    assert torch.cat([p.flatten() for p in parts]).tolist() == full[:96]
    assert fingerprint == corpus.token_fingerprint(torch.tensor(full[:96]).reshape(1, 96))


def test_consecutive_windows_shrink_one_role_to_the_text() -> None:
    tok = WordTokenizer()
    text = " ".join(f"w{i % 997}" for i in range(200))  # 200 tokens
    full = tok.encode(text)
    sizes = [(2, 16), (50, 32), (1, 16)]  # the middle role wants 1600 tokens
    parts, fingerprint = corpus.consecutive_windows(tok, text, sizes, source="t", shrink=1)
    assert [tuple(p.shape) for p in parts] == [(2, 16), (4, 32), (1, 16)]  # 32 + 4·32 + 16 <= 200
    assert torch.cat([p.flatten() for p in parts]).tolist() == full[:176]
    assert fingerprint == corpus.token_fingerprint(torch.tensor(full[:176]).reshape(1, 176))
    # enough text: the same windows and fingerprint as without shrink
    long_text = " ".join(f"w{i % 997}" for i in range(30000))
    fixed = corpus.consecutive_windows(tok, long_text, sizes, source="t")
    shrunk = corpus.consecutive_windows(tok, long_text, sizes, source="t", shrink=1)
    assert fixed[1] == shrunk[1]
    assert all(torch.equal(a, b) for a, b in zip(fixed[0], shrunk[0], strict=True))
    with pytest.raises(InvalidInput, match="one window of role 1"):
        corpus.consecutive_windows(tok, text, [(2, 16), (50, 32), (11, 16)], shrink=1)
    with pytest.raises(InvalidInput, match="n_windows > 0"):
        corpus.consecutive_windows(tok, text, [(0, 16), (5, 32)], shrink=1)


def test_token_windows_from_token_zero_and_prefix_exact() -> None:
    tok = WordTokenizer()
    text = " ".join(f"w{i % 997}" for i in range(30000))
    full = tok.encode(text)
    win = corpus.token_windows(tok, text, 5, 64, source="t")
    assert win.ids.dtype == torch.int64 and tuple(win.ids.shape) == (5, 64)
    assert win.ids.flatten().tolist() == full[: 5 * 64]  # contiguous, non-overlapping, from 0
    assert (win.n_windows, win.window, win.source) == (5, 64, "t")
    assert win.total_tokens < len(full)  # only a prefix was tokenized
    assert win.fingerprint == corpus.token_fingerprint(torch.tensor(full[:320]).reshape(5, 64))
    assert win.protocol()["tokens_fingerprint"] == win.fingerprint
    with pytest.raises(InvalidInput, match="fewer than n_windows"):
        corpus.token_windows(tok, "a b c", 2, 4)
    with pytest.raises(InvalidInput, match="n_windows > 0"):
        corpus.token_windows(tok, text, 0, 4)


def test_prefix_tokenization_falls_back_when_cut_matters() -> None:
    """A tokenizer whose tokens depend on the whole text length forces the full-text path."""

    class LengthAware:
        def encode(self, text: str) -> list[int]:
            return [len(text) % 7] + [ord(c) for c in text]

    text = "x" * 50000
    win = corpus.token_windows(LengthAware(), text, 2, 8)
    assert win.ids[0, 0].item() == 50000 % 7


def test_fingerprint_properties() -> None:
    a = torch.arange(12).reshape(3, 4)
    fp = corpus.token_fingerprint(a)
    assert fp == corpus.token_fingerprint(a.clone()) == corpus.token_fingerprint(a.numpy())
    assert re.match(r"^[0-9a-f]{16}$", fp)
    b = a.clone()
    b[2, 3] += 1
    assert corpus.token_fingerprint(b) != fp
    assert corpus.token_fingerprint(a.reshape(4, 3)) != fp  # the shape counts


def test_encode_accepts_hf_style_and_plain() -> None:
    class HFStyle:
        def encode(
            self, text: str, add_special_tokens: bool = True, verbose: bool = True
        ) -> list[int]:
            return ([1] if add_special_tokens else []) + [len(w) for w in text.split()]

    assert corpus.encode(HFStyle(), "ab cde") == [2, 3]
    assert corpus.encode(WordTokenizer(), "ab cde") == WordTokenizer().encode("ab cde")


def test_load_text_errors() -> None:
    with pytest.raises(InvalidInput, match="unknown corpus"):
        corpus.load_text("nope", "test")


def test_load_text_without_datasets_says_how(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "datasets":
            raise ImportError("no datasets")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(ImportError, match=r"leechq\[data\]"):
        corpus.load_text("wikitext2", "test")


def test_load_text_local_files_through_datasets(tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    rows = [{"text": " = Title = \n"}, {"text": ""}, {"text": " Body one .\n"}]
    f = tmp_path / "wiki.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert corpus.load_text("wikitext2", "test", data_files=str(f)) == "\n\n".join(
        r["text"] for r in rows
    )
    c4 = tmp_path / "c4.json"
    c4.write_text("".join(json.dumps({"text": "x" * 10, "url": "u"}) + "\n" for _ in range(10)))
    assert (
        corpus.load_text("c4", "evaluation", data_files=str(c4), max_chars=30)
        == ("x" * 10 + "\n\n") * 2 + "x" * 6
    )


@pytest.mark.slow
def test_real_pydoc_corpus() -> None:
    """The real package (installed, cached or fetched with apt-get): split sizes and fingerprint."""
    info = corpus.corpus_info()
    assert info["files"]["evaluation"] > 30 and info["files"]["calibration"] > 300
    if info["version"] in corpus.KNOWN_CORPUS_FINGERPRINTS:
        assert info["known_fingerprint_match"] is True
        assert info["files"] == {"calibration": 441, "evaluation": 56}
    assert len(corpus.evaluation_text()) > 1_000_000
