"""Host wrapper of the decode-step attention kernels (:mod:`.decode_attention`): validation, the
key splits, the two launches. Twin: ``reference.decode_attention``."""

from __future__ import annotations

import torch
import triton

from leechq.errors import InvalidInput
from leechq.kernels.triton.decode_attention import (
    LOG2E,
    decode_attention_combine_kernel,
    decode_attention_partial_kernel,
)
from leechq.kernels.triton.ops_common import check_tensor, interpreting
from leechq.kernels.tuning import DECODE_ATTN_BLOCK_N, DECODE_ATTN_MAX_SPLITS

DECODE_ATTN_MAX_HEAD_DIM = 256
"""The widest attention head :func:`decode_attention` takes."""

NO_WINDOW = 1 << 30
"""The window the kernel is given for "no sliding window" (wider than any cache)."""


def decode_attention_splits(seq_len: int) -> tuple[int, int]:
    """``(keys per split, splits)`` of :func:`decode_attention` over a ``seq_len``-slot cache: one
    tile per split up to ``BLOCK_N · MAX_SPLITS`` slots, more tiles per split beyond."""
    tiles = max(1, triton.cdiv(seq_len, DECODE_ATTN_BLOCK_N))
    split = triton.cdiv(tiles, DECODE_ATTN_MAX_SPLITS) * DECODE_ATTN_BLOCK_N
    return split, triton.cdiv(seq_len, split)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     slot: torch.Tensor, pad: torch.Tensor, scale: float,
                     k_new: torch.Tensor | None = None,
                     v_new: torch.Tensor | None = None, window: int = 0) -> torch.Tensor:
    """Attention of one query position per row over a static KV cache (the serving model's decode
    step), reading only the slots the query sees (twin: ``reference.decode_attention``).

    Args:
        q: [B, n_kv, G, head_dim] (float16, bfloat16 or float32; the ``G`` query heads that share
            each key/value head, head ``kv·G + g``), unit stride along ``head_dim``.
        k_cache, v_cache: [B, n_kv, S, head_dim] of q's dtype, unit stride along ``head_dim``.
        slot: int64 [1], the query's cache slot ``t < S`` (read on the device: graph-safe; a
            larger ``t`` reads and writes nothing past the cache, and its slot is not written).
        pad: int64 [B], each row's left padding; key slot ``s`` is seen iff ``pad[b] <= s <= t``
            or ``s == t``.
        scale: the softmax scale (``head_dim ** -0.5``).
        k_new, v_new: [B, n_kv, 1, head_dim] of q's dtype (unit stride along ``head_dim``), the
            step's own key and value: written into slot ``t`` of the caches by the kernel (no
            separate cache write) and used for it; None when the caches already hold them.
        window: a sliding window > 0 also hides the keys ``s <= t - window`` (the query sees the
            ``window`` latest slots, itself included; the splits and tiles before them are not
            read); 0: none.

    Returns:
        [B, n_kv, G, head_dim] of q's dtype, contiguous (so also [B, 1, n_kv·G·head_dim]).

    Raises:
        InvalidInput: mismatched shapes, dtypes or devices, a strided head dimension, a head
            dimension above :data:`DECODE_ATTN_MAX_HEAD_DIM`, a cache without slots, a
            negative window.
    """
    if window < 0:
        raise InvalidInput(f"window must be >= 0 (0: none), got {window}")
    if (k_new is None) != (v_new is None):
        raise InvalidInput("k_new and v_new go together")
    news = () if k_new is None else (("k_new", k_new), ("v_new", v_new))
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), *news):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise InvalidInput(f"{name} must be a 4-D tensor")
        if t.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise InvalidInput(f"{name} must be float16, bfloat16 or float32, got {t.dtype}")
        if t.dtype != q.dtype:
            raise InvalidInput(f"{name} is {t.dtype}, q is {q.dtype}")
        if t.stride(-1) != 1:
            raise InvalidInput(f"{name} must have unit stride along head_dim, got {t.stride()}")
        if t.device != q.device:
            raise InvalidInput(f"{name} is on {t.device}, q on {q.device}")
    if not interpreting() and q.device.type != "cuda":
        raise InvalidInput(f"q is on {q.device}; the Triton kernels need CUDA tensors")
    b, n_kv, g, hd = q.shape
    if k_cache.shape != v_cache.shape or tuple(k_cache.shape[:2]) != (b, n_kv) \
            or k_cache.shape[3] != hd:
        raise InvalidInput(f"k_cache and v_cache must be [{b}, {n_kv}, S, {hd}], got "
                           f"{list(k_cache.shape)} and {list(v_cache.shape)}")
    for name, t in news:
        if tuple(t.shape) != (b, n_kv, 1, hd):
            raise InvalidInput(f"{name} must be [{b}, {n_kv}, 1, {hd}], got {list(t.shape)}")
    if not 1 <= hd <= DECODE_ATTN_MAX_HEAD_DIM:
        raise InvalidInput(f"head_dim must be 1..{DECODE_ATTN_MAX_HEAD_DIM}, got {hd}")
    check_tensor(slot, "slot", torch.int64, (1,), device=q.device)
    check_tensor(pad, "pad", torch.int64, (b,), device=q.device)
    seq_len = int(k_cache.shape[2])
    if seq_len == 0:
        raise InvalidInput("k_cache and v_cache have no slots")
    out = torch.empty(b, n_kv, g, hd, dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    split, nsplit = decode_attention_splits(seq_len)
    po = torch.empty(b * n_kv * nsplit * g * hd, dtype=torch.float32, device=q.device)
    pml = torch.empty(b * n_kv * nsplit * g * 2, dtype=torch.float32, device=q.device)
    dp = max(16, triton.next_power_of_2(hd))
    kn, vn = (k_cache, v_cache) if k_new is None else (k_new, v_new)
    decode_attention_partial_kernel[(b * n_kv, nsplit)](
        q, k_cache, v_cache, slot, pad, po, pml, kn, vn,
        q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        kn.stride(0), kn.stride(1), vn.stride(0), vn.stride(1), float(scale) * LOG2E, seq_len,
        min(int(window), NO_WINDOW) if window else NO_WINDOW,
        N_KV=n_kv, G=g, GP=max(16, triton.next_power_of_2(g)), D=hd, DP=dp,
        BLOCK_N=DECODE_ATTN_BLOCK_N, SPLIT=split, NSPLIT=nsplit,
        IEEE=q.dtype == torch.float32 or (interpreting() and q.dtype == torch.bfloat16),
        WRITE=k_new is not None, num_warps=4,
    )
    decode_attention_combine_kernel[(b * n_kv * g,)](
        po, pml, out, G=g, D=hd, DP=dp, NSPLIT=nsplit,
        SP=max(2, triton.next_power_of_2(nsplit)), num_warps=1,
    )
    return out
