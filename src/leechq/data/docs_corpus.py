"""The prose domains of the default calibration mix beyond the Python docs: Debian's own manuals
and the Jargon File.

Three Debian packages, each a corpus of its own (:class:`leechq.data.debian.DebianFiles`: looked
for under ``$LEECHQ_CORPUS_DIR/<corpus>``, then in the cache, else fetched with ``apt-get
download`` or from a local ``.deb``):

* ``debref``: ``debian-reference-en``, the Debian Reference (a system administration guide) as
  plain text, ``usr/share/debian-reference/*.en.txt.gz``;
* ``devref``: ``developers-reference``, the Debian Developer's Reference as reST sources,
  ``usr/share/developers-reference/_sources/*.rst.txt``;
* ``jargon``: ``jargon-text``, the Jargon File (a lexicon of hacker slang with essays and
  anecdotes), ``usr/share/doc/jargon-text/*.txt.gz``; its paragraphs shorter than
  :data:`MIN_PARAGRAPH` characters (the table of contents, headwords alone) are left out.

They are calibration text only: no evaluation split is taken from them, and none of them is the
unseen-domain set of the quality reports (Debian's ``fortunes``, :mod:`.prose_corpus`).
"""

from __future__ import annotations

import gzip
import re
from functools import cache
from pathlib import Path

from leechq.data.debian import DebianFiles
from leechq.errors import ArtifactError

DEBREF = DebianFiles(
    package="debian-reference-en",
    corpus="debref",
    sub="src",
    prefix="usr/share/debian-reference/",
    suffix=".en.txt.gz",
    fetch_name="leechq.data.docs_corpus.fetch_debref",
    layout="usr/share/debian-reference (the *.en.txt.gz files)",
    what="texts",
)
"""The Debian Reference, plain text."""
DEVREF = DebianFiles(
    package="developers-reference",
    corpus="devref",
    sub="src",
    prefix="usr/share/developers-reference/_sources/",
    suffix=".rst.txt",
    fetch_name="leechq.data.docs_corpus.fetch_devref",
    layout="usr/share/developers-reference/_sources",
    what="sources",
)
"""The Debian Developer's Reference, reST sources."""
JARGON = DebianFiles(
    package="jargon-text",
    corpus="jargon",
    sub="src",
    prefix="usr/share/doc/jargon-text/",
    suffix=".txt.gz",
    fetch_name="leechq.data.docs_corpus.fetch_jargon",
    layout="usr/share/doc/jargon-text (jargon.txt.gz)",
    what="texts",
)
"""The Jargon File, plain text."""
CORPORA = {c.corpus: c for c in (DEBREF, DEVREF, JARGON)}
"""The three corpora by name, in the order the calibration mix takes them."""
MIN_PARAGRAPH = 60
"""Paragraphs of the Jargon File shorter than this many characters (stripped) are left out."""


def docs_dir(name: str, *, fetch: bool = True) -> Path:
    """The directory of corpus ``name`` (``"debref"``, ``"devref"`` or ``"jargon"``), fetched
    into the cache if needed.

    Raises:
        ArtifactError: unknown name, ``$LEECHQ_CORPUS_DIR`` lacks ``<name>/``, no copy found and
            ``fetch`` is False, or fetching failed.
    """
    return _corpus(name).locate(fetch=fetch)


def fetch_debref(deb: Path | str | None = None) -> Path:
    """Extract the Debian Reference's text from ``debian-reference-en`` into the cache (``deb``:
    a local ``.deb``, left in place; default ``apt-get download``); return its directory.

    Raises:
        ArtifactError: apt-get is missing or fails, or the ``.deb`` holds no such file.
    """
    return DEBREF.fetch(deb)


def fetch_devref(deb: Path | str | None = None) -> Path:
    """Extract the Developer's Reference's sources from ``developers-reference`` into the cache,
    as :func:`fetch_debref` does."""
    return DEVREF.fetch(deb)


def fetch_jargon(deb: Path | str | None = None) -> Path:
    """Extract the Jargon File from ``jargon-text`` into the cache, as :func:`fetch_debref`
    does."""
    return JARGON.fetch(deb)


def docs_text(name: str, root: Path | str | None = None) -> str:
    """The text of corpus ``name``: its files in path order (``.gz`` ones decompressed, read as
    UTF-8 with replacement), joined with ``"\\n\\n"``; for ``"jargon"`` only paragraphs of at
    least :data:`MIN_PARAGRAPH` characters.

    Raises:
        ArtifactError: unknown name, or the corpus holds no file.
    """
    _corpus(name)
    base = Path(root) if root is not None else docs_dir(name)
    return _text_cached(name, str(base))


@cache
def _text_cached(name: str, base: str) -> str:
    spec = CORPORA[name]
    files = sorted(p for p in Path(base).rglob(f"*{spec.suffix}") if p.is_file())
    if not files:
        raise ArtifactError(f"{base}: no *{spec.suffix} file of the {spec.package} corpus")
    texts = [_read(p) for p in files]
    text = "\n\n".join(texts)
    if name == "jargon":
        paras = re.split(r"\n\s*\n", text)
        text = "\n\n".join(p for p in paras if len(p.strip()) >= MIN_PARAGRAPH)
    return text


def _read(path: Path) -> str:
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    return data.decode("utf-8", errors="replace")


def _corpus(name: str) -> DebianFiles:
    if name not in CORPORA:
        raise ArtifactError(f"unknown documentation corpus {name!r}; choices: "
                            f"{', '.join(CORPORA)}")
    return CORPORA[name]
