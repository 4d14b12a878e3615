"""The output head coded on the lattice (``QuantConfig.lattice_head``).

The head is coded like a projection — incoherence rotation, shape–gain codes, GPTQ error feedback
with the Hessian of its inputs — as one more block of the layer-wise pass, after the last decoder
layer: :class:`HeadBlock` applies the final norm to the states the last block left (through the
quantized blocks, as every block's inputs are) and feeds them to the head. Its record is stored
under the head module's name beside the projections', so ``leechq.load`` serves it as a
:class:`~leechq.nn.linear.LeechqLinear`, and the recipe's later steps (int4 by sensitivity, row
scales, tuning) treat it as one more matrix.

This module owns that block and the checks a model must pass first; the pass itself is
:func:`leechq.models.quantize.quantize_model_in_place`'s.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import torch

from leechq.errors import InvalidInput
from leechq.models.arch import ArchSpec
from leechq.quant.layerwise import LinearSpec


class _SkipHead(Exception):
    """Raised by the head's last input hook: the Hessian hooks have run, the logits are not
    needed."""


def check_lattice_head(model: Any, arch: ArchSpec) -> None:
    """Refuse, before any work, a head ``model`` cannot have coded on the lattice: one that is
    not an ``nn.Linear``, or one tied to the token embedding (one table serves both: the lookup
    would be coded too, where the lattice costs several times the KL of a 4-bit table).

    Raises:
        InvalidInput: naming the head and the reason.
    """
    head = arch.head(model)
    if not isinstance(head, torch.nn.Linear):
        raise InvalidInput(f"a lattice-coded head needs an nn.Linear at {arch.head_path}, got "
                           f"{type(head).__name__}")
    if arch.tied_embeddings(model):
        raise InvalidInput(
            f"a lattice-coded head must be untied; {arch.head_path} shares the token embedding's "
            f"table ({arch.embed_path}): keep the head, or store the tables at 4 or 8 bits")


def _placement(module: torch.nn.Module) -> tuple[torch.device, torch.dtype] | None:
    for t in [*module.parameters(), *module.buffers()]:
        if t.is_floating_point():
            return t.device, t.dtype
    return None


class HeadBlock:
    """The head as the last block of :func:`leechq.quant.layerwise.quantize_blocks`.

    ``forward`` takes the last decoder layer's output [batch, seq, d], applies the final norm and
    calls the head on it, which feeds the head's input hooks (the Hessian); the logits are never
    computed (a hook added last stops the call) and the states come back unchanged.

    Attributes:
        index: the block's position (the number of decoder layers).
        linears: the head's one :class:`LinearSpec` (activation 0).
    """

    def __init__(self, index: int, norm: torch.nn.Module, head: torch.nn.Module, name: str,
                 int4: bool = False) -> None:
        self.index = index
        self.norm = norm
        self.head = head
        self.linears = [LinearSpec(name=name, module=head, act=0, int4=int4)]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        def stop(_module: torch.nn.Module, _args: tuple[Any, ...]) -> None:
            raise _SkipHead

        handle = self.head.register_forward_pre_hook(stop)  # after any Hessian hook
        try:
            with suppress(_SkipHead):
                self.head(self.norm(hidden))
        finally:
            handle.remove()
        return hidden

    @contextmanager
    def activate(self, device: torch.device, dtype: torch.dtype) -> Iterator[None]:
        """The norm and the head on ``device`` in ``dtype``, put back on exit."""
        placed = [(m, where) for m in (self.norm, self.head)
                  if (where := _placement(m)) is not None]
        for m, _ in placed:
            m.to(device=device, dtype=dtype)
        try:
            yield
        finally:
            for m, (dev, dt) in placed:
                m.to(device=dev, dtype=dt)


def head_block(model: Any, arch: ArchSpec, index: int, int4: bool = False) -> HeadBlock:
    """``model``'s head as block ``index`` of the layer-wise pass (the caller has run
    :func:`check_lattice_head`)."""
    return HeadBlock(index, arch.final_norm(model), arch.head(model), arch.head_path, int4)
