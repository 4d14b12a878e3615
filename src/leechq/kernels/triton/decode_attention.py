"""Decode-step attention over a static KV cache, split over the keys (flash-decoding).

The serving model's decode step (docs/kernels.md: static cache, graph-captured step) has one
query position per row. ``scaled_dot_product_attention`` with the step's boolean mask reads every
slot of the static cache, filled or not, and its kernels are built for long queries: on the H200
it took 24 µs per layer over a 1024-slot Qwen3-8B cache (0.88 ms of a 4.0 ms Tetra step,
``benchmarks/step_breakdown.py``). These two kernels read only the keys a query can see, from the
slot held in device memory, so the work follows the context the row has, not the cache's capacity,
and the captured graph stays valid from step to step.

* :func:`decode_attention_partial_kernel`: one program per (row, key/value head, key split). The
  query heads that share the key/value head (GQA groups, padded to the 16 rows ``tl.dot`` needs)
  meet each ``BLOCK_N``-key tile with one ``tl.dot``; an online softmax (base 2) keeps the split's
  running maximum, sum and weighted values. Splits past the query's slot store an empty partial.
* :func:`decode_attention_combine_kernel`: one program per (row, query head) merges the splits.

Visibility is the serving model's mask (``leechq.serve.model.attention_mask``): key slot ``s`` of
row ``b`` is seen from slot ``t`` iff ``pad[b] <= s <= t`` and, with a sliding window ``W``,
``s > t - W``; or ``s == t``. Twin:
``leechq.kernels.reference.decode_attention``.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def decode_attention_partial_kernel(
    q_ptr, k_ptr, v_ptr, slot_ptr, pad_ptr, po_ptr, pml_ptr, kn_ptr, vn_ptr,
    sq_b, sq_h, sq_g, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, skn_b, skn_h, svn_b, svn_h, qk_scale,
    seq_len, window,
    N_KV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
    BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, NSPLIT: tl.constexpr, IEEE: tl.constexpr,
    WRITE: tl.constexpr,
):
    """Partials of split ``program_id(1)`` for row ``b`` and key/value head ``h``
    (``program_id(0) = b·N_KV + h``): ``po`` f32 [B·N_KV, NSPLIT, G, D] (unnormalised weighted
    values), ``pml`` f32 [B·N_KV, NSPLIT, G, 2] (running maximum of ``log2e · scale · q·k``, or
    −inf for an empty split, and the sum of ``2^(score − max)``). ``qk_scale`` is ``log2e ·
    scale``; the head dimension's last stride is 1. ``IEEE``: both products in float32 (float32
    inputs; bfloat16 under the interpreter, whose ``tl.dot`` has no bfloat16). ``WRITE``: the
    step's own key and value (``kn``, ``vn``: [B, N_KV, D] by their strides) stand in for cache
    slot ``t`` and the program whose split holds ``t`` writes them there — no other program reads
    that slot, so the cache write needs no launch of its own. No load or store reaches past the
    cache's ``seq_len`` slots, whatever ``t``. ``window``: keys ``s <= t - window`` are hidden too
    (a sliding window; a huge value for none), and the whole tiles before the first seen key are
    skipped."""
    bh = tl.program_id(0)
    sp = tl.program_id(1)
    b = bh // N_KV
    h = bh % N_KV
    t = tl.load(slot_ptr).to(tl.int32)
    lo = tl.maximum(tl.load(pad_ptr + b).to(tl.int32), t - window + 1)
    g = tl.arange(0, GP)
    d = tl.arange(0, DP)
    d_ok = d < D
    q = tl.load(q_ptr + b * sq_b + h * sq_h + g[:, None] * sq_g + d[None, :],
                mask=(g[:, None] < G) & d_ok[None, :], other=0.0)
    m = tl.full([GP], float("-inf"), tl.float32)
    l_sum = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, DP], tl.float32)
    start = sp * SPLIT
    end = tl.minimum(tl.minimum(start + SPLIT, t + 1), seq_len)  # never past the cache
    kb = k_ptr + b * sk_b + h * sk_h
    vb = v_ptr + b * sv_b + h * sv_h
    if WRITE:
        k_new = tl.load(kn_ptr + b * skn_b + h * skn_h + d, mask=d_ok, other=0.0)
        v_new = tl.load(vn_ptr + b * svn_b + h * svn_h + d, mask=d_ok, other=0.0)
        own = d_ok & (tl.zeros([DP], tl.int32) + t >= start) & (tl.zeros([DP], tl.int32) + t < end)
        tl.store(kb + t * sk_s + d, k_new, mask=own)
        tl.store(vb + t * sv_s + d, v_new, mask=own)
    # Whole tiles before the first seen key hold nothing (the query's own slot t is seen always).
    first = start + (tl.maximum(tl.minimum(lo, t) - start, 0) // BLOCK_N) * BLOCK_N
    for n0 in range(first, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < end
        k = tl.load(kb + n[:, None] * sk_s + d[None, :], mask=n_ok[:, None] & d_ok[None, :],
                    other=0.0)
        if WRITE:  # slot t from registers: its store above need not be visible yet
            k = tl.where((n == t)[:, None], k_new[None, :], k)
        if IEEE:
            s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = s * qk_scale
        seen = n_ok & ((n >= lo) | (n == t))
        s = tl.where(seen[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing seen yet
        alpha = tl.exp2(m - m_ref)
        p = tl.exp2(s - m_ref[:, None])
        l_sum = l_sum * alpha + tl.sum(p, axis=1)
        v = tl.load(vb + n[:, None] * sv_s + d[None, :], mask=n_ok[:, None] & d_ok[None, :],
                    other=0.0)
        if WRITE:
            v = tl.where((n == t)[:, None], v_new[None, :], v)
        if IEEE:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m = m_new
    row = (bh * NSPLIT + sp) * G + g
    g_ok = g < G
    tl.store(po_ptr + row[:, None] * D + d[None, :], acc, mask=g_ok[:, None] & d_ok[None, :])
    tl.store(pml_ptr + row * 2, m, mask=g_ok)
    tl.store(pml_ptr + row * 2 + 1, l_sum, mask=g_ok)


@triton.jit
def decode_attention_combine_kernel(
    po_ptr, pml_ptr, out_ptr,
    G: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, NSPLIT: tl.constexpr,
    SP: tl.constexpr,
):
    """The output of query head ``g`` of row-and-kv-head ``bh`` (``program_id(0) = bh·G + g``):
    the splits' partials weighted by ``2^(max_i − max)``, divided by the weighted sum, into
    ``out`` [B·N_KV·G, D] (contiguous, the output dtype)."""
    r = tl.program_id(0)
    bh = r // G
    g = r % G
    sp = tl.arange(0, SP)
    sp_ok = sp < NSPLIT
    d = tl.arange(0, DP)
    d_ok = d < D
    row = (bh * NSPLIT + sp) * G + g
    m_i = tl.load(pml_ptr + row * 2, mask=sp_ok, other=float("-inf"))
    l_i = tl.load(pml_ptr + row * 2 + 1, mask=sp_ok, other=0.0)
    m_all = tl.max(m_i, axis=0)
    w = tl.exp2(m_i - m_all)  # 0 for the empty splits (−inf); the query's own slot is seen
    acc = tl.load(po_ptr + row[:, None] * D + d[None, :], mask=sp_ok[:, None] & d_ok[None, :],
                  other=0.0)
    o = tl.sum(acc * w[:, None], axis=0) / tl.sum(l_i * w, axis=0)
    tl.store(out_ptr + r * D + d, o.to(out_ptr.dtype.element_ty), mask=d_ok)
