"""Offline text for calibration and evaluation, token windows and token fingerprints.

Default corpus (works without the hub): the reStructuredText sources of the Python 3.11
documentation as shipped by Debian's ``python3.11-doc`` package, ``html/_sources/**/*.txt`` (497
files, ~11 MB of English prose and code). Where it comes from, in order:

1. ``$LEECHQ_CORPUS_DIR/pydoc``: when ``$LEECHQ_CORPUS_DIR`` is set, its ``pydoc/`` subdirectory,
   laid out like ``html/_sources`` (an error if it is missing; the variable is the one offline
   switch for every corpus, see :func:`leechq.data.debian.corpus_dir_override`);
2. the installed package: ``/usr/share/doc/python3.11/html/_sources``;
3. the cache: ``<cache root>/pydoc/python3.11-doc/_sources`` (see :mod:`leechq.data.cache`);
4. otherwise it is fetched into that cache: ``apt-get download python3.11-doc`` (no root needed;
   or a local ``.deb`` passed as ``fetch_pydoc(deb=PATH)``), and the ``_sources`` members of its
   ``data.tar.*`` are extracted in Python, temp dir + rename (:mod:`leechq.data.debian`, the
   mechanism every Debian-backed corpus shares; :data:`PYDOC` declares this one).

Split (fixed, by file, disjoint): a file with posix path ``rel`` relative to ``_sources`` belongs to
the *evaluation* split iff ``int.from_bytes(sha256(rel.encode()).digest()[:8], "big") % 10 == 0``,
and to the *calibration* split otherwise. Within a split, files are read as UTF-8, stripped of
surrounding whitespace, sorted by ``rel`` and joined with ``"\\n\\n"``. For 3.11.2-6+deb12u8 this
gives 56 evaluation files (1.36 MB) and 441 calibration files (9.69 MB). The rule depends only on
the path, so it survives package updates; the text may change with the package version, which is
why :func:`corpus_info` reports the version and a content fingerprint.

Windows (docs/evaluation.md protocol): the text is tokenized once without special tokens and cut
into ``n_windows`` contiguous, non-overlapping windows of ``window`` tokens from token 0. The token
fingerprint (:func:`token_fingerprint`) proves two arms saw the same tokens.

Online corpora (WikiText-2, C4) go through the optional ``datasets`` package (:func:`load_text`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from leechq.data.debian import MANIFEST, DebianFiles
from leechq.errors import InvalidInput

PYDOC_PACKAGE = "python3.11-doc"
PYDOC_SYSTEM_SOURCES = Path("/usr/share/doc/python3.11/html/_sources")
PYDOC = DebianFiles(
    package=PYDOC_PACKAGE,
    corpus="pydoc",
    sub="_sources",
    prefix="usr/share/doc/python3.11/html/_sources/",
    suffix=".txt",
    fetch_name="leechq.data.corpus.fetch_pydoc",
    layout="html/_sources",
)
"""The Python-docs corpus: the ``*.txt`` under ``html/_sources`` of ``python3.11-doc``."""
EVAL_MODULUS = 10
SPLITS = ("calibration", "evaluation")
# Content fingerprints of known package versions (see corpus_info); informative, not enforced.
KNOWN_CORPUS_FINGERPRINTS = {"3.11.2-6+deb12u8": "930d16cdb6d46cd5"}


def describe_split() -> str:
    """One paragraph stating the calibration/evaluation split rule (for reports and provenance)."""
    return (
        "python3.11-doc html/_sources/**/*.txt; a file with posix path rel (relative to "
        "_sources) is in the evaluation split iff "
        "int.from_bytes(sha256(rel.encode('utf-8')).digest()[:8], 'big') "
        f"% {EVAL_MODULUS} == 0, else in the calibration split; each split = its files read as "
        "UTF-8, stripped, sorted by rel, joined with '\\n\\n'"
    )


def split_of(rel: str) -> str:
    """The split (``"calibration"`` or ``"evaluation"``) of a file path relative to ``_sources``."""
    h = int.from_bytes(hashlib.sha256(rel.encode("utf-8")).digest()[:8], "big")
    return "evaluation" if h % EVAL_MODULUS == 0 else "calibration"


# ---------------------------------------------------------------------------------------------
# Locating / fetching the sources


def pydoc_sources_dir(*, fetch: bool = True) -> Path:
    """The ``_sources`` directory of the Python docs, fetched into the cache if needed
    (:meth:`leechq.data.debian.DebianFiles.locate`, looking at :data:`PYDOC_SYSTEM_SOURCES` too).

    Args:
        fetch: allow downloading and extracting the ``.deb`` when no copy is found.

    Raises:
        ArtifactError: ``$LEECHQ_CORPUS_DIR`` lacks ``pydoc/``, no copy found and ``fetch`` is
            False, or fetching failed.
    """
    return PYDOC.locate(fetch=fetch, system=PYDOC_SYSTEM_SOURCES)


def fetch_pydoc(deb: Path | str | None = None) -> Path:
    """Extract the ``_sources`` tree of ``python3.11-doc`` into the cache; return its path.

    Args:
        deb: a local ``.deb`` to extract (left in place); default ``apt-get download
            python3.11-doc`` (needs apt sources, not root).

    Raises:
        ArtifactError: apt-get is missing or fails, or the ``.deb`` has no ``_sources``.
    """
    return PYDOC.fetch(deb)


# ---------------------------------------------------------------------------------------------
# Splits and text


def corpus_files(root: Path | str | None = None) -> list[str]:
    """All ``*.txt`` paths under ``_sources``, posix and relative, sorted."""
    base = Path(root) if root is not None else pydoc_sources_dir()
    return sorted(p.relative_to(base).as_posix() for p in base.rglob("*.txt") if p.is_file())


def split_files(split: str, root: Path | str | None = None) -> list[str]:
    """The files of one split (sorted relative paths).

    Raises:
        InvalidInput: unknown split name.
    """
    if split not in SPLITS:
        raise InvalidInput(f"unknown split {split!r}; choices: {', '.join(SPLITS)}")
    return [rel for rel in corpus_files(root) if split_of(rel) == split]


def split_text(split: str, root: Path | str | None = None) -> str:
    """The text of one split: its files read as UTF-8, stripped, joined with ``"\\n\\n"``."""
    base = Path(root) if root is not None else pydoc_sources_dir()
    return _split_text_cached(split, str(base))


@cache
def _split_text_cached(split: str, base: str) -> str:
    parts = [
        (Path(base) / rel).read_text(encoding="utf-8").strip() for rel in split_files(split, base)
    ]
    return "\n\n".join(parts)


def calibration_text(root: Path | str | None = None) -> str:
    """Calibration split of the Python-docs corpus (see the module docstring for the rule)."""
    return split_text("calibration", root)


def evaluation_text(root: Path | str | None = None) -> str:
    """Evaluation split of the Python-docs corpus (disjoint from :func:`calibration_text`)."""
    return split_text("evaluation", root)


def corpus_info(root: Path | str | None = None) -> dict[str, Any]:
    """Provenance of the corpus: location, package version, per-split sizes, content fingerprint.

    The fingerprint is the first 16 hex digits of sha256 over, for every file in sorted order, the
    relative path, a NUL, the file bytes and a NUL.
    """
    base = Path(root) if root is not None else pydoc_sources_dir()
    files = corpus_files(base)
    digest = hashlib.sha256()
    sizes = {s: [0, 0] for s in SPLITS}
    for rel in files:
        data = (base / rel).read_bytes()
        digest.update(rel.encode("utf-8") + b"\0" + data + b"\0")
        sizes[split_of(rel)][0] += 1
        sizes[split_of(rel)][1] += len(data)
    version = _pydoc_version(base)
    fp = digest.hexdigest()[:16]
    return {
        "corpus": "pydoc",
        "path": str(base),
        "package": PYDOC_PACKAGE,
        "version": version,
        "fingerprint": fp,
        "known_fingerprint_match": KNOWN_CORPUS_FINGERPRINTS.get(version) == fp
        if version
        else None,
        "files": {s: sizes[s][0] for s in SPLITS},
        "bytes": {s: sizes[s][1] for s in SPLITS},
        "split_rule": describe_split(),
    }


def _pydoc_version(base: Path) -> str | None:
    manifest = base.parent / MANIFEST
    if manifest.is_file():
        try:
            return str(json.loads(manifest.read_text())["version"])
        except (ValueError, KeyError):
            return None
    if base == PYDOC_SYSTEM_SOURCES and shutil.which("dpkg-query"):
        proc = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", PYDOC_PACKAGE], capture_output=True, text=True
        )
        return proc.stdout.strip() or None if proc.returncode == 0 else None
    return None


# ---------------------------------------------------------------------------------------------
# Online corpora through `datasets`


def _require_datasets() -> Any:
    try:
        import datasets
    except ImportError as exc:
        raise ImportError(
            "WikiText-2 / C4 need the optional 'datasets' package (pip install 'leechq[data]'); "
            "the offline default corpus is 'pydoc'"
        ) from exc
    return datasets


C4_EVAL_FILE = "en/c4-validation.00000-of-00008.json.gz"
C4_CALIB_FILE = "en/c4-validation.00001-of-00008.json.gz"
C4_MAX_CHARS = 8_000_000


def load_text(
    name: str,
    split: str,
    *,
    data_files: str | Sequence[str] | None = None,
    max_chars: int | None = None,
) -> str:
    """A named corpus split as one string.

    * ``"pydoc"``: split ``"calibration"`` or ``"evaluation"`` (offline, see the module docstring).
    * ``"pystdlib"``: the same splits of the standard library's code (offline,
      :mod:`leechq.data.code_corpus`).
    * ``"fortunes"``: the same splits of Debian's quotations and verse, the unseen domain of the
      quality reports (offline, :mod:`leechq.data.prose_corpus`).
    * ``"wikitext2"``: ``wikitext-2-raw-v1``, split ``"train"``/``"validation"``/``"test"``; rows
      joined with ``"\\n\\n"`` (docs/evaluation.md).
    * ``"c4"``: ``allenai/c4``; split ``"evaluation"`` reads shard 00000 of the validation set,
      ``"calibration"`` shard 00001 (disjoint, docs/quantizer.md §2); ``text`` fields joined with
      ``"\\n\\n"`` until ``max_chars`` (default 8 000 000) characters.

    Args:
        name: corpus name.
        split: split name (see above).
        data_files: local files (parquet, JSON lines or JSON) to read through ``datasets``
            instead of the hub: a dataset with a ``text`` column, used as the requested split.
        max_chars: truncate the result to this many characters.

    Raises:
        InvalidInput: unknown corpus or split.
        ImportError: ``datasets`` is needed and not installed.
    """
    if name == "pydoc":
        text = split_text(split)
    elif name == "pystdlib":
        from leechq.data.code_corpus import code_text

        text = code_text(split)
    elif name == "fortunes":
        from leechq.data.prose_corpus import fortunes_text

        text = fortunes_text(split)
    elif name in ("wikitext2", "c4"):
        datasets = _require_datasets()
        if data_files is not None:
            files = [data_files] if isinstance(data_files, str) else list(data_files)
            builder = _builder_for(files[0])
            ds = datasets.load_dataset(builder, data_files={"data": files}, split="data")
        elif name == "wikitext2":
            if split not in ("train", "validation", "test"):
                raise InvalidInput(f"wikitext2 split {split!r}; choices: train, validation, test")
            ds = datasets.load_dataset("wikitext", "wikitext-2-raw-v1", split=split)
        else:
            if split not in SPLITS:
                raise InvalidInput(f"c4 split {split!r}; choices: {', '.join(SPLITS)}")
            shard = C4_EVAL_FILE if split == "evaluation" else C4_CALIB_FILE
            ds = datasets.load_dataset(
                "allenai/c4", data_files={"validation": shard}, split="validation"
            )
        limit = max_chars if max_chars is not None else (C4_MAX_CHARS if name == "c4" else None)
        text = _join_rows(ds["text"], limit)
    else:
        raise InvalidInput(
            f"unknown corpus {name!r}; choices: pydoc, pystdlib, fortunes, wikitext2, c4")
    return text[:max_chars] if max_chars is not None else text


def _builder_for(path: str) -> str:
    lower = path.lower()
    if lower.endswith(".parquet"):
        return "parquet"
    if lower.endswith((".json", ".jsonl", ".json.gz", ".jsonl.gz")):
        return "json"
    if lower.endswith((".txt", ".raw")):
        return "text"
    raise InvalidInput(f"{path}: unknown data file type (expected .parquet, .json[l][.gz] or .txt)")


def _join_rows(rows: Sequence[str], max_chars: int | None) -> str:
    parts: list[str] = []
    total = 0
    for row in rows:
        parts.append(row)
        total += len(row) + 2
        if max_chars is not None and total >= max_chars:
            break
    return "\n\n".join(parts)


# ---------------------------------------------------------------------------------------------
# Tokens


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` without special tokens.

    Accepts a transformers tokenizer (``encode(text, add_special_tokens=False)``) or any object with
    ``encode(text) -> list[int]``.
    """
    try:
        ids = tokenizer.encode(text, add_special_tokens=False, verbose=False)
    except TypeError:
        ids = tokenizer.encode(text)
    return [int(i) for i in ids]


