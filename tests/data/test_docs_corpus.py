"""The documentation prose corpora of the default calibration mix (Debian Reference, Developer's
Reference, Jargon File): fetched from a .deb like the other Debian corpora, read (gzip or not),
the Jargon File's short paragraphs left out, a missing corpus named."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from test_corpus import make_deb

from leechq.data import docs_corpus
from leechq.errors import ArtifactError

LONG = "A paragraph of real prose, long enough to count as one for the Jargon File filter."


@pytest.fixture
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LEECHQ_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("LEECHQ_CORPUS_DIR", raising=False)
    docs_corpus._text_cached.cache_clear()
    return tmp_path


def test_each_corpus_is_fetched_from_its_deb_and_read(private_cache: Path) -> None:
    tmp = private_cache
    p = "./usr/share/"
    debs = {
        "debref": make_deb(tmp / "debian-reference-en_t_all.deb", {
            p + "debian-reference/debian-reference.en.txt.gz": gzip.compress(b"Debian text."),
            p + "debian-reference/ch01.en.html": b"<html>not taken</html>",
        }, version="2.100+t"),
        "devref": make_deb(tmp / "developers-reference_t_all.deb", {
            p + "developers-reference/_sources/b.rst.txt": b"Second source.",
            p + "developers-reference/_sources/a.rst.txt": b"First source.",
            p + "developers-reference/index.html": b"<html>",
        }),
        "jargon": make_deb(tmp / "jargon-text_t_all.deb", {
            p + "doc/jargon-text/jargon.txt.gz": gzip.compress(
                f"Glossary\n\n   foo\n\n   bar\n\n{LONG}\n\n  short one\n\n{LONG} Again."
                .encode()),
        }),
    }
    fetch = {"debref": docs_corpus.fetch_debref, "devref": docs_corpus.fetch_devref,
             "jargon": docs_corpus.fetch_jargon}
    for name, deb in debs.items():
        with pytest.raises(ArtifactError, match=rf"no copy of the .*call fetch_{name}\(\)"):
            docs_corpus.docs_dir(name, fetch=False)
        root = fetch[name](deb)
        assert root == docs_corpus.docs_dir(name, fetch=False)
        manifest = json.loads((root.parent / "manifest.json").read_text())
        assert manifest["package"] == docs_corpus.CORPORA[name].package
    assert docs_corpus.docs_text("debref") == "Debian text."
    assert docs_corpus.docs_text("devref") == "First source.\n\nSecond source."
    assert docs_corpus.docs_text("jargon") == f"{LONG}\n\n{LONG} Again."


def test_corpus_dir_override_and_bad_names(private_cache: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    root = private_cache / "corpora"
    (root / "devref").mkdir(parents=True)
    (root / "devref" / "x.rst.txt").write_text("From the override.")
    monkeypatch.setenv("LEECHQ_CORPUS_DIR", str(root))
    assert docs_corpus.docs_text("devref") == "From the override."
    with pytest.raises(ArtifactError, match=r"has no jargon/ directory"):
        docs_corpus.docs_dir("jargon")
    with pytest.raises(ArtifactError, match=r"unknown documentation corpus 'manpages'"):
        docs_corpus.docs_text("manpages")
    (root / "debref").mkdir()
    with pytest.raises(ArtifactError, match=r"no \*\.en\.txt\.gz file of the debian-reference-en"):
        docs_corpus.docs_text("debref")
