"""The kernel tests' activation width: 24 bits per block (``LEECHQ_A16=0``) in every module but
``test_a16.py``, which tests the 16-bit default (``ops.A16``) itself. The 24-bit tests keep the
kernels within 1e-5 of Σ|w·x| of the f64 product with the activation as given; the 16-bit ones
hold them to that bound against the rounded activation (``reference.round_activation``)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _activation_bits(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.module.__name__.rsplit(".", 1)[-1] != "test_a16":
        monkeypatch.setenv("LEECHQ_A16", "0")
