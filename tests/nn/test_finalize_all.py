"""``finalize_all``: one warning per distinct reason when modules fall back to the dense path."""

from __future__ import annotations

import warnings

import pytest
import torch
from leechq_tiny import int4_record, lattice_record

from leechq.nn.linear import LeechqLinear, ReferencePathWarning
from leechq.nn.replace import finalize_all


def test_cpu_is_dense_without_warnings() -> None:
    mods = {
        f"m{i}": LeechqLinear.from_record(lattice_record("tetra", 8, 48, seed=i)) for i in range(3)
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        counts = finalize_all(mods, "cpu", torch.float32)
    assert counts == {"dense": 3}


class _FallsBack:
    """Stands in for a LeechqLinear on an accelerator without kernels: finalize says why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def finalize(self, device, dtype, *, prefer="auto"):
        from leechq.nn.linear import Execution

        warnings.warn(f"module: {self.reason}", ReferencePathWarning, stacklevel=2)
        return Execution("dense", str(device), dtype, reason=self.reason)


def test_fallback_reasons_are_summarized() -> None:
    mods = {
        "a": _FallsBack("no tetra kernel"),
        "b": _FallsBack("no tetra kernel"),
        "c": _FallsBack("no int4 kernel"),
        "d": LeechqLinear.from_record(int4_record(8, 128)),
    }
    with pytest.warns(ReferencePathWarning) as record:
        counts = finalize_all(mods, "cpu", torch.float32)
    assert counts == {"dense": 4}
    messages = sorted(str(w.message) for w in record)
    assert messages == [
        "1 quantized module(s) run the dense reference path: no int4 kernel",
        "2 quantized module(s) run the dense reference path: no tetra kernel",
    ]
