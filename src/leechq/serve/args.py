"""The serving decoder's shape and hyper-parameters (:class:`ModelArgs`), read from a transformers
config (the object or its ``config.json`` dict, older key names included), and its RoPE tables.

:mod:`leechq.serve.model` runs what these describe; reading a config refuses, with the reason, what
the decoder cannot compute (an unknown family, another activation, a RoPE type other than default /
linear / llama3).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from leechq.errors import InvalidInput, UnsupportedArchitecture

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text")

GEMMA_ARCHS = ("gemma2", "gemma3_text")
"""The families with Gemma's block: (1 + weight) RMSNorms, a norm after each sublayer as well as
before it, GELU-tanh gated MLP, embeddings scaled by √dim."""

_GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh")


@dataclass
class ModelArgs:
    """Shape and hyper-parameters of a decoder (everything the forward pass needs besides weights).

    Attributes:
        arch: one of :data:`SUPPORTED_ARCHS` (the HF ``model_type``; Gemma-3's text model is
            ``"gemma3_text"``).
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
        gemma_block: Gemma's block (:data:`GEMMA_ARCHS`): RMSNorm scales by ``1 + weight`` (in
            float32, then narrowed), sublayer outputs are normalised before the residual add,
            the MLP is GELU(tanh)·up, the embedding is scaled by ``embed_scale``.
        embed_scale: factor on the embedding output (√dim for Gemma, rounded to the activation
            dtype as transformers does; 1 otherwise).
        attn_scale: softmax scale (``query_pre_attn_scalar ** -0.5`` for Gemma); None:
            ``head_dim ** -0.5``.
        attn_softcap: attention scores become ``cap·tanh(score / cap)`` before the mask (Gemma-2);
            None: plain.
        final_softcap: the same on the output logits; None: plain.
        layer_windows: per layer, the sliding window (a query sees the ``window`` latest
            positions, itself included) or 0 for full attention; empty: every layer full.
        local_rope_theta: RoPE base of the sliding-window layers (Gemma-3's local layers, plain
            RoPE); None: the sliding layers use the global RoPE.
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
    gemma_block: bool = False
    embed_scale: float = 1.0
    attn_scale: float | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    layer_windows: tuple[int, ...] = ()
    local_rope_theta: float | None = None

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
        self.layer_windows = tuple(int(w) for w in self.layer_windows)
        if self.layer_windows and len(self.layer_windows) != self.n_layers:
            raise InvalidInput(
                f"layer_windows has {len(self.layer_windows)} entries for {self.n_layers} layers"
            )
        if any(w < 0 for w in self.layer_windows):
            raise InvalidInput(f"sliding windows must be >= 0, got {self.layer_windows}")

    def window(self, layer: int) -> int:
        """The sliding window of ``layer`` (0: full attention)."""
        return self.layer_windows[layer] if self.layer_windows else 0

    @property
    def softmax_scale(self) -> float:
        """The attention's score scale."""
        return self.attn_scale if self.attn_scale is not None else self.head_dim**-0.5

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
            UnsupportedArchitecture: an unknown ``model_type``, an MLP activation other than the
                family's (SiLU; GELU-tanh for Gemma), a layer type other than full or sliding
                attention, bidirectional attention, partial rotary embeddings or a RoPE type
                other than default / linear / llama3.
        """
        cfg: Mapping[str, Any] = config if isinstance(config, Mapping) else config.to_dict()
        arch = cfg.get("model_type", "")
        if arch not in SUPPORTED_ARCHS:
            raise UnsupportedArchitecture(
                f"serving supports model_type {list(SUPPORTED_ARCHS)}, got {arch!r}"
            )
        gemma = arch in GEMMA_ARCHS
        if gemma:
            act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
            if act not in _GELU_TANH:
                raise UnsupportedArchitecture(
                    f"{arch}: hidden_activation {act!r} is not supported (need 'gelu_pytorch_tanh')"
                )
            if cfg.get("use_bidirectional_attention"):
                raise UnsupportedArchitecture(f"{arch}: bidirectional attention is not supported")
        else:
            act = cfg.get("hidden_act", "silu")
            if act != "silu":
                raise UnsupportedArchitecture(
                    f"{arch}: hidden_act {act!r} is not supported (need 'silu')"
                )
        n_heads = int(cfg["num_attention_heads"])
        n_layers = int(cfg["num_hidden_layers"])
        dim = int(cfg["hidden_size"])
        head_dim = int(cfg.get("head_dim") or dim // n_heads)
        rope, local = _rope_parameters(cfg, arch)
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope.get("partial_rotary_factor", 1.0) != 1.0:
            raise UnsupportedArchitecture(f"{arch}: partial rotary embeddings are not supported")
        scaling = {k: v for k, v in rope.items() if k not in ("rope_theta", "type")}
        scaling["rope_type"] = rope_type
        local_theta = None
        if local is not None:
            if local.get("rope_type", local.get("type", "default")) != "default":
                raise UnsupportedArchitecture(
                    f"{arch}: the sliding layers' RoPE must be plain, got {local}"
                )
            local_theta = float(local.get("rope_theta", 10000.0))
        # Qwen2 always biases q/k/v (never o); the others bias all four iff attention_bias.
        attn_bias = arch == "qwen2" or bool(cfg.get("attention_bias", False))
        softcap = cfg.get("attn_logit_softcapping") if arch == "gemma2" else None  # Gemma-3
        final_cap = cfg.get("final_logit_softcapping") if gemma else None  # ignores the former
        return cls(
            arch=arch,
            vocab_size=int(cfg["vocab_size"]),
            dim=dim,
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=int(cfg.get("num_key_value_heads") or n_heads),
            head_dim=head_dim,
            intermediate_size=int(cfg["intermediate_size"]),
            norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta", 10000.0)),
            rope_scaling=scaling,
            qk_norm=arch in ("qwen3", "gemma3_text"),
            attention_bias=attn_bias,
            o_bias=attn_bias and arch != "qwen2",
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", gemma)),  # HF defaults
            max_position_embeddings=int(cfg.get("max_position_embeddings", 32768)),
            gemma_block=gemma,
            embed_scale=dim**0.5 if gemma else 1.0,
            attn_scale=float(cfg.get("query_pre_attn_scalar") or 256) ** -0.5 if gemma else None,
            attn_softcap=float(softcap) if softcap else None,
            final_softcap=float(final_cap) if final_cap else None,
            layer_windows=(_gemma_windows(cfg, arch, n_layers) if gemma
                           else _windows(cfg, arch, n_layers)),
            local_rope_theta=local_theta,
        )


def _rope_parameters(cfg: Mapping[str, Any], arch: str
                     ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The global RoPE parameters (``rope_theta`` included) and, for Gemma-3, its sliding layers'
    own (None for the other families: one RoPE for every layer). Reads transformers 5's
    ``rope_parameters`` (per layer type for Gemma-3) and the older ``rope_theta`` /
    ``rope_scaling`` / ``rope_local_base_freq`` keys."""
    rope = dict(cfg.get("rope_parameters") or {})
    default_theta = 1_000_000.0 if arch == "gemma3_text" else 10000.0
    local: dict[str, Any] | None = None
    if arch == "gemma3_text":
        if "full_attention" in rope or "sliding_attention" in rope:
            local = dict(rope.get("sliding_attention") or {})
            rope = dict(rope.get("full_attention") or {})
        else:
            local = {"rope_theta": cfg.get("rope_local_base_freq", 10000.0)}
    if not rope:
        rope = dict(cfg.get("rope_scaling") or {})
        rope.setdefault("rope_theta", cfg.get("rope_theta", default_theta))
    rope.setdefault("rope_theta", default_theta)
    return rope, local


