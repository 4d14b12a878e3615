"""The unseen-domain corpus (Debian's fortunes): fetched from a .deb, split by entry, offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_corpus import make_deb

from leechq.data import corpus, prose_corpus
from leechq.errors import ArtifactError, InvalidInput


def test_entries_split_on_percent_lines() -> None:
    text = "first line\nsecond\n%\n\n%\n  third entry  \n%\nlast"
    assert prose_corpus.entries(text) == ["first line\nsecond", "third entry", "last"]


def test_fetch_fortunes_from_a_deb_and_split_by_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEECHQ_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("LEECHQ_CORPUS_DIR", raising=False)
    prose_corpus._text_cached.cache_clear()
    with pytest.raises(ArtifactError, match=r"no copy of the fortunes texts") as err:
        prose_corpus.fortunes_dir(fetch=False)
    assert "fetch_fortunes(deb=PATH)" in str(err.value)
    p = "./usr/share/games/fortunes/"
    topics = {t: [f"{t} saying number {i}\n  -- someone {i}" for i in range(30)]
              for t in ("art", "love", "science")}
    files = {p + t: ("\n%\n".join(e) + "\n%\n").encode() for t, e in topics.items()}
    files[p + "art.dat"] = b"\x00\x00\x00\x02binary index"
    deb = make_deb(tmp_path / "fortunes_test_all.deb", files, version="1:1.99-t")
    root = prose_corpus.fetch_fortunes(deb)
    assert root == prose_corpus.fortunes_dir(fetch=False)
    manifest = json.loads((root.parent / "manifest.json").read_text())
    assert manifest["package"] == "fortunes" and manifest["version"] == "1:1.99-t"
    assert prose_corpus.topic_files(root) == ["art", "love", "science"]
    ev = prose_corpus.fortunes_text("evaluation", root).split("\n\n")
    cal = prose_corpus.fortunes_text("calibration", root).split("\n\n")
    everything = [e for t in sorted(topics) for e in topics[t]]
    assert ev and cal and set(ev).isdisjoint(cal) and sorted(ev + cal) == sorted(everything)
    for t in sorted(topics):
        for i, e in enumerate(topics[t]):
            assert (e in ev) == (corpus.split_of(f"{t}/{i}") == "evaluation")
    monkeypatch.setenv("LEECHQ_CORPUS_DIR", str(tmp_path / "mine"))
    (tmp_path / "mine" / "fortunes").mkdir(parents=True)
    (tmp_path / "mine" / "fortunes" / "only").write_text("a\n%\nb\n")
    assert prose_corpus.fortunes_dir() == tmp_path / "mine" / "fortunes"
    prose_corpus._text_cached.cache_clear()
    texts = [corpus.load_text("fortunes", s) for s in ("calibration", "evaluation")]
    assert sorted(e for t in texts if t for e in t.split("\n\n")) == ["a", "b"]
    with pytest.raises(InvalidInput, match="unknown split"):
        prose_corpus.fortunes_text("test")


def test_empty_corpus_is_named(tmp_path: Path) -> None:
    (tmp_path / "x.dat").write_bytes(b"\x00")
    prose_corpus._text_cached.cache_clear()
    with pytest.raises(ArtifactError, match="no fortune topic files"):
        prose_corpus.fortunes_text("evaluation", tmp_path)
