"""The code domain of the offline calibration text, and the default mix of five domains.

Code corpus: the Python sources of the standard library as shipped by Debian's
``libpython3.11-stdlib`` package, ``usr/lib/python3.11/**/*.py`` without ``pydoc_data/`` (the
documentation's own text, which would leak the Python-docs evaluation split) and ``test/``. Where it
comes from, in order: ``$LEECHQ_CORPUS_DIR/pycode`` when ``$LEECHQ_CORPUS_DIR`` is set (laid out
like ``usr/lib/python3.11``; an error if it is missing,
:func:`leechq.data.debian.corpus_dir_override`), the cache
``<cache root>/pycode/libpython3.11-stdlib/src``, else fetched into that cache the same way as the
Python-docs corpus (``apt-get download``, or a local ``.deb`` passed as ``fetch_code(deb=PATH)``;
members extracted in Python, temp dir + rename; :mod:`leechq.data.debian`). Its files are split into
calibration and evaluation by the same path-hash rule (:func:`leechq.data.corpus.split_of`).

Default calibration text (:func:`mixed_calibration_text`): five domains interleaved in pieces of
about :data:`PIECE_CHARS` characters (each piece ends at a line end), in this order — the
calibration split of the Python docs (English prose with code examples), the calibration split of
the standard-library code, the Debian Reference, the Debian Developer's Reference and the Jargon
File (:mod:`leechq.data.docs_corpus`) — so that every prefix of the text (the token windows are
cut from token 0) holds all five in about equal parts; a domain that runs out leaves the others
to go on. A broader calibration than the Python docs alone costs in that domain and gains on text
of none of them (smollm2-135m, ball codebook, full recipe: docs held out ×1.30 → ×1.49 the
reference's perplexity, the unseen ``fortunes`` ×2.46 → ×1.92; docs/decisions.md).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from leechq.data.debian import DebianFiles
from leechq.errors import InvalidInput

CODE_PACKAGE = "libpython3.11-stdlib"
CODE = DebianFiles(
    package=CODE_PACKAGE,
    corpus="pycode",
    sub="src",
    prefix="usr/lib/python3.11/",
    suffix=".py",
    skip=("pydoc_data/", "test/"),
    fetch_name="leechq.data.code_corpus.fetch_code",
    layout="usr/lib/python3.11",
)
"""The code corpus: ``usr/lib/python3.11/**/*.py`` of ``libpython3.11-stdlib`` without
``pydoc_data/`` and ``test/``."""
PIECE_CHARS = 4096
"""Approximate characters per interleaved piece of :func:`mixed_calibration_text`."""
MIXED_SOURCE = "pydoc+pystdlib+debref+devref+jargon:calibration"
"""The description of the default calibration text in provenance."""


def code_sources_dir(*, fetch: bool = True) -> Path:
    """The directory of the standard-library sources, fetched into the cache if needed
    (:meth:`leechq.data.debian.DebianFiles.locate`).

    Raises:
        ArtifactError: ``$LEECHQ_CORPUS_DIR`` lacks ``pycode/``, no copy found and ``fetch`` is
            False, or fetching failed.
    """
    return CODE.locate(fetch=fetch)


def fetch_code(deb: Path | str | None = None) -> Path:
    """Extract the ``*.py`` sources of ``libpython3.11-stdlib`` into the cache; return the path.

    Args:
        deb: a local ``.deb`` (left in place); default ``apt-get download``.

    Raises:
        ArtifactError: apt-get is missing or fails, or the ``.deb`` holds no sources.
    """
    return CODE.fetch(deb)


def code_files(split: str, root: Path | str | None = None) -> list[str]:
    """The ``*.py`` files of one split (sorted posix paths relative to the sources).

    Raises:
        InvalidInput: unknown split name.
    """
    from leechq.data.corpus import SPLITS, split_of

    if split not in SPLITS:
        raise InvalidInput(f"unknown split {split!r}; choices: {', '.join(SPLITS)}")
    base = Path(root) if root is not None else code_sources_dir()
    rels = sorted(p.relative_to(base).as_posix() for p in base.rglob("*.py") if p.is_file())
    return [r for r in rels if not r.startswith(CODE.skip) and split_of(r) == split]


def code_text(split: str, root: Path | str | None = None) -> str:
    """One split of the code corpus: its files read as UTF-8, stripped, joined with ``"\\n\\n"``."""
    base = Path(root) if root is not None else code_sources_dir()
    return _code_text_cached(split, str(base))


@cache
def _code_text_cached(split: str, base: str) -> str:
    parts = [(Path(base) / r).read_text(encoding="utf-8").strip() for r in code_files(split, base)]
    return "\n\n".join(p for p in parts if p)


def pieces(text: str, size: int = PIECE_CHARS) -> list[str]:
    """``text`` cut after the first line end at or beyond every ``size`` characters (lossless:
    the pieces concatenate to ``text``)."""
    out, pos = [], 0
    while pos < len(text):
        cut = text.find("\n", pos + size)
        end = len(text) if cut < 0 else cut + 1
        out.append(text[pos:end])
        pos = end
    return out


def interleave(*texts: str, size: int = PIECE_CHARS) -> str:
    """Round robin over the :func:`pieces` of ``texts`` (one piece of each in turn, in the order
    given); a text that runs out drops out and the others go on."""
    parts = [pieces(t, size) for t in texts]
    out: list[str] = []
    for i in range(max((len(p) for p in parts), default=0)):
        out.extend(p[i] for p in parts if i < len(p))
    return "".join(out)


def mixed_calibration_text(
    docs_root: Path | str | None = None,
    code_root: Path | str | None = None,
    prose_roots: dict[str, Path | str] | None = None,
) -> str:
    """The default calibration text: the five domains interleaved (see the module docstring).
    ``docs_root``, ``code_root`` and ``prose_roots`` (by corpus name: ``debref``, ``devref``,
    ``jargon``) override where each corpus is read from."""
    from leechq.data.corpus import calibration_text
    from leechq.data.docs_corpus import CORPORA, docs_text

    roots = prose_roots or {}
    prose = [docs_text(name, roots.get(name)) for name in CORPORA]
    return interleave(calibration_text(docs_root), code_text("calibration", code_root), *prose)
