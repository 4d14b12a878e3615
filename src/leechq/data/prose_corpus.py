"""The unseen-domain text of the quality reports: English quotations, verse and jokes.

Source: Debian's ``fortunes`` package (``usr/share/games/fortunes/<topic>``: plain-text files of
entries separated by lines holding a single ``%``; the ``.dat`` index files and ``.u8`` links are
not taken). Nothing of it is in the offline calibration text (Python documentation and the
standard library's code, :mod:`leechq.data.code_corpus`), so perplexity on it measures how a
quantized model does on a domain its calibration never saw.

Where it comes from, in order: ``$LEECHQ_CORPUS_DIR/fortunes`` when that variable is set (the
topic files directly inside; an error if it is missing,
:func:`leechq.data.debian.corpus_dir_override`), the cache
``<cache root>/fortunes/fortunes/src``, else fetched into that cache as the other Debian corpora
are (``apt-get download``, or a local ``.deb`` passed as ``fetch_fortunes(deb=PATH)``;
:class:`leechq.data.debian.DebianFiles`).

Splits: every entry goes to ``"evaluation"`` or ``"calibration"`` by the hash rule of the other
corpora applied to ``<topic>/<entry number>`` (:func:`leechq.data.corpus.split_of`), so a user who
wants to calibrate on this domain too can, and the evaluation entries stay unseen. The text of a
split is its entries in topic then entry order, joined with blank lines.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from leechq.data.debian import DebianFiles
from leechq.errors import ArtifactError, InvalidInput

PROSE_PACKAGE = "fortunes"
FORTUNES = DebianFiles(
    package=PROSE_PACKAGE,
    corpus="fortunes",
    sub="src",
    prefix="usr/share/games/fortunes/",
    suffix="",
    fetch_name="leechq.data.prose_corpus.fetch_fortunes",
    layout="usr/share/games/fortunes",
    what="texts",
)
"""The unseen-domain corpus: the files under ``usr/share/games/fortunes`` of ``fortunes``."""


def fortunes_dir(*, fetch: bool = True) -> Path:
    """The directory of the topic files, fetched into the cache if needed
    (:meth:`leechq.data.debian.DebianFiles.locate`).

    Raises:
        ArtifactError: ``$LEECHQ_CORPUS_DIR`` lacks ``fortunes/``, no copy is cached and
            ``fetch`` is False, or fetching failed.
    """
    return FORTUNES.locate(fetch=fetch)


def fetch_fortunes(deb: Path | str | None = None) -> Path:
    """Extract the topic files of Debian's ``fortunes`` into the cache; return their directory.

    Args:
        deb: a local ``.deb`` (left in place); default ``apt-get download fortunes``.

    Raises:
        ArtifactError: apt-get is missing or fails, or the ``.deb`` holds no topic file.
    """
    return FORTUNES.fetch(deb)


def topic_files(root: Path | str | None = None) -> list[str]:
    """The topic files (sorted names, no ``.dat`` index files, no links)."""
    base = Path(root) if root is not None else fortunes_dir()
    return sorted(p.name for p in base.iterdir()
                  if p.is_file() and not p.is_symlink() and "." not in p.name)


def entries(text: str) -> list[str]:
    """The entries of one topic file: the text between ``%`` lines, stripped, empty ones
    dropped."""
    out, cur = [], []
    for line in text.splitlines():
        if line.strip() == "%":
            out.append("\n".join(cur).strip())
            cur = []
        else:
            cur.append(line)
    out.append("\n".join(cur).strip())
    return [e for e in out if e]


def fortunes_text(split: str, root: Path | str | None = None) -> str:
    """One split of the corpus as one string (entries joined with ``"\\n\\n"``).

    Raises:
        InvalidInput: unknown split name.
        ArtifactError: the corpus holds no topic file.
    """
    from leechq.data.corpus import SPLITS

    if split not in SPLITS:
        raise InvalidInput(f"unknown split {split!r}; choices: {', '.join(SPLITS)}")
    base = Path(root) if root is not None else fortunes_dir()
    return _text_cached(split, str(base))


@cache
def _text_cached(split: str, base: str) -> str:
    from leechq.data.corpus import split_of

    topics = topic_files(base)
    if not topics:
        raise ArtifactError(f"{base}: no fortune topic files")
    keep = []
    for topic in topics:
        raw = (Path(base) / topic).read_text(encoding="utf-8", errors="replace")
        for i, entry in enumerate(entries(raw)):
            if split_of(f"{topic}/{i}") == split:
                keep.append(entry)
    return "\n\n".join(keep)
