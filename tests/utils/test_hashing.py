"""The shared streamed file digest."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from leechq.errors import ArtifactError
from leechq.utils import hashing
from leechq.utils.hashing import sha256_file


def test_sha256_file_matches_hashlib_across_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hashing, "_CHUNK", 7)
    data = bytes(range(256)) * 3 + b"tail"
    f = tmp_path / "blob"
    f.write_bytes(data)
    assert sha256_file(f) == hashlib.sha256(data).hexdigest()
    assert sha256_file(str(f)) == hashlib.sha256(data).hexdigest()
    (tmp_path / "empty").write_bytes(b"")
    assert sha256_file(tmp_path / "empty") == hashlib.sha256(b"").hexdigest()


def test_sha256_file_missing_is_an_artifact_error(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match=r"nope: unreadable"):
        sha256_file(tmp_path / "nope")
