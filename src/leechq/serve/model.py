"""A small decoder for the Llama / Mistral / Qwen2 / Qwen3 and Gemma-2 / Gemma-3 (text) families,
built for a static KV cache and CUDA graphs.

This is the serving model of issue 6 (docs/architecture.md §3: gpt-fast's static cache and
graph-captured decode; docs/kernels.md: q/k/v and gate/up fused by rows). It is
deliberately small:

* RMSNorm with the Hugging Face rounding (normalise in f32, narrow, then multiply by the weight);
* RoPE in the "rotate half" convention, default / linear / llama3 frequencies; Qwen3's q/k norms;
* GQA attention through ``scaled_dot_product_attention`` over a static cache; the query heads that
  share a key/value head are folded into the query length, so no K/V is ever repeated. A decode
  step (one position per row) on CUDA runs the split-key kernel instead
  (``leechq.kernels.triton.ops.decode_attention``, :func:`decode_kernel_enabled`), which reads only
  the slots the query sees;
* SwiGLU MLP;
* Gemma's block (``ModelArgs.gemma_block``): RMSNorm scaling by ``1 + weight`` in float32, norms
  after the attention and the MLP as well as before them, GELU(tanh)-gated MLP, embeddings scaled by
  √dim, the score scale ``query_pre_attn_scalar ** -0.5``, soft-capped logits (and Gemma-2's
  soft-capped attention scores, computed explicitly: SDPA has no cap, so those layers never take
  the decode kernel); per-layer sliding windows (a query sees the ``window`` latest positions, in
  the masks and in the decode kernel) with Gemma-3's local RoPE base on the sliding layers. The
  cache keeps every slot of a sliding layer (no ring buffer): windows cost compute, not memory.

The model never owns a weight format. Every projection is an ``nn.Module`` mapping ``[..., d_in]``
to ``[..., d_out]``: a dense ``nn.Linear`` (the fp16 arm) or a leechq module (the quantized arm),
both fused by rows where inputs are shared (``wqkv`` = q|k|v, ``w13`` = gate|up). The embedding and
the head are modules too (dense, or int8/int4 modules of the artifact). ``leechq.serve.build``
assembles models; :mod:`leechq.serve.args` reads their shapes (:class:`ModelArgs`) from configs.

Batches are left padded. All rows share the cache slots of a step (``slots``, one per position); a
row ``b`` with ``pad[b]`` padding tokens sees token position ``slot - pad[b]`` and never attends to
its pad slots. Pad queries attend to themselves only, which keeps every softmax row finite.

The pure-tensor pieces between projections (norms, residual adds, q/k norm + RoPE, SiLU·mul, and
Gemma's norms and GELU·mul) live in :class:`Pieces`, so the decode path can swap in
``torch.compile``d copies (fused elementwise kernels) without tracing through the projections' own
kernels. A rotated lattice group on its matvec
path instead takes the norm (with the residual add) or the SwiGLU before it into its rotation
launch (:func:`norm_project`, :func:`silu_project`; ``leechq.nn.group``); Gemma's projections
run plain, their norms and activation not being the ones those launches compute.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from leechq.errors import InvalidInput
from leechq.kernels.reference import rms_norm, silu_mul
from leechq.serve.args import (  # noqa: F401  (re-exported: the model's public names)
    GEMMA_ARCHS,
    SUPPORTED_ARCHS,
    ModelArgs,
    rope_cos_sin,
    rope_inv_freq,
)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


# --------------------------------------------------------------------------------------------------
# The pure-tensor pieces between projections (compiled as units on the GPU decode path)


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add then RMSNorm: returns ``(x + delta, rms_norm(x + delta))``.

    ``delta`` may be wider than ``x`` (float32 from a fused quantized projection); it is narrowed
    to ``x.dtype`` first, inside the same fused kernel when compiled.
    """
    x = x + delta.to(x.dtype)
    return x, rms_norm(x, weight, eps)


def offset_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm over the last dimension: normalise in f32, multiply by ``1 + weight`` in
    f32, narrow to ``x.dtype`` once. Shapes as ``x``."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * (1.0 + weight.float())).to(x.dtype)


