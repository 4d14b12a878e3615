"""The fused (accelerator) execution path of :class:`~leechq.nn.linear.LeechqLinear`.

Implements the module side of docs/kernels.md on top of :mod:`leechq.kernels.select`:
at finalize, a record is repacked into the layout of the kernel the selector picks for it (Tetra →
``tetra48``, ball → ``planes14``, int4 → the int4 matvec), and the resulting plan
(:class:`leechq.kernels.select.LinearPlan`) is the callable ``forward`` uses. Lattice records
compute ``y = σ ⊙ (Ŵ' (Q x)) + T x_tail`` with the activation rotated online by the stored tables; int4 records read the activation as is.

:class:`SharedRotation` is the per-group slot that lets q/k/v (and gate/up) rotate their common
input once. It is keyed by the input tensor's identity *and* version counter while holding a
strong reference, so a recycled buffer or an in-place update can never be served a stale rotation
(the pitfall: sharing keyed by pointer or width returns plausible wrong logits).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from leechq.errors import InvalidInput, KernelUnavailable
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


class LeechqGroup(torch.nn.Module):
    """Projections reading one input, outputs concatenated: ``[..., d_in] → [..., Σ d_out]``.

    The serving model's ``wqkv`` / ``w13`` (docs/kernels.md). Rows of the result are
    the rows of the members, so the group computes the same numbers as its members. Lattice members
    with identical rotation tables share one :class:`SharedRotation` slot, so the fused path rotates
    the common input once per call; the dense path needs no rotation at all.
    """

    def __init__(self, members: list[torch.nn.Module]) -> None:
        super().__init__()
        if not members:
            raise InvalidInput("LeechqGroup needs at least one member")
        d_in = {int(getattr(m, "in_features", -1)) for m in members}
        if len(d_in) != 1:
            raise InvalidInput(f"members of one group must share d_in, got {sorted(d_in)}")
        self.members = torch.nn.ModuleList(members)
        self.in_features = d_in.pop()
        self.out_features = sum(int(m.out_features) for m in members)
        share_member_rotations(members)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., d_in] → [..., Σ d_out] (members in order)."""
        return torch.cat([m(x) for m in self.members], dim=-1)


def share_member_rotations(members: list[torch.nn.Module]) -> int:
    """One shared rotation slot per distinct rotation among lattice members; returns the count."""
    import numpy as np

    from leechq.nn.linear import LeechqLinear

    slots: list[SharedRotation] = []
    for m in members:
        rec = getattr(m, "record", None) if isinstance(m, LeechqLinear) else None
        if not isinstance(rec, QuantizedWeight) or rec.rotation is None:
            continue
        rot = rec.rotation
        slot = next(
            (
                s
                for s in slots
                if s.tables.n == rot.n
                and np.array_equal(s.tables.signs, rot.signs)
                and np.array_equal(s.tables.small, rot.small)
            ),
            None,
        )
        if slot is None:
            slot = SharedRotation(rot)
            slots.append(slot)
        slot.members += 1
        m.share_rotation(slot)
    return len(slots)


def fuse_linears(members: list[torch.nn.Module]) -> torch.nn.Module:
    """One module for projections that read the same input (q|k|v, gate|up, or a single one).

    Args:
        members: finalized :class:`~leechq.nn.linear.LeechqLinear` (or other ``[..., d_in] →
            [..., d_out]`` modules), in output order.

    Returns:
        The single member itself, or a :class:`LeechqGroup`.
    """
    if len(members) == 1:
        return members[0]
    return LeechqGroup(list(members))
