"""Fixtures shared by the artifact tests: one tiny written artifact per module, copied per test."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from leechq_tiny import make_artifact


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny llama artifact written once per test module (never modified)."""
    out, _ = make_artifact(tmp_path_factory.mktemp("art"), "llama")
    return out


@pytest.fixture
def art(pristine: Path, tmp_path: Path) -> Path:
    """A test's own copy of :func:`pristine`, free to modify."""
    return Path(shutil.copytree(pristine, tmp_path / "a"))
