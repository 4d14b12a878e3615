"""Shared pytest configuration: markers, GPU auto-skip, deterministic seeds."""

from __future__ import annotations

import os

import pytest


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    has_cuda = _cuda_available()
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    skip_interp = pytest.mark.skip(reason="needs TRITON_INTERPRET=1 (set by ./run test)")
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)
        if "interp" in item.keywords and not interp:
            item.add_marker(skip_interp)