def token_fingerprint(ids: Any) -> str:
    """16-hex-digit fingerprint of a token id array (any shape; ids and shape both count).

    sha256 over ``b"leechq-tokens-v1\\0"``, the shape as little-endian u64s and the ids as
    little-endian int64, truncated to 16 hex digits.
    """
    import numpy as np

    arr = np.asarray(ids.cpu() if hasattr(ids, "cpu") else ids, dtype="<i8")
    digest = hashlib.sha256(b"leechq-tokens-v1\0")
    digest.update(np.asarray(arr.shape, dtype="<u8").tobytes())
    digest.update(np.ascontiguousarray(arr).tobytes())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class TokenWindows:
    """Fixed, non-overlapping token windows of one text.

    Attributes:
        ids: int64 [n_windows, window] token ids (CPU tensor).
        fingerprint: :func:`token_fingerprint` of ``ids``.
        source: free-form description of the text (corpus and split).
        total_tokens: tokens in the tokenized prefix of the text (at least ``n_windows·window``).
    """

    ids: Any
    fingerprint: str
    source: str = ""
    total_tokens: int = 0

    @property
    def n_windows(self) -> int:
        """Number of windows."""
        return int(self.ids.shape[0])

    @property
    def window(self) -> int:
        """Tokens per window."""
        return int(self.ids.shape[1])

    def protocol(self) -> dict[str, Any]:
        """JSON-friendly description (for provenance)."""
        return {
            "source": self.source,
            "n_windows": self.n_windows,
            "window": self.window,
            "tokens_fingerprint": self.fingerprint,
            "total_tokens": self.total_tokens,
        }