def add_offset_norms(
    x: torch.Tensor, delta: torch.Tensor, post: torch.Tensor, pre: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gemma's residual step: ``r = x + offset_rms_norm(delta, post)`` (``delta``, a sublayer's
    output, first narrowed to ``x.dtype``), returns ``(r, offset_rms_norm(r, pre))``, the next
    sublayer's input. x, delta [..., dim]; post, pre [dim]."""
    x = x + offset_rms_norm(delta.to(x.dtype), post, eps)
    return x, offset_rms_norm(x, pre, eps)


def gelu_mul(gate_up: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """GELU(tanh)-gated MLP input on a gate|up tensor [..., 2·I] → [..., I] of ``dtype`` (computed
    in the input's dtype, as :func:`~leechq.kernels.reference.silu_mul`)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return (F.gelu(gate, approximate="tanh") * up).to(dtype)


def qkv_split_rope(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    q_norm: torch.Tensor | None,
    k_norm: torch.Tensor | None,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    eps: float,
    norm_offset: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split the fused q|k|v output, apply the q/k norms and RoPE, lay heads out for SDPA.

    Args:
        qkv: [B, T, (n_heads + 2·n_kv_heads)·head_dim].
        cos, sin: [B, T, head_dim].
        q_norm, k_norm: per-head RMSNorm weights [head_dim] (Qwen3, Gemma-3) or None.
        norm_offset: the q/k norms are Gemma's (:func:`offset_rms_norm`).

    Returns:
        q [B, n_kv_heads, groups·T, head_dim] (the query heads of one key/value head folded into the
        length, head ``h = kv·groups + g`` at rows ``g·T … g·T + T − 1``), k and v [B, n_kv_heads,
        T, head_dim].
    """
    b, t, _ = qkv.shape
    groups = n_heads // n_kv_heads
    qkv = qkv.to(cos.dtype)  # a fused quantized group hands over float32
    q, k, v = qkv.split([n_heads * head_dim, n_kv_heads * head_dim, n_kv_heads * head_dim], dim=-1)
    q = q.reshape(b, t, n_heads, head_dim)
    k = k.reshape(b, t, n_kv_heads, head_dim)
    v = v.reshape(b, t, n_kv_heads, head_dim)
    if q_norm is not None and k_norm is not None:
        norm = offset_rms_norm if norm_offset else rms_norm
        q = norm(q, q_norm, eps)
        k = norm(k, k_norm, eps)
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    q = q * c + _rotate_half(q) * s
    k = k * c + _rotate_half(k) * s
    q = q.reshape(b, t, n_kv_heads, groups, head_dim).permute(0, 2, 3, 1, 4)
    q = q.reshape(b, n_kv_heads, groups * t, head_dim)
    return q, k.transpose(1, 2), v.transpose(1, 2)


def merge_heads(o: torch.Tensor, n_heads: int, t: int) -> torch.Tensor:
    """Inverse of the query folding: [B, n_kv, groups·T, hd] → [B, T, n_heads·hd]."""
    b, n_kv, _, hd = o.shape
    o = o.reshape(b, n_kv, n_heads // n_kv, t, hd).permute(0, 3, 1, 2, 4)
    return o.reshape(b, t, n_heads * hd)


def attention_mask(
    slots: torch.Tensor, pad: torch.Tensor, seq_len: int, groups: int, window: int = 0
) -> torch.Tensor:
    """Boolean SDPA mask [B, 1, groups·T, S] (True = attend) for queries at ``slots`` [T].

    Key slot ``s`` is visible from a query at slot ``t`` of row ``b`` iff ``s <= t`` and ``s >=
    pad[b]`` (and, with a sliding ``window`` > 0, ``s > t - window``: slots and positions differ by
    the row's padding only, so this is transformers' window on positions); a pad query
    (``t < pad[b]``) sees only itself so its softmax stays finite.
    """
    keys = torch.arange(seq_len, device=slots.device)
    causal = keys[None, None, :] <= slots[None, :, None]  # [1, T, S]
    if window > 0:
        causal = causal & (keys[None, None, :] > slots[None, :, None] - window)
    real = keys[None, None, :] >= pad[:, None, None]  # [B, 1, S]
    self_only = keys[None, None, :] == slots[None, :, None]
    mask = (causal & real) | self_only  # [B, T, S]
    return mask[:, None].repeat(1, 1, groups, 1)


INTERPRETED_DECODE_KERNEL = False
"""Whether the CPU, under the Triton interpreter, runs the decode step's attention through the
split-key kernel (the CI route to the kernel: its tests set this); otherwise the CPU keeps
``scaled_dot_product_attention``."""


def decode_kernel_enabled(device: torch.device, positions: int, head_dim: int) -> bool:
    """Whether a forward of ``positions`` positions per row on ``device`` runs its attention
    through the split-key decode kernel (``ops.decode_attention``) instead of
    ``scaled_dot_product_attention``: one position, heads the kernel takes
    (``ops.DECODE_ATTN_MAX_HEAD_DIM``; wider heads keep SDPA), a CUDA device with Triton. On the
    CPU only with :data:`INTERPRETED_DECODE_KERNEL` under the Triton interpreter."""
    if positions != 1:
        return False
    if device.type == "cuda":
        from leechq.kernels import triton as triton_kernels

        if not triton_kernels.available():
            return False
    elif not (INTERPRETED_DECODE_KERNEL and os.environ.get("TRITON_INTERPRET") == "1"):
        return False
    from leechq.kernels.triton import ops

    return head_dim <= ops.DECODE_ATTN_MAX_HEAD_DIM


def decode_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                  v_cache: torch.Tensor, slots: torch.Tensor, pad: torch.Tensor,
                  scale: float, window: int = 0) -> torch.Tensor:
    """The decode step's attention (``ops.decode_attention``) from :func:`qkv_split_rope`'s
    ``q`` [B, n_kv, groups, head_dim], ``k`` and ``v`` [B, n_kv, 1, head_dim] for the one position
    at ``slots`` [1]: writes ``k``, ``v`` into that cache slot (inside the kernel) and returns
    [B, n_kv, groups, head_dim], what ``scaled_dot_product_attention`` gives under
    :func:`attention_mask` (with the same sliding ``window``) after the cache write."""
    from leechq.kernels.triton import ops

    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    return ops.decode_attention(q, k_cache, v_cache, slots, pad, scale, k_new=k, v_new=v,
                                window=window)


def softcap_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                      scale: float, cap: float) -> torch.Tensor:
    """Attention with soft-capped scores (Gemma-2): ``cap·tanh(scale·q·k / cap)``, then the
    additive ``mask``, a float32 softmax narrowed to q's dtype, times ``v``. q [B, H, Tq, hd];
    k, v [B, H, S, hd]; mask [B, 1, Tq, S] → [B, H, Tq, hd] (transformers' eager order)."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / cap) * cap + mask
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)


def norm_project(
    proj: nn.Module,
    x: torch.Tensor,
    delta: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    fns: Pieces,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(r, proj(rms_norm(r)))`` with ``r = x + delta`` (``x`` when ``delta`` is None). A
    projection that can (``proj.fuses_pre_ops(rows)``: a rotated lattice group on its matvec path)
    takes the add and the norm into its rotation launch; otherwise ``fns`` computes them."""
    fuses = getattr(proj, "fuses_pre_ops", None)
    if fuses is not None and fuses(x.numel() // x.shape[-1]):
        return proj.forward_add_norm(x, delta, weight, eps)  # type: ignore[operator]
    if delta is None:
        h = fns.rms_norm(x, weight, eps)
    else:
        x, h = fns.add_rms_norm(x, delta, weight, eps)
    return x, proj(h)


def silu_project(proj: nn.Module, gate_up: torch.Tensor, dtype: torch.dtype,
                 fns: Pieces) -> torch.Tensor:
    """``proj(silu_mul(gate_up, dtype))``, the SwiGLU inside the projection's rotation launch when
    it can (as :func:`norm_project`)."""
    fuses = getattr(proj, "fuses_pre_ops", None)
    if fuses is not None and fuses(gate_up.numel() // gate_up.shape[-1]):
        return proj.forward_silu_mul(gate_up, dtype)  # type: ignore[operator]
    return proj(fns.silu_mul(gate_up, dtype))


@dataclass
class Pieces:
    """The pure-tensor functions a forward pass calls; swap in compiled copies for the decode
    path."""

    rms_norm: Callable[..., torch.Tensor] = rms_norm
    add_rms_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]] = add_rms_norm
    qkv_split_rope: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = qkv_split_rope
    silu_mul: Callable[..., torch.Tensor] = silu_mul
    offset_rms_norm: Callable[..., torch.Tensor] = offset_rms_norm
    add_offset_norms: Callable[..., tuple[torch.Tensor, torch.Tensor]] = add_offset_norms
    gelu_mul: Callable[..., torch.Tensor] = gelu_mul

    @classmethod
    def compiled(cls, dynamic: bool = False) -> Pieces:
        """Each piece through ``torch.compile`` (default mode: fused kernels, no graphs of its own;
        the whole decode step is captured by :mod:`leechq.serve.graphs`). One shared set per
        process and ``dynamic``, so every engine reuses the same compiled code (one compile per
        shape, not per engine). ``dynamic``: sizes symbolic, one compile for every prompt width
        (the prefill's set)."""
        return _compiled_pieces(dynamic)


