"""The static key/value cache of the decode loop (docs/architecture.md §3, issue 6).

One pair of tensors per layer, ``[B, n_kv_heads, S, head_dim]`` in the activation dtype, allocated
once for a batch size and a slot count ``S`` and written in place with ``index_copy_``; nothing is
ever reallocated while generating, which is what lets a CUDA graph capture the decode step. Slots
are shared by the rows of a batch (rows are left padded, see :mod:`leechq.serve.model`).
"""

from __future__ import annotations

import torch

from leechq.errors import InvalidInput
from leechq.serve.model import ModelArgs

SLOT_ALIGN = 64
"""Slot counts are rounded up to this (keeps SDPA's mask rows aligned and limits distinct
shapes)."""


def round_slots(n: int) -> int:
    """``n`` rounded up to a multiple of :data:`SLOT_ALIGN`."""
    return -(-n // SLOT_ALIGN) * SLOT_ALIGN


MIN_SESSION_SLOTS = 128


def session_slots(n: int) -> int:
    """Default cache size for ``n`` needed slots: the next power of two, at least 128.

    Growing by doubling keeps re-allocation (and graph re-capture) rare while a conversation grows,
    at the price of attending over at most twice the live length.
    """
    return max(MIN_SESSION_SLOTS, 1 << max(0, (n - 1).bit_length()))


class KVCache:
    """Per-layer key and value tensors for ``batch`` rows and ``seq_len`` slots.

    ``slots_are_positions`` False: a slot index is not a token position (the slot pool's shared
    clock, :mod:`leechq.serve.pool`), so the cache may hold more slots than the model's positions.

    Attributes:
        k, v: lists (one per layer) of ``dtype`` tensors [batch, n_kv_heads, seq_len, head_dim].
        batch, seq_len: sizes.
    """

    def __init__(
        self,
        args: ModelArgs,
        batch: int,
        seq_len: int,
        dtype: torch.dtype,
        device: torch.device | str,
        slots_are_positions: bool = True,
    ) -> None:
        if batch < 1 or seq_len < 1:
            raise InvalidInput(
                f"KV cache needs batch >= 1 and seq_len >= 1, got {batch} and {seq_len}"
            )
        if slots_are_positions and seq_len > args.max_position_embeddings:
            raise InvalidInput(
                f"KV cache of {seq_len} slots exceeds the model's max_position_embeddings "
                f"({args.max_position_embeddings})"
            )
        shape = (batch, args.n_kv_heads, seq_len, args.head_dim)
        self.batch, self.seq_len, self.dtype = batch, seq_len, dtype
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(args.n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(args.n_layers)]

    @property
    def nbytes(self) -> int:
        """Bytes held by the cache tensors."""
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    def fits(self, batch: int, seq_len: int, dtype: torch.dtype, device: torch.device) -> bool:
        """Whether this cache can serve ``batch`` rows up to ``seq_len`` slots without
        reallocation."""
        return (
            self.batch == batch
            and self.seq_len >= seq_len
            and self.dtype == dtype
            and self.k[0].device == device
        )
