"""Shared by the tests of ``benchmarks/``: each script imported as a module by its file path."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load_script(stem: str) -> ModuleType:
    """A fresh copy of ``benchmarks/<stem>.py``, imported as module ``stem``."""
    spec = importlib.util.spec_from_file_location(stem, BENCHMARKS / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
