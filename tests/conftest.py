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


@pytest.fixture(autouse=True)
def _float32_products_in_float32():
    """Every test starts with float32 matmuls in full float32 (no TF32 on a GPU), whatever an
    earlier test or library set: the per-output tolerances of float32 products assume it."""
    import torch

    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(before)


@pytest.fixture(autouse=True)
def _fresh_kernel_choices():
    """Every test starts and ends with no memoized kernel choice (``kernels.select.clear_memo``):
    tests patch the rules and checks the dispatch table reads."""
    from leechq.kernels import select

    select.clear_memo()
    yield
    select.clear_memo()


@pytest.fixture
def fixture_corpus(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """Small offline corpora under one ``$LEECHQ_CORPUS_DIR`` with a private ``$LEECHQ_CACHE``:
    ``pydoc/`` laid out like the Python-docs ``_sources`` tree (24 files of random words of the
    tiny tokenizer's vocabulary, both splits populated) and ``pycode/`` laid out like
    ``usr/lib/python3.11`` (a few tiny modules, both splits populated), and ``debref/``,
    ``devref/``, ``jargon/`` (one file of random-word paragraphs each). What ``leechq quantize``
    calibrates on (the five-domain mix) and ``leechq eval`` evaluates on, with no download.
    Returns the ``pydoc`` path."""
    import gzip
    import random

    from leechq_tiny import WORDS

    from leechq.data.corpus import split_of

    root = tmp_path_factory.mktemp("corpus")
    sources = root / "pydoc"
    rng = random.Random(0)
    for i in range(24):
        rel = f"library/m{i}.rst.txt"
        (sources / rel).parent.mkdir(parents=True, exist_ok=True)
        (sources / rel).write_text(" ".join(rng.choice(WORDS) for _ in range(400)) + "\n")
    splits = {split_of(f"library/m{i}.rst.txt") for i in range(24)}
    assert splits == {"calibration", "evaluation"}, splits
    code = root / "pycode"
    for i in range(12):
        rel = f"pkg/mod{i}.py"
        (code / rel).parent.mkdir(parents=True, exist_ok=True)
        words = [rng.choice(WORDS) for _ in range(40)]
        (code / rel).write_text(f"def f{i}(x):\n    return {words!r}[x]\n")
    splits = {split_of(f"pkg/mod{i}.py") for i in range(12)}
    assert splits == {"calibration", "evaluation"}, splits
    for name, rel in (("debref", "debian-reference.en.txt.gz"), ("devref", "a.rst.txt"),
                      ("jargon", "jargon.txt.gz")):
        (root / name).mkdir()
        paras = [" ".join(rng.choice(WORDS) for _ in range(30)) for _ in range(20)]
        data = "\n\n".join(paras).encode()
        (root / name / rel).write_bytes(gzip.compress(data) if rel.endswith(".gz") else data)
    monkeypatch.setenv("LEECHQ_CORPUS_DIR", str(root))
    monkeypatch.setenv("LEECHQ_CACHE", str(root / "cache"))
    return sources
