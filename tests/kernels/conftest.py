"""The kernel tests' activation width: 24 bits per block (``ops_common.A16`` patched to False) in every
module but ``test_a16.py`` and ``test_tetra64.py``, which test the 16-bit default itself. The
24-bit tests keep the kernels within 1e-5 of Σ|w·x| of the f64 product with the activation as
given; the 16-bit ones hold them to that bound against the rounded activation
(``reference.round_activation``)."""

from __future__ import annotations

import pytest

_SIXTEEN_BIT = {"test_a16", "test_tetra64"}


@pytest.fixture(autouse=True)
def _activation_bits(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.module.__name__.rsplit(".", 1)[-1] in _SIXTEEN_BIT:
        return
    try:
        from leechq.kernels.triton import ops_common
    except ImportError:  # no Triton: nothing to patch
        return
    monkeypatch.setattr(ops_common, "A16", False)
