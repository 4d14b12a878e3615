"""sha256 of files: the one streamed file digest every layer uses."""

from __future__ import annotations

import hashlib
from pathlib import Path

from leechq.errors import ArtifactError

_CHUNK = 1 << 22


def sha256_file(path: Path | str) -> str:
    """sha256 (64 lowercase hex) of a file's bytes, streamed in 4 MiB chunks.

    Raises:
        ArtifactError: the file is missing or unreadable (the message names it).
    """
    h = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            while chunk := fh.read(_CHUNK):
                h.update(chunk)
    except OSError as exc:
        raise ArtifactError(f"{path}: unreadable: {exc}") from exc
    return h.hexdigest()