def token_windows(
    tokenizer: Any, text: str, n_windows: int, window: int, *, source: str = ""
) -> TokenWindows:
    """Cut ``n_windows`` contiguous, non-overlapping windows of ``window`` tokens from token 0.

    Only a prefix of ``text`` long enough for the windows (with a safety margin of 256 tokens) is
    tokenized; this yields the same leading tokens as tokenizing the whole text, because byte-level
    BPE and SentencePiece tokenizers only change the tokens near the cut.

    Args:
        tokenizer: see :func:`encode`.
        text: the corpus text.
        n_windows: number of windows (> 0).
        window: tokens per window (> 1).
        source: description stored in the result.

    Returns:
        :class:`TokenWindows` with ``ids`` int64 [n_windows, window].

    Raises:
        InvalidInput: non-positive sizes, or the text has fewer than ``n_windows·window`` tokens.
    """
    import torch

    if n_windows <= 0 or window <= 1:
        raise InvalidInput(f"need n_windows > 0 and window > 1, got {n_windows} and {window}")
    need = n_windows * window
    ids = _leading_tokens(tokenizer, text, need)
    if len(ids) < need:
        raise InvalidInput(
            f"text has {len(ids)} tokens, fewer than n_windows·window = "
            f"{n_windows}·{window} = {need}"
        )
    tensor = torch.tensor(ids[:need], dtype=torch.int64).reshape(n_windows, window)
    return TokenWindows(tensor, token_fingerprint(tensor), source, len(ids))


