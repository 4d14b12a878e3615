"""The user's own calibration text (``leechq quantize --calib-data SPEC``).

A spec is one of:

* a text file (any name; read as UTF-8), or a ``.jsonl`` file whose lines are JSON objects with a
  string ``text`` field;
* a folder: every ``.txt``, ``.md``, ``.rst`` and ``.jsonl`` file under it (recursively, hidden
  files and folders skipped), in sorted relative-path order;
* ``hf:NAME[:SPLIT]``: a dataset read by the optional ``datasets`` package (``load_dataset(NAME,
  split=SPLIT)``, split ``train`` by default; NAME may be a hub id or a local dataset folder), its
  ``text`` column.

Documents (files, JSONL lines, dataset rows) are stripped and joined with ``"\\n\\n"``, the same
rule as the offline corpus (:mod:`leechq.data.corpus`); empty documents are dropped. The result is
cut into token windows by :func:`leechq.data.corpus.token_windows`, which names the shortfall when
the text is too short. Bad input (a missing path, a folder without text files, invalid UTF-8 or
JSON, a JSONL line without ``text``, no text at all) raises :class:`~leechq.errors.InvalidInput`
naming the file and line.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from leechq.errors import InvalidInput

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".jsonl")
"""File suffixes read from a folder."""


@dataclass(frozen=True)
class UserText:
    """Calibration text from a user spec.

    Attributes:
        text: the documents joined with ``"\\n\\n"``.
        source: a short description for logs and provenance (spec, documents, characters and a
            sha256 prefix of the text).
        documents: number of non-empty documents.
    """

    text: str
    source: str
    documents: int


def _read_utf8(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except OSError as exc:
        raise InvalidInput(f"{path}: cannot be read: {exc}") from exc


def _jsonl_documents(path: Path) -> list[str]:
    docs: list[str] = []
    for lineno, line in enumerate(_read_utf8(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"{path}:{lineno}: not JSON ({exc.msg})") from exc
        if not isinstance(row, dict) or not isinstance(row.get("text"), str):
            raise InvalidInput(
                f'{path}:{lineno}: expected a JSON object with a string "text" field'
            )
        docs.append(row["text"])
    return docs


def _file_documents(path: Path) -> list[str]:
    if path.suffix.lower() == ".jsonl":
        return _jsonl_documents(path)
    return [_read_utf8(path)]


def _folder_files(root: Path) -> list[Path]:
    files = [
        p
        for p in root.rglob("*")
        if p.is_file()
        and p.suffix.lower() in TEXT_SUFFIXES
        and not any(part.startswith(".") for part in p.relative_to(root).parts)
    ]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _hf_documents(name: str, split: str) -> list[str]:
    try:
        import datasets
    except ImportError as exc:
        raise ImportError(
            "--calib-data hf:NAME needs the optional 'datasets' package (pip install "
            "'leechq[data]')"
        ) from exc
    try:
        ds = datasets.load_dataset(name, split=split)
    except Exception as exc:  # datasets raises many types (missing, offline, malformed files)
        raise InvalidInput(f"dataset {name!r} split {split!r} cannot be loaded: {exc}") from exc
    if "text" not in ds.column_names:
        raise InvalidInput(
            f"dataset {name!r} split {split!r} has no 'text' column (columns: "
            f"{', '.join(ds.column_names)})"
        )
    return [t for t in ds["text"] if isinstance(t, str)]


def load_user_text(spec: str) -> UserText:
    """Read the calibration text named by ``spec`` (see the module docstring).

    Raises:
        InvalidInput: see the module docstring.
        ImportError: an ``hf:`` spec without the ``datasets`` package.
    """
    if spec.startswith("hf:"):
        name, _, split = spec[3:].partition(":")
        if not name:
            raise InvalidInput(f"--calib-data {spec!r}: expected hf:NAME or hf:NAME:SPLIT")
        docs = _hf_documents(name, split or "train")
    else:
        path = Path(spec).expanduser()
        if path.is_dir():
            files = _folder_files(path)
            if not files:
                raise InvalidInput(f"{path}: no {', '.join(TEXT_SUFFIXES)} files in this folder")
            docs = [d for f in files for d in _file_documents(f)]
        elif path.is_file():
            docs = _file_documents(path)
        else:
            raise InvalidInput(f"--calib-data {spec!r}: no such file or folder")
    docs = [d.strip() for d in docs if d.strip()]
    if not docs:
        raise InvalidInput(f"--calib-data {spec!r}: no text (every document is empty)")
    text = "\n\n".join(docs)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    source = f"user:{spec} ({len(docs)} documents, {len(text)} characters, sha256 {digest})"
    return UserText(text=text, source=source, documents=len(docs))
