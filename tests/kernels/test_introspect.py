"""``leechq.kernels.triton.introspect``: the kernel signatures it names for offline compiles.

A signature that misses or misnames a runtime parameter makes ``compile_for`` fail, or compile
another kernel than the one launched; the constants are checked against the kernels' own
parameter lists here, without compiling."""

from __future__ import annotations

import inspect

import pytest

pytest.importorskip("triton")


def _runtime_parameters(kernel) -> list[str]:
    return [name for name, p in inspect.signature(kernel.fn).parameters.items()
            if "constexpr" not in str(p.annotation)]


def test_signatures_name_every_runtime_parameter() -> None:
    from leechq.kernels.triton import introspect as I
    from leechq.kernels.triton.activation import rotate_prepared_kernel
    from leechq.kernels.triton.tetra48_m1 import m1_kernel

    for kernel, sig in ((m1_kernel, I.M1_SIGNATURE),
                        (rotate_prepared_kernel, I.ROTATE_PREPARED_SIGNATURE)):
        assert list(sig) == _runtime_parameters(kernel)
        for name, kind in sig.items():
            assert kind in ("i32", "fp32") or kind.startswith("*"), (name, kind)