def consecutive_windows(
    tokenizer: Any,
    text: str,
    sizes: list[tuple[int, int]],
    *,
    source: str = "",
    shrink: int | None = None,
) -> tuple[list[Any], str]:
    """Disjoint, consecutive runs of windows from token 0 of ``text``, one tensor per role (e.g.
    encoding | sensitivity | training | monitor calibration windows).

    Args:
        tokenizer: see :func:`encode`.
        text: the corpus text.
        sizes: ``(n_windows, window)`` per role, in stream order.
        source: description of the text.
        shrink: index into ``sizes`` of a role that takes at most its ``n_windows``: as many as
            the text holds beyond the other roles' tokens (at least one). None: every role gets
            exactly its count.

    Returns:
        (int64 tensors [n, window] in ``sizes`` order, fingerprint of the whole token stream).

    Raises:
        InvalidInput: the text is too short for the roles (with ``shrink``: for the other roles
            and one window of the shrinking role).
    """
    import torch

    sizes = list(sizes)
    total = sum(n * w for n, w in sizes)
    if shrink is None:
        stream = token_windows(tokenizer, text, 1, total, source=source)
        flat, fingerprint = stream.ids.reshape(-1), stream.fingerprint
    else:
        n, w = sizes[shrink]
        if n <= 0 or w <= 1 or min(m * v for m, v in sizes) <= 0:
            raise InvalidInput(f"every role needs n_windows > 0 and window > 1, got {sizes}")
        ids = _leading_tokens(tokenizer, text, total)
        others = total - n * w
        fit = min(n, max(0, len(ids) - others) // w)
        if fit < 1:
            raise InvalidInput(
                f"text has {len(ids)} tokens, fewer than the {others + w} that the roles "
                f"{sizes} need with one window of role {shrink}"
            )
        sizes[shrink] = (fit, w)
        total = others + fit * w
        flat = torch.tensor(ids[:total], dtype=torch.int64)
        fingerprint = token_fingerprint(flat.reshape(1, total))
    parts, pos = [], 0
    for n, w in sizes:
        parts.append(flat[pos : pos + n * w].reshape(n, w).clone())
        pos += n * w
    return parts, fingerprint


def _leading_tokens(tokenizer: Any, text: str, need: int) -> list[int]:
    """At least ``need`` leading tokens of ``text`` (all of them if it has fewer), equal to the
    leading tokens of the whole text.

    Tokenizing a prefix only changes the tokens near the cut. Two prefixes of different lengths are
    tokenized; if their first ``need`` tokens agree, both cuts are far enough away, otherwise the
    prefix grows (ending with the whole text).
    """
    margin = 256
    chars = min(len(text), (need + margin) * 8)
    while chars < len(text):
        ids = encode(tokenizer, text[:chars])
        if len(ids) >= need + margin:
            longer = encode(tokenizer, text[: min(len(text), chars + chars // 2)])
            if longer[:need] == ids[:need]:
                return ids
        chars = min(len(text), chars * 2)
    return encode(tokenizer, text)


def pydoc_windows(tokenizer: Any, split: str, n_windows: int, window: int) -> TokenWindows:
    """Windows of one split of the offline corpus (:func:`token_windows` of :func:`split_text`)."""
    return token_windows(tokenizer, split_text(split), n_windows, window, source=f"pydoc:{split}")
