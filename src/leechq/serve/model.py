"""A small decoder for the Llama / Qwen2 / Qwen3 families, built for a static KV cache and CUDA
graphs.

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
* SwiGLU MLP.

The model never owns a weight format. Every projection is an ``nn.Module`` mapping ``[..., d_in]``
to ``[..., d_out]``: a dense ``nn.Linear`` (the fp16 arm) or a leechq module (the quantized arm),
both fused by rows where inputs are shared (``wqkv`` = q|k|v, ``w13`` = gate|up). The embedding and
the head are modules too (dense, or int8/int4 modules of the artifact). ``leechq.serve.build``
assembles models.

Batches are left padded. All rows share the cache slots of a step (``slots``, one per position); a
row ``b`` with ``pad[b]`` padding tokens sees token position ``slot - pad[b]`` and never attends to
its pad slots. Pad queries attend to themselves only, which keeps every softmax row finite.

The pure-tensor pieces between projections (norms, residual adds, q/k norm + RoPE, SiLU·mul) live in
:class:`Pieces`, so the decode path can swap in ``torch.compile``d copies (fused elementwise
kernels) without tracing through the projections' own kernels. A rotated lattice group on its matvec
path instead takes the norm (with the residual add) or the SwiGLU before it into its rotation
launch (:func:`norm_project`, :func:`silu_project`; ``leechq.nn.group``).
"""

from __future__ import annotations

import functools
import math
import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from leechq.errors import InvalidInput, UnsupportedArchitecture
from leechq.kernels.reference import rms_norm, silu_mul

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "qwen3")


@dataclass
class ModelArgs:
    """Shape and hyper-parameters of a decoder (everything the forward pass needs besides weights).

    Attributes:
        arch: "llama", "mistral", "qwen2" or "qwen3" (the HF ``model_type``).
        vocab_size, dim, n_layers, n_heads, n_kv_heads, head_dim, intermediate_size: shapes.
        norm_eps: RMSNorm epsilon.
        rope_theta: RoPE base.
        rope_scaling: the RoPE parameters besides theta ({"rope_type": "default"} when plain).
        qk_norm: per-head RMSNorm of q and k before RoPE (Qwen3).
        attention_bias: q/k/v (and o for Llama) carry biases (Qwen2: q/k/v only).
        o_bias: the output projection carries a bias.
        mlp_bias: gate/up/down carry biases (Llama ``mlp_bias``).
        tie_word_embeddings: the head reuses the embedding matrix.
        max_position_embeddings: the longest position the model was trained for.
    """

    arch: str
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] = field(default_factory=lambda: {"rope_type": "default"})
    qk_norm: bool = False
    attention_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32768

    def __post_init__(self) -> None:
        if self.arch not in SUPPORTED_ARCHS:
            raise UnsupportedArchitecture(
                f"serving supports model_type {list(SUPPORTED_ARCHS)}, got {self.arch!r}"
            )
        if self.n_heads % self.n_kv_heads:
            raise InvalidInput(
                f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}"
            )
        if self.head_dim % 2:
            raise InvalidInput(f"head_dim={self.head_dim} must be even for RoPE")

    @property
    def q_size(self) -> int:
        """Width of the query projection output."""
        return self.n_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of the key (and value) projection output."""
        return self.n_kv_heads * self.head_dim

    @property
    def groups(self) -> int:
        """Query heads per key/value head."""
        return self.n_heads // self.n_kv_heads

    @classmethod
    def from_hf_config(cls, config: Any) -> ModelArgs:
        """Read an HF config (a ``PretrainedConfig`` or the ``config.json`` dict).

        Raises:
            UnsupportedArchitecture: an unknown ``model_type``, a non-SiLU MLP, sliding-window
                attention or a RoPE type other than default / linear / llama3.
        """
        cfg: Mapping[str, Any] = config if isinstance(config, Mapping) else config.to_dict()
        arch = cfg.get("model_type", "")
        if arch not in SUPPORTED_ARCHS:
            raise UnsupportedArchitecture(
                f"serving supports model_type {list(SUPPORTED_ARCHS)}, got {arch!r}"
            )
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise UnsupportedArchitecture(
                f"{arch}: hidden_act {act!r} is not supported (need 'silu')"
            )
        if cfg.get("use_sliding_window") or (arch == "mistral" and cfg.get("sliding_window")):
            raise UnsupportedArchitecture(f"{arch}: sliding-window attention is not supported")
        n_heads = int(cfg["num_attention_heads"])
        dim = int(cfg["hidden_size"])
        head_dim = int(cfg.get("head_dim") or dim // n_heads)
        rope = dict(cfg.get("rope_parameters") or {})
        legacy = cfg.get("rope_scaling") or {}
        if not rope:
            rope = dict(legacy)
            rope.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope.get("partial_rotary_factor", 1.0) != 1.0:
            raise UnsupportedArchitecture(f"{arch}: partial rotary embeddings are not supported")
        scaling = {k: v for k, v in rope.items() if k not in ("rope_theta", "type")}
        scaling["rope_type"] = rope_type
        # Qwen2 always biases q/k/v (never o); Llama/Mistral/Qwen3 bias all four iff attention_bias.
        attn_bias = arch == "qwen2" or bool(cfg.get("attention_bias", False))
        return cls(
            arch=arch,
            vocab_size=int(cfg["vocab_size"]),
            dim=dim,
            n_layers=int(cfg["num_hidden_layers"]),
            n_heads=n_heads,
            n_kv_heads=int(cfg.get("num_key_value_heads") or n_heads),
            head_dim=head_dim,
            intermediate_size=int(cfg["intermediate_size"]),
            norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta", 10000.0)),
            rope_scaling=scaling,
            qk_norm=arch == "qwen3",
            attention_bias=attn_bias,
            o_bias=attn_bias and arch != "qwen2",
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 32768)),
        )


# --------------------------------------------------------------------------------------------------
# RoPE


def rope_inv_freq(args: ModelArgs) -> tuple[torch.Tensor, float]:
    """Inverse frequencies (f32 [head_dim/2]) and the cos/sin scaling factor for ``args``' RoPE
    type."""
    dim = args.head_dim
    inv = 1.0 / (args.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    kind = args.rope_scaling.get("rope_type", "default")
    if kind == "default":
        return inv, 1.0
    if kind == "linear":
        return inv / float(args.rope_scaling["factor"]), 1.0
    if kind == "llama3":
        # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, the band between is
        # interpolated linearly in 1/wavelength.
        p = args.rope_scaling
        factor, lo, hi = (
            float(p["factor"]),
            float(p["low_freq_factor"]),
            float(p["high_freq_factor"]),
        )
        old_len = float(p["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old_len / lo, inv / factor, inv)
        smooth = (old_len / wavelen - lo) / (hi - lo)
        mixed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old_len / hi) & ~(wavelen > old_len / lo)
        return torch.where(medium, mixed, scaled), 1.0
    raise UnsupportedArchitecture(f"RoPE type {kind!r} is not supported (default, linear, llama3)")


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, scale: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin for integer positions [B, T]: two ``dtype`` tensors [B, T, head_dim] (HF
    order)."""
    freqs = positions[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)


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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split the fused q|k|v output, apply the q/k norms and RoPE, lay heads out for SDPA.

    Args:
        qkv: [B, T, (n_heads + 2·n_kv_heads)·head_dim].
        cos, sin: [B, T, head_dim].
        q_norm, k_norm: per-head RMSNorm weights [head_dim] (Qwen3) or None.

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
        q = rms_norm(q, q_norm, eps)
        k = rms_norm(k, k_norm, eps)
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
    slots: torch.Tensor, pad: torch.Tensor, seq_len: int, groups: int
) -> torch.Tensor:
    """Boolean SDPA mask [B, 1, groups·T, S] (True = attend) for queries at ``slots`` [T].

    Key slot ``s`` is visible from a query at slot ``t`` of row ``b`` iff ``s <= t`` and ``s >=
    pad[b]``; a pad query (``t < pad[b]``) sees only itself so its softmax stays finite.
    """
    keys = torch.arange(seq_len, device=slots.device)
    causal = keys[None, None, :] <= slots[None, :, None]  # [1, T, S]
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
                  scale: float) -> torch.Tensor:
    """The decode step's attention (``ops.decode_attention``) from :func:`qkv_split_rope`'s
    ``q`` [B, n_kv, groups, head_dim], ``k`` and ``v`` [B, n_kv, 1, head_dim] for the one position
    at ``slots`` [1]: writes ``k``, ``v`` into that cache slot (inside the kernel) and returns
    [B, n_kv, groups, head_dim], what ``scaled_dot_product_attention`` gives under
    :func:`attention_mask` after the cache write."""
    from leechq.kernels.triton import ops

    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    return ops.decode_attention(q, k_cache, v_cache, slots, pad, scale, k_new=k, v_new=v)


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


