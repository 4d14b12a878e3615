"""The repository stands alone: nothing in ``src/`` or ``tests/`` cites a file outside it.

Design notes that live outside the repository (and paths that lead out of it) may not be named in
source or test files; what the code relies on is written under ``docs/``. Every ``docs/...`` path
cited from ``src/`` or ``tests/`` must exist. The forbidden names are assembled from pieces below so
that this file does not match its own patterns.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("src", "tests")
SUFFIXES = {".py", ".md", ".txt", ".toml", ".json", ".cfg", ".ini", ".sh", ".yaml", ".yml"}

_NOTES = ("leech" + "-core", "layouts" + "-kernels-recipe", "tetra" + "-format", "anchors")
# A note is cited by its file name (``x.md``) or, for the long names, by the bare name with a
# section sign; the architecture note counts only where it is not the repository's own docs file.
_OUTSIDE = re.compile(
    "|".join(
        [*(re.escape(n) + r"(?:\.md\b|\s*§)" for n in _NOTES), "layouts" + r"-kernels\b"]
        + [r"(?<!docs/)\barchitecture" + r"\.md\b"]
        + [r"shared/" + "spec", r"\.\./" + "shared"]
    )
)
_DOCS_PATH = re.compile(r"\bdocs/[\w./-]+\.md\b")


def _files() -> list[Path]:
    out = []
    for top in SCANNED:
        for p in sorted((ROOT / top).rglob("*")):
            if p.is_file() and p.suffix in SUFFIXES and "__pycache__" not in p.parts:
                out.append(p)
    return out


FILES = _files()


def _hits(pattern: re.Pattern[str]) -> list[tuple[Path, int, str]]:
    hits = []
    for p in FILES:
        for i, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            for m in pattern.finditer(line):
                hits.append((p, i, m.group(0)))
    return hits


def test_scans_something() -> None:
    assert len(FILES) > 50
    assert Path(__file__).resolve() in FILES


def test_patterns_catch_outside_citations() -> None:
    bad = [
        "see " + _NOTES[0] + ".md §3.9",
        "(" + _NOTES[1] + " §2.3)",
        _NOTES[2] + ".md §1.3 vectors",
        "the " + "architecture" + ".md tree",
        "/work/" + "shared/" + "spec/x",
        "../" + "shared/notes",
        "layouts" + "-kernels §2.10",
    ]
    good = ["docs/architecture.md §1", "docs/codebooks.md §3.5", "the GGUF architecture string"]
    assert all(_OUTSIDE.search(s) for s in bad)
    assert not any(_OUTSIDE.search(s) for s in good)


def test_no_citation_of_files_outside_the_repository() -> None:
    hits = [f"{p.relative_to(ROOT)}:{i}: {s}" for p, i, s in _hits(_OUTSIDE)]
    assert not hits, "files outside the repository are cited:\n" + "\n".join(hits)


@pytest.mark.parametrize("top", SCANNED)
def test_cited_docs_exist(top: str) -> None:
    missing = sorted(
        {
            f"{p.relative_to(ROOT)}:{i}: {s}"
            for p, i, s in _hits(_DOCS_PATH)
            if p.is_relative_to(ROOT / top) and not (ROOT / s).is_file()
        }
    )
    assert not missing, "cited docs/ files that do not exist:\n" + "\n".join(missing)
