"""The standard-library code corpus (fetched from a .deb like the docs) and the default calibration
mix of five domains."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from test_corpus import make_deb, make_sources

from leechq.data import code_corpus, corpus, docs_corpus
from leechq.errors import ArtifactError


def test_pieces_are_lossless_and_end_at_line_ends() -> None:
    text = "".join(f"line {i} " + "x" * (i % 7) + "\n" for i in range(500)) + "tail"
    parts = code_corpus.pieces(text, 100)
    assert "".join(parts) == text
    assert all(p.endswith("\n") for p in parts[:-1]) and len(parts) > 10
    assert all(len(p) >= 100 for p in parts[:-1])


def test_interleave_goes_round_robin_then_appends_the_rest() -> None:
    a = "".join(f"a{i}\n" for i in range(4))
    b = "".join(f"b{i}\n" for i in range(8))
    assert code_corpus.interleave(a, b, size=1) == (
        "a0\nb0\na1\nb1\na2\nb2\na3\nb3\nb4\nb5\nb6\nb7\n")
    assert code_corpus.interleave(a, "c0\n", b, size=1).startswith("a0\nc0\nb0\na1\nb1\n")
    assert code_corpus.interleave(size=1) == ""


def test_fetch_code_from_a_deb_skips_docs_text_and_tests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEECHQ_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("LEECHQ_CORPUS_DIR", raising=False)
    code_corpus._code_text_cached.cache_clear()
    with pytest.raises(ArtifactError, match=r"no copy of the libpython3\.11-stdlib") as err:
        code_corpus.code_sources_dir(fetch=False)
    assert "fetch_code(deb=PATH)" in str(err.value) and "$LEECHQ_CORPUS_DIR" in str(err.value)
    p = "./usr/lib/python3.11/"
    files = {p + f"pkg/mod{i:02d}.py": f"def f{i}():\n    return {i}\n".encode() for i in range(40)}
    files[p + "pydoc_data/topics.py"] = b"topics = {'docs': 'text'}"
    files[p + "test/test_x.py"] = b"import unittest"
    files[p + "README.txt"] = b"not code"
    deb = make_deb(tmp_path / "libpython3.11-stdlib_test.deb", files, version="3.11.2-6+t")
    root = code_corpus.fetch_code(deb)
    assert root == code_corpus.code_sources_dir(fetch=False)
    manifest = json.loads((root.parent / "manifest.json").read_text())
    assert manifest["version"] == "3.11.2-6+t" and manifest["package"] == "libpython3.11-stdlib"
    found = sorted(x.relative_to(root).as_posix() for x in root.rglob("*") if x.is_file())
    assert found == sorted(f"pkg/mod{i:02d}.py" for i in range(40))
    cal = code_corpus.code_files("calibration", root)
    ev = code_corpus.code_files("evaluation", root)
    assert cal and ev and set(cal).isdisjoint(ev) and sorted(cal + ev) == found
    assert all(corpus.split_of(r) == "evaluation" for r in ev)
    text = code_corpus.code_text("calibration", root)
    assert text == "\n\n".join((root / r).read_text().strip() for r in cal)


def test_mixed_calibration_text_holds_every_domain_early(tmp_path: Path) -> None:
    docs = make_sources(tmp_path / "docs", n=80)
    code = tmp_path / "code"
    for i in range(30):
        (code / "pkg").mkdir(parents=True, exist_ok=True)
        (code / "pkg" / f"m{i:02d}.py").write_text(
            "".join(f"x_{i}_{j} = {j}\n" for j in range(300))
        )
    prose = {}
    for name, word in (("debref", "apt"), ("devref", "upload"), ("jargon", "hack")):
        prose[name] = tmp_path / name
        prose[name].mkdir()
        text = "".join(f"The {word} sentence number {j} of a long enough paragraph here.\n\n"
                       for j in range(400))
        suffix = docs_corpus.CORPORA[name].suffix
        data = gzip.compress(text.encode()) if suffix.endswith(".gz") else text.encode()
        (prose[name] / f"doc{suffix}").write_bytes(data)
    code_corpus._code_text_cached.cache_clear()
    docs_corpus._text_cached.cache_clear()
    mixed = code_corpus.mixed_calibration_text(docs, code, prose)
    parts = [corpus.calibration_text(docs), code_corpus.code_text("calibration", code)]
    parts += [docs_corpus.docs_text(name, prose[name]) for name in docs_corpus.CORPORA]
    assert sorted(mixed) == sorted("".join(parts))  # nothing lost, nothing added
    head = mixed[: 6 * code_corpus.PIECE_CHARS]
    for marker in ("Body text number", "x_", "The apt", "The upload", "The hack"):
        assert marker in head, marker
    assert mixed.startswith(parts[0][:100])


def test_corpus_dir_serves_the_code_and_names_a_missing_subdirectory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pycode" / "pkg").mkdir(parents=True)
    (tmp_path / "pycode" / "pkg" / "m.py").write_text("x = 1\n")
    monkeypatch.setenv("LEECHQ_CORPUS_DIR", str(tmp_path))
    assert code_corpus.code_sources_dir() == tmp_path / "pycode"
    (tmp_path / "pycode" / "pkg" / "m.py").unlink()
    (tmp_path / "pycode" / "pkg").rmdir()
    (tmp_path / "pycode").rmdir()
    with pytest.raises(ArtifactError, match=r"has no pycode/ directory") as err:
        code_corpus.code_sources_dir()
    assert str(tmp_path / "pycode") in str(err.value)