class Block(nn.Module):
    """One decoder layer: attention (fused q|k|v, o) and SwiGLU MLP (fused gate|up, down).

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
    ) -> torch.Tensor:
        """Attention sub-layer from the fused q|k|v projection ``qkv`` [B, T, q_size + 2·kv_size]
        (``self.wqkv`` of the normalised input) → [B, T, dim]; writes the cache. ``mask`` None: a
        decode step (T = 1) through :func:`decode_attend`, which needs ``pad``."""
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
        )
        if mask is None:
            if pad is None:
                raise InvalidInput("Block.attention without a mask needs pad (the decode kernel)")
            o = decode_attend(q, k, v, k_cache, v_cache, slots, pad, a.head_dim**-0.5)
        else:
            k_cache.index_copy_(2, slots, k)
            v_cache.index_copy_(2, slots, v)
            o = F.scaled_dot_product_attention(
                q, k_cache, v_cache, attn_mask=mask, scale=a.head_dim**-0.5
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
        positions = (slots[None, :] - pad[:, None]).clamp_min(0)
        cos, sin = rope_cos_sin(positions, self.inv_freq, self.rope_scale, x.dtype)
        mask: torch.Tensor | None = None
        if not decode_kernel_enabled(x.device, int(tokens.shape[1]), a.head_dim):
            visible = attention_mask(slots, pad, k_caches[0].shape[2], a.groups)
            # Additive form, built once per forward and shared by every layer (SDPA would
            # otherwise convert a boolean mask in each layer). Every row has a visible key, so no
            # row is all -inf.
            mask = torch.zeros(visible.shape, dtype=x.dtype, device=x.device)
            mask = mask.masked_fill(~visible, float("-inf"))
        delta: torch.Tensor | None = None
        for i, blk in enumerate(self.blocks):
            x, qkv = norm_project(blk.wqkv, x, delta, blk.attn_norm.weight, a.norm_eps, fns)
            attn = blk.attention(qkv, cos, sin, mask, k_caches[i], v_caches[i], slots, fns,
                                 pad)
            x, gate_up = norm_project(blk.w13, x, attn, blk.mlp_norm.weight, a.norm_eps, fns)
            delta = silu_project(blk.w2, gate_up, x.dtype, fns)
        if last_only:
            x, delta = x[:, -1:], delta[:, -1:]  # type: ignore[index]
        _, h = fns.add_rms_norm(x, delta, self.norm.weight, a.norm_eps)
        return self.head(h).float()
