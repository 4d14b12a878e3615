"""The fused (accelerator) execution path of :class:`~leechq.nn.linear.LeechqLinear`.

Implements the module side of docs/kernels.md on top of :mod:`leechq.kernels.select`:
at finalize, a record is repacked into the layout of the kernel the selector picks for it (Tetra →
``tetra48``, ball → ``planes14``, int4 → the int4 matvec), and the resulting plan
(:class:`leechq.kernels.select.LinearPlan`) is the callable ``forward`` uses. Lattice records
compute ``y = σ ⊙ (Ŵ' (Q x)) + T x_tail`` with the activation rotated online by the stored tables; int4 records read the activation as is.

:class:`SharedRotation` is the per-group slot that lets q/k/v (and gate/up) rotate their common
input once. It is keyed by the input tensor's identity *and* version counter while holding a
strong reference, so a recycled buffer or an in-place update can never be served a stale rotation
(the pitfall: sharing keyed by pointer or width returns plausible wrong logits). Projections that
read one input are grouped by :class:`leechq.nn.group.LeechqGroup`, which hands its members these
slots.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from leechq.errors import KernelUnavailable
from leechq.formats.quantized_weight import Int4Weight, QuantizedWeight
from leechq.formats.rotation import RotationTables


class SharedRotation:
    """One activation rotation shared by the ``members`` modules that read the same input.

    ``rotate(x, fn)`` returns ``fn(x)`` (the rotated activation), reusing the last result when
    called again with the same data: a view of the same storage (kept alive by a strong reference,
    so its address cannot be recycled), same offset, shape, strides and dtype, at the same version
    counter (which in-place writes to any view of that storage bump). Equal values in another tensor
    are recomputed; this never keys on a bare address or a width.

    The slot lives for one round: once all ``members`` have taken the rotation of an input it is
    dropped, so the slot holds no activation memory between forward passes and can never serve a
    rotation across passes (a buffer rewritten by a kernel or a graph replay does not bump the
    version counter, so reuse across passes would not be safe).
    """

    def __init__(self, tables: RotationTables, members: int = 0) -> None:
        self.tables = tables
        self.members = members
        self._x: torch.Tensor | None = None
        self._key: tuple[Any, ...] = ()
        self._rotated: torch.Tensor | None = None
        self._uses = 0

    @staticmethod
    def _key_of(x: torch.Tensor) -> tuple[Any, ...]:
        return (x.untyped_storage().data_ptr(), x.storage_offset(), tuple(x.shape), x.stride(),
                x.dtype, x.device, x._version)

    def rotate(self, x: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The rotated ``x`` (computed by ``fn`` unless this exact input was just rotated)."""
        if torch.compiler.is_compiling():
            return fn(x)  # a traced graph has no storage identity to key on
        key = self._key_of(x)
        if self._rotated is not None and key == self._key:
            rotated = self._rotated
            self._uses += 1
        else:
            rotated = fn(x)
            self._x, self._key, self._rotated, self._uses = x, key, rotated, 1
        if self.members and self._uses >= self.members:
            self.clear()
        return rotated

    def clear(self) -> None:
        """Drop the cached input and result (frees their memory)."""
        self._x = self._rotated = None
        self._key = ()
        self._uses = 0


def plan(
    record: QuantizedWeight | Int4Weight,
    device: torch.device,
    dtype: torch.dtype,
    runtime: Any = None,
) -> Any:
    """Repack ``record`` for the Triton kernel that can implement it on ``device``.

    Only Triton kernels qualify: the pure-torch reference kernels decode in f64 on every call,
    which is slower than the dense path's one-time dequantization, so when no Triton kernel can
    implement the record the module keeps the dense path instead.

    Returns:
        A :class:`leechq.kernels.select.LinearPlan`.

    Raises:
        KernelUnavailable: no Triton kernel can; the message lists every candidate's reason.
    """
    try:
        from leechq.kernels.select import plan_linear
    except ModuleNotFoundError as exc:
        if exc.name is not None and not exc.name.startswith("leechq.kernels"):
            raise
        raise KernelUnavailable("leechq.kernels.select is not part of this build") from exc
    return plan_linear(record, device, dtype, preference="triton")