@functools.cache
def _compiled_pieces(dynamic: bool = False) -> Pieces:
    import torch._dynamo

    # One specialisation per (model shape, batch size): raise dynamo's per-function limit so a
    # benchmark sweep never silently falls back to eager.
    for name in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(64, getattr(torch._dynamo.config, name)))
    return Pieces(
        rms_norm=_CompiledOrEager(rms_norm, dynamic),
        add_rms_norm=_CompiledOrEager(add_rms_norm, dynamic),
        qkv_split_rope=_CompiledOrEager(qkv_split_rope, dynamic),
        silu_mul=_CompiledOrEager(silu_mul, dynamic),
        offset_rms_norm=_CompiledOrEager(offset_rms_norm, dynamic),
        add_offset_norms=_CompiledOrEager(add_offset_norms, dynamic),
        gelu_mul=_CompiledOrEager(gelu_mul, dynamic),
    )


class _CompiledOrEager:
    """``torch.compile(fn)``, falling back to ``fn`` for good (with a warning) if compiling fails,
    so a missing compiler toolchain costs speed, never the generation."""

    def __init__(self, fn: Callable[..., Any], dynamic: bool = False) -> None:
        self.fn = fn
        self.compiled: Callable[..., Any] | None = torch.compile(fn, dynamic=dynamic,
                                                                 fullgraph=True)

    def __call__(self, *args: Any) -> Any:
        if self.compiled is None:
            return self.fn(*args)
        try:
            return self.compiled(*args)
        except Exception as exc:  # any compiler failure: the eager function computes the same
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                raise  # never swallow an error inside a graph capture
            warnings.warn(
                f"torch.compile failed for {self.fn.__name__} ({type(exc).__name__}: {exc}); "
                "running it eagerly (slower decode steps)",
                stacklevel=2,
            )
            self.compiled = None
            return self.fn(*args)