def _windows(cfg: Mapping[str, Any], arch: str, n_layers: int) -> tuple[int, ...]:
    """Per layer, the sliding window of a non-Gemma family, as transformers reads its config, or
    ``()`` for full attention everywhere: Mistral slides every layer by ``sliding_window`` when it
    is set; Qwen2/Qwen3 only with ``use_sliding_window``, on the ``"sliding_attention"`` layers of
    ``layer_types`` (without it, the layers from ``max_window_layers`` on); Llama never."""
    window = int(cfg.get("sliding_window") or 0)
    if arch == "mistral":
        return (window,) * n_layers if window else ()
    if arch == "llama" or not cfg.get("use_sliding_window") or not window:
        return ()
    types = cfg.get("layer_types")
    if not types:
        first = int(cfg.get("max_window_layers") or 0)
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(n_layers)]
    return _typed_windows(types, window, arch, n_layers)


def _typed_windows(types: Any, window: int, arch: str, n_layers: int) -> tuple[int, ...]:
    """``window`` on the ``"sliding_attention"`` entries of ``types``, 0 on the full ones."""
    if len(types) != n_layers:
        raise UnsupportedArchitecture(
            f"{arch}: layer_types has {len(types)} entries for {n_layers} layers"
        )
    unknown = set(types) - {"sliding_attention", "full_attention"}
    if unknown:
        raise UnsupportedArchitecture(f"{arch}: layer types {sorted(unknown)} are not supported")
    return tuple(window if t == "sliding_attention" else 0 for t in types)


def _gemma_windows(cfg: Mapping[str, Any], arch: str, n_layers: int) -> tuple[int, ...]:
    """Per layer, the sliding window (``sliding_window`` on the ``"sliding_attention"`` layers of
    ``layer_types``; without it Gemma-2 alternates from a sliding first layer and Gemma-3 makes
    every ``sliding_window_pattern``-th layer full) or 0 (full attention)."""
    window = int(cfg.get("sliding_window") or 0)
    types = cfg.get("layer_types")
    if not types:
        every = 2 if arch == "gemma2" else int(cfg.get("sliding_window_pattern") or 6)
        types = [
            "sliding_attention" if (i + 1) % every else "full_attention" for i in range(n_layers)
        ]
    return _typed_windows(types, window, arch, n_layers)


# --------------------------------------------------------------------------------------------------
# RoPE


def rope_inv_freq(args: ModelArgs, local: bool = False) -> tuple[torch.Tensor, float]:
    """Inverse frequencies (f32 [head_dim/2]) and the cos/sin scaling factor for ``args``' RoPE
    type; ``local``: the sliding layers' own plain RoPE (``args.local_rope_theta``, which must be
    set)."""
    dim = args.head_dim
    theta = args.local_rope_theta if local else args.rope_theta
    if theta is None:
        raise InvalidInput("local RoPE asked of a model without local_rope_theta")
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    kind = "default" if local else args.rope_scaling.get("rope_type", "default")
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