EAGER = Pieces()


# --------------------------------------------------------------------------------------------------
# Modules


class RMSNorm(nn.Module):
    """Holds an RMSNorm weight [dim]; the arithmetic is :func:`rms_norm`."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def block_norm_sources(args: ModelArgs) -> dict[str, str]:
    """Each :class:`Block` norm of ``args``' family → the module of a transformers decoder layer
    that holds its weight (dotted path; the builders in ``leechq.serve.build`` copy them)."""
    names = {"attn_norm": "input_layernorm"}
    if args.gemma_block:
        names.update(
            post_attn_norm="post_attention_layernorm",
            mlp_norm="pre_feedforward_layernorm",
            post_mlp_norm="post_feedforward_layernorm",
        )
    else:
        names["mlp_norm"] = "post_attention_layernorm"
    if args.qk_norm:
        names.update(q_norm="self_attn.q_norm", k_norm="self_attn.k_norm")
    return names


class Block(nn.Module):
    """One decoder layer: attention (fused q|k|v, o) and gated MLP (fused gate|up, down): SwiGLU,
    or Gemma's GELU(tanh) with the sublayer outputs normalised too (``post_attn_norm``,
    ``post_mlp_norm``; ``args.gemma_block``).

    Args:
        args: model shapes.
        wqkv: module [..., dim] → [..., q_size + 2·kv_size] (biases included if the model has them).
        wo: module [..., q_size] → [..., dim].
        w13: module [..., dim] → [..., 2·intermediate] (gate rows first).
        w2: module [..., intermediate] → [..., dim].
    """

    def __init__(
        self, args: ModelArgs, wqkv: nn.Module, wo: nn.Module, w13: nn.Module, w2: nn.Module
    ) -> None:
        super().__init__()
        self.args = args
        self.attn_norm = RMSNorm(args.dim, args.norm_eps)
        self.mlp_norm = RMSNorm(args.dim, args.norm_eps)
        self.q_norm = RMSNorm(args.head_dim, args.norm_eps) if args.qk_norm else None
        self.k_norm = RMSNorm(args.head_dim, args.norm_eps) if args.qk_norm else None
        sandwich = args.gemma_block
        self.post_attn_norm = RMSNorm(args.dim, args.norm_eps) if sandwich else None
        self.post_mlp_norm = RMSNorm(args.dim, args.norm_eps) if sandwich else None
        self.wqkv, self.wo, self.w13, self.w2 = wqkv, wo, w13, w2

    def attention(
        self,
        qkv: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slots: torch.Tensor,
        fns: Pieces,
        pad: torch.Tensor | None = None,
        window: int = 0,
    ) -> torch.Tensor:
        """Attention sub-layer from the fused q|k|v projection ``qkv`` [B, T, q_size + 2·kv_size]
        (``self.wqkv`` of the normalised input) → [B, T, dim]; writes the cache. ``mask``: the
        additive mask of this layer (its sliding ``window`` included); None: a decode step
        (T = 1) through :func:`decode_attend`, which needs ``pad`` and applies ``window``."""
        a = self.args
        t = qkv.shape[1]
        q, k, v = fns.qkv_split_rope(
            qkv,
            cos,
            sin,
            None if self.q_norm is None else self.q_norm.weight,
            None if self.k_norm is None else self.k_norm.weight,
            a.n_heads,
            a.n_kv_heads,
            a.head_dim,
            a.norm_eps,
            a.gemma_block,
        )
        if mask is None:
            if pad is None:
                raise InvalidInput("Block.attention without a mask needs pad (the decode kernel)")
            o = decode_attend(q, k, v, k_cache, v_cache, slots, pad, a.softmax_scale, window)
        else:
            k_cache.index_copy_(2, slots, k)
            v_cache.index_copy_(2, slots, v)
            if a.attn_softcap is not None:
                o = softcap_attention(q, k_cache, v_cache, mask, a.softmax_scale, a.attn_softcap)
            else:
                o = F.scaled_dot_product_attention(
                    q, k_cache, v_cache, attn_mask=mask, scale=a.softmax_scale
                )
        return self.wo(merge_heads(o, a.n_heads, t))


class Transformer(nn.Module):
    """The decoder: embedding, blocks, final norm, head.

    Args:
        args: model shapes.
        embed: module tokens int64 [B, T] → [B, T, dim] (its output dtype is the activation dtype).
        blocks: the decoder layers.
        head: module [..., dim] → [..., vocab] logits.
    """

    def __init__(
        self, args: ModelArgs, embed: nn.Module, blocks: list[Block], head: nn.Module
    ) -> None:
        super().__init__()
        self.args = args
        self.embed = embed
        self.blocks = nn.ModuleList(blocks)
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.head = head
        inv_freq, self.rope_scale = rope_inv_freq(args)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        # The sliding layers' own RoPE (Gemma-3), when they have one; None: every layer the same.
        local = args.local_rope_theta is not None and any(args.layer_windows)
        self.register_buffer("inv_freq_local", rope_inv_freq(args, local=True)[0] if local
                             else None, persistent=False)

    @property
    def device(self) -> torch.device:
        return self.inv_freq.device

    def forward(
        self,
        tokens: torch.Tensor,
        slots: torch.Tensor,
        pad: torch.Tensor,
        k_caches: list[torch.Tensor],
        v_caches: list[torch.Tensor],
        last_only: bool = True,
        fns: Pieces = EAGER,
    ) -> torch.Tensor:
        """Run positions ``slots`` of every row, writing their keys/values into the cache.

        Args:
            tokens: int64 [B, T] (left padded; pad tokens are arbitrary ids).
            slots: int64 [T], the cache slots of the T positions (shared by all rows, ascending).
            pad: int64 [B], left-padding length of each row.
            k_caches, v_caches: per layer [B, n_kv_heads, S, head_dim] (see :class:`KVCache`).
            last_only: compute logits for the last position only.
            fns: the pure-tensor pieces (eager or compiled).

        Returns:
            float32 logits [B, 1 or T, vocab].
        """
        a = self.args
        x = self.embed(tokens)
        if a.embed_scale != 1.0:  # the factor rounded to the activation dtype, as transformers
            x = x * float(torch.tensor(a.embed_scale, dtype=x.dtype))
        positions = (slots[None, :] - pad[:, None]).clamp_min(0)
        cos, sin = rope_cos_sin(positions, self.inv_freq, self.rope_scale, x.dtype)
        rope = {False: (cos, sin)}
        if self.inv_freq_local is not None:
            rope[True] = rope_cos_sin(positions, self.inv_freq_local, 1.0, x.dtype)
        masks: dict[int, torch.Tensor | None] = {}
        kernel = a.attn_softcap is None and decode_kernel_enabled(
            x.device, int(tokens.shape[1]), a.head_dim)
        for window in {a.window(i) for i in range(a.n_layers)}:
            masks[window] = None if kernel else self._additive_mask(
                slots, pad, k_caches[0].shape[2], window, x.dtype)

        def attend(i: int, blk: Block, qkv: torch.Tensor) -> torch.Tensor:
            window = a.window(i)
            c, s = rope[bool(window) and self.inv_freq_local is not None]
            return blk.attention(qkv, c, s, masks[window], k_caches[i], v_caches[i], slots, fns,
                                 pad, window)

        if a.gemma_block:
            x, h = self._gemma_layers(x, attend, last_only, fns)
        else:
            x, h = self._layers(x, attend, last_only, fns)
        logits = self.head(h).float()
        if a.final_softcap is not None:
            logits = torch.tanh(logits / a.final_softcap) * a.final_softcap
        return logits

    def _additive_mask(self, slots: torch.Tensor, pad: torch.Tensor, seq_len: int, window: int,
                       dtype: torch.dtype) -> torch.Tensor:
        """:func:`attention_mask` in additive form, built once per forward and window and shared
        by the layers (SDPA would otherwise convert a boolean mask in each layer). Every row has
        a visible key, so no row is all -inf."""
        visible = attention_mask(slots, pad, seq_len, self.args.groups, window)
        mask = torch.zeros(visible.shape, dtype=dtype, device=slots.device)
        return mask.masked_fill(~visible, float("-inf"))

    def _layers(self, x: torch.Tensor, attend: Callable[[int, Block, torch.Tensor], torch.Tensor],
                last_only: bool, fns: Pieces) -> tuple[torch.Tensor, torch.Tensor]:
        """The Llama-shaped blocks from the embedded ``x`` [B, T, dim]: the residual stream and
        the final norm's output (last position only with ``last_only``)."""
        a = self.args
        delta: torch.Tensor | None = None
        for i, blk in enumerate(self.blocks):
            x, qkv = norm_project(blk.wqkv, x, delta, blk.attn_norm.weight, a.norm_eps, fns)
            attn = attend(i, blk, qkv)
            x, gate_up = norm_project(blk.w13, x, attn, blk.mlp_norm.weight, a.norm_eps, fns)
            delta = silu_project(blk.w2, gate_up, x.dtype, fns)
        if last_only:
            x, delta = x[:, -1:], delta[:, -1:]  # type: ignore[index]
        return fns.add_rms_norm(x, delta, self.norm.weight, a.norm_eps)

    def _gemma_layers(self, x: torch.Tensor,
                      attend: Callable[[int, Block, torch.Tensor], torch.Tensor],
                      last_only: bool, fns: Pieces) -> tuple[torch.Tensor, torch.Tensor]:
        """Gemma's blocks (norms before and after each sublayer, GELU-tanh MLP), as
        :meth:`_layers`. The projections run plain (their fused pre-ops are SwiGLU and
        Llama-rounded norms)."""
        a = self.args
        eps = a.norm_eps
        h = fns.offset_rms_norm(x, self.blocks[0].attn_norm.weight, eps)
        delta = x  # reassigned by the first block
        for i, blk in enumerate(self.blocks):
            if i:
                prev = self.blocks[i - 1]
                x, h = fns.add_offset_norms(x, delta, prev.post_mlp_norm.weight,
                                            blk.attn_norm.weight, eps)
            attn = attend(i, blk, blk.wqkv(h))
            x, h = fns.add_offset_norms(x, attn, blk.post_attn_norm.weight,
                                        blk.mlp_norm.weight, eps)
            delta = blk.w2(fns.gelu_mul(blk.w13(h), x.dtype))
        if last_only:
            x, delta = x[:, -1:], delta[:, -1:]
        return fns.add_offset_norms(x, delta, self.blocks[-1].post_mlp_norm.weight,
                                    self.norm.weight, eps)
