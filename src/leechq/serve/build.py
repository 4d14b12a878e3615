"""Assembling a serving :class:`~leechq.serve.model.Transformer` from the sources we meet.

* :func:`from_hf_model`: a transformers ``*ForCausalLM`` (dense, or with leechq modules in place of
  its linears, as ``leechq.load`` returns it). Its modules are reused, not copied: dense q/k/v and
  gate/up are concatenated by rows into one ``nn.Linear`` each; quantized ones become one
  :class:`~leechq.nn.group.LeechqGroup` each (:func:`fuse_group`).
* :func:`from_state_dict`: an HF-named dense state dict and its config (the fp16 arm).
* :func:`random_dense`: random dense weights of a given shape (the fp16 arm of the benchmark).

Fusing by rows is exact: the rows of the fused output are the rows of the members
(docs/kernels.md), so a fused projection computes the same numbers as its members.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from leechq.errors import InvalidInput, UnsupportedArchitecture
from leechq.serve.model import Block, ModelArgs, Transformer, block_norm_sources


class TiedHead(nn.Module):
    """The output head that reuses the embedding matrix [vocab, dim]: [..., dim] → [..., vocab]."""

    def __init__(self, embedding: nn.Embedding) -> None:
        super().__init__()
        self.embedding = embedding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.embedding.weight)


def dense_linear(
    weights: Sequence[torch.Tensor],
    biases: Sequence[torch.Tensor | None],
    dtype: torch.dtype,
    device: torch.device | str,
) -> nn.Linear:
    """One ``nn.Linear`` whose rows are the rows of ``weights`` (each [d_out_i, d_in]) in order.

    A single weight already of ``dtype`` on ``device`` is shared, not copied (a head or an unfused
    projection of a loaded model costs no extra memory).
    """
    d_in = weights[0].shape[1]
    if any(w.shape[1] != d_in for w in weights):
        raise InvalidInput(f"fused rows need one d_in, got {[list(w.shape) for w in weights]}")
    has_bias = any(b is not None for b in biases)
    out = sum(w.shape[0] for w in weights)

    def join(parts: list[torch.Tensor]) -> torch.Tensor:
        parts = [p.detach().to(device, dtype) for p in parts]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    lin = nn.Linear(d_in, out, bias=has_bias, device="meta")
    lin.weight = nn.Parameter(join(list(weights)), requires_grad=False)
    if has_bias:
        lin.bias = nn.Parameter(
            join(
                [
                    b if b is not None else torch.zeros(w.shape[0])
                    for w, b in zip(weights, biases, strict=True)
                ]
            ),
            requires_grad=False,
        )
    return lin


def _is_dense(m: nn.Module) -> bool:
    return type(m) is nn.Linear


def fuse_group(
    members: Sequence[nn.Module], dtype: torch.dtype, device: torch.device | str
) -> nn.Module:
    """One module for projections that read the same input (q|k|v, gate|up, or a single one).

    Dense members become one ``nn.Linear`` (rows concatenated). Otherwise a
    :class:`~leechq.nn.group.LeechqGroup` (``from_modules``): consecutive quantized members that
    run the fused kernel of one lattice layout with one shared rotation become its fused run (one
    rotation, their packed tensors reused); any other member (int4, the dense reference path) runs
    as it is, moved to ``device``.
    """
    from leechq.nn.group import LeechqGroup, fused_layout

    if all(_is_dense(m) for m in members):
        return dense_linear(
            [m.weight for m in members],  # type: ignore[misc]
            [m.bias for m in members],  # type: ignore[misc]
            dtype,
            device,
        )
    return LeechqGroup.from_modules([m if fused_layout(m) else m.to(device) for m in members])


def _get(module: Any, path: str) -> Any:
    for part in path.split("."):
        module = getattr(module, part)
    return module


def _copy_norm(
    dst: nn.Module, src: nn.Module, dtype: torch.dtype, device: torch.device | str
) -> None:
    dst.weight = nn.Parameter(src.weight.detach().to(device, dtype), requires_grad=False)


def _packed_on(module: nn.Module, dtype: torch.dtype, device: torch.device | str) -> nn.Module:
    """A packed embedding/head (:mod:`leechq.nn.embedding`, :mod:`leechq.nn.lattice_embedding`)
    finalized for ``dtype`` on ``device``, kept packed (the module is reused, re-finalized only
    when it ran another dtype or device)."""
    ex = getattr(module, "execution", None)
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if ex is None or ex.dtype != dtype or torch.device(ex.device) != dev:
        module.finalize(dev, dtype, prefer=module.prefer)  # type: ignore[operator]
    return module


def from_hf_model(
    hf_model: nn.Module,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> Transformer:
    """Build the serving model from a transformers causal LM (its modules are reused).

    Args:
        hf_model: a causal LM of a family in ``leechq.serve.model.SUPPORTED_ARCHS`` (Llama,
            Mistral, Qwen2, Qwen3, Gemma-2, Gemma-3 text), dense or with leechq modules in place of
            its linears, embedding or head (a lattice-coded head runs as a projection does,
            :func:`fuse_group`).
        dtype: activation dtype (default: the embedding's dtype, the dtype a packed embedding
            was finalized for, or float16 for another quantized embedding). A packed 4/8-bit
            embedding or head (:mod:`leechq.nn.embedding`) or a lattice-coded embedding
            (:mod:`leechq.nn.lattice_embedding`) is reused as it is, re-finalized for this dtype
            and device when needed.
        device: target device (default: where the embedding lives).

    Returns:
        The :class:`Transformer`, in eval mode.
    """
    from leechq.nn.embedding import PackedEmbedding, PackedHead
    from leechq.nn.lattice_embedding import LatticeEmbedding
    from leechq.nn.linear import LeechqLinear

    args = ModelArgs.from_hf_config(hf_model.config)
    embed = _get(hf_model, "model.embed_tokens")
    ref = getattr(embed, "weight", None)
    packed = isinstance(embed, (PackedEmbedding, LatticeEmbedding))
    if packed:  # a 4/8-bit or lattice-coded table kept as such by leechq.load
        if embed.embed_scale != 1.0:  # the reused module scales its rows itself: not twice
            args = dataclasses.replace(args, embed_scale=1.0)
        ex = embed.execution
        dtype = dtype or (ex.dtype if ex is not None else torch.float16)
        device = device or next(embed.buffers()).device
    dtype = dtype or (ref.dtype if ref is not None and ref.is_floating_point() else torch.float16)
    device = device or (ref.device if ref is not None else "cpu")
    if isinstance(embed, nn.Embedding):
        new_embed: nn.Module = nn.Embedding.from_pretrained(embed.weight.detach().to(device, dtype))
    elif packed:
        new_embed = _packed_on(embed, dtype, device)
    else:
        new_embed = embed.to(device)
    head = hf_model.get_output_embeddings() if hasattr(hf_model, "get_output_embeddings") else None
    head = head if head is not None else _get(hf_model, "lm_head")
    if _is_dense(head) and isinstance(embed, nn.Embedding) and head.weight is embed.weight:
        new_head: nn.Module = TiedHead(new_embed)  # type: ignore[arg-type]
    elif _is_dense(head):
        new_head = dense_linear([head.weight], [head.bias], dtype, device)
    elif isinstance(head, PackedHead):  # tied: reads the (already moved) embedding's table
        new_head = _packed_on(head, dtype, device)
    elif isinstance(head, LeechqLinear):  # a lattice-coded head: served as the projections are
        new_head = fuse_group([head], dtype, device)
    else:
        new_head = head.to(device)
    blocks = []
    for layer in _get(hf_model, "model.layers"):
        att, mlp = layer.self_attn, layer.mlp
        blk = Block(
            args,
            wqkv=fuse_group([att.q_proj, att.k_proj, att.v_proj], dtype, device),
            wo=fuse_group([att.o_proj], dtype, device),
            w13=fuse_group([mlp.gate_proj, mlp.up_proj], dtype, device),
            w2=fuse_group([mlp.down_proj], dtype, device),
        )
        for dst, src in block_norm_sources(args).items():
            _copy_norm(getattr(blk, dst), _get(layer, src), dtype, device)
        blocks.append(blk)
    model = Transformer(args, new_embed, blocks, new_head)
    _copy_norm(model.norm, _get(hf_model, "model.norm"), dtype, device)
    return model.to(device).eval()


def from_state_dict(
    config: Any,
    state_dict: Mapping[str, torch.Tensor],
    dtype: torch.dtype = torch.float16,
    device: torch.device | str = "cpu",
) -> Transformer:
    """Build the dense serving model from HF-named tensors
    (``model.layers.{i}.self_attn.q_proj.weight``…).

    Raises:
        InvalidInput: a required tensor is missing (the message names it).
    """
    args = config if isinstance(config, ModelArgs) else ModelArgs.from_hf_config(config)

    def get(name: str, required: bool = True) -> torch.Tensor | None:
        if name not in state_dict:
            if required:
                raise InvalidInput(f"state dict lacks {name!r}")
            return None
        return state_dict[name]

    def lin(prefix: str, names: Sequence[str]) -> nn.Linear:
        ws = [get(f"{prefix}.{n}.weight") for n in names]
        bs = [get(f"{prefix}.{n}.bias", required=False) for n in names]
        return dense_linear(ws, bs, dtype, device)  # type: ignore[arg-type]

    embed = nn.Embedding.from_pretrained(get("model.embed_tokens.weight").to(device, dtype))  # type: ignore[union-attr]
    blocks = []
    for i in range(args.n_layers):
        p = f"model.layers.{i}"
        blk = Block(
            args,
            wqkv=lin(f"{p}.self_attn", ["q_proj", "k_proj", "v_proj"]),
            wo=lin(f"{p}.self_attn", ["o_proj"]),
            w13=lin(f"{p}.mlp", ["gate_proj", "up_proj"]),
            w2=lin(f"{p}.mlp", ["down_proj"]),
        )
        for dst, src in block_norm_sources(args).items():
            w = get(f"{p}.{src}.weight").to(device, dtype)  # type: ignore[union-attr]
            getattr(blk, dst).weight = nn.Parameter(w, requires_grad=False)
        blocks.append(blk)
    head_w = get("lm_head.weight", required=not args.tie_word_embeddings)
    head: nn.Module = (
        TiedHead(embed) if head_w is None else dense_linear([head_w], [None], dtype, device)
    )
    model = Transformer(args, embed, blocks, head)
    model.norm.weight = nn.Parameter(
        get("model.norm.weight").to(device, dtype), requires_grad=False
    )  # type: ignore[union-attr]
    return model.to(device).eval()


def random_linear(
    d_in: int, d_out: int, bias: bool, dtype: torch.dtype, device: Any, g: torch.Generator
) -> nn.Linear:
    lin = nn.Linear(d_in, d_out, bias=bias, device="meta")
    w = torch.randn(d_out, d_in, generator=g, device=device, dtype=dtype).mul_(d_in**-0.5)
    lin.weight = nn.Parameter(w, requires_grad=False)
    if bias:
        b = torch.randn(d_out, generator=g, device=device, dtype=dtype).mul_(0.02)
        lin.bias = nn.Parameter(b, requires_grad=False)
    return lin


def random_dense(
    args: ModelArgs,
    dtype: torch.dtype = torch.float16,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> Transformer:
    """A dense model of ``args``' shape with random weights (entries N(0, 1/d_in)), built on
    ``device``.

    Used as the fp16 arm of the benchmark: same loop, same graphs as the quantized arm.
    """
    if args.arch not in ("llama", "mistral", "qwen2", "qwen3"):
        raise UnsupportedArchitecture(args.arch)
    g = torch.Generator(device=device).manual_seed(seed)
    a = args
    embed = nn.Embedding(a.vocab_size, a.dim, device="meta")
    embed.weight = nn.Parameter(
        torch.randn(a.vocab_size, a.dim, generator=g, device=device, dtype=dtype),
        requires_grad=False,
    )
    blocks = [
        Block(
            a,
            wqkv=random_linear(a.dim, a.q_size + 2 * a.kv_size, a.attention_bias, dtype, device, g),
            wo=random_linear(a.q_size, a.dim, a.o_bias, dtype, device, g),
            w13=random_linear(a.dim, 2 * a.intermediate_size, a.mlp_bias, dtype, device, g),
            w2=random_linear(a.intermediate_size, a.dim, a.mlp_bias, dtype, device, g),
        )
        for _ in range(a.n_layers)
    ]
    head: nn.Module = (
        TiedHead(embed)
        if a.tie_word_embeddings
        else random_linear(a.dim, a.vocab_size, False, dtype, device, g)
    )
    return finish_model(Transformer(a, embed, blocks, head), dtype, device)


def finish_model(model: Transformer, dtype: torch.dtype, device: torch.device | str) -> Transformer:
    """Norm weights to ``dtype`` and RoPE tables to ``device``; eval mode."""
    for mod in model.modules():
        if mod.__class__.__name__ == "RMSNorm":
            mod.weight = nn.Parameter(mod.weight.detach().to(device, dtype), requires_grad=False)
    model.inv_freq = model.inv_freq.to(device)
    return model.eval()


def execution_paths(model: nn.Module) -> dict[str, int]:
    """How many quantized modules run each path, e.g. ``{"fused": 250, "dense": 2}``.

    A module counts when it reports an ``execution`` with a ``path`` (``LeechqLinear`` after
    ``finalize``); dense modules of the fp16 arm do not count.
    """
    counts: dict[str, int] = {}
    for m in model.modules():
        ex = getattr(m, "execution", None)
        path = getattr(ex, "path", None)
        if isinstance(path, str):
            counts[path] = counts.get(path, 0) + int(getattr(ex, "members", 1))
    return counts


def warn_if_reference(model: nn.Module, device: torch.device) -> None:
    """Warn when quantized modules of a model on an accelerator run the dense reference path (each
    module's own ``ReferencePathWarning`` at finalize said why)."""
    counts = execution_paths(model)
    if device.type != "cpu" and counts.get("dense"):
        warnings.warn(
            f"{counts['dense']} of {sum(counts.values())} quantized modules on {device} run the "
            "dense reference path (no fused kernel for them on this device; see the "
            "ReferencePathWarning raised when they were finalized): expect fp16 speed and memory",
            stacklevel=3,
        )


def weight_bytes(module: nn.Module | None) -> int:
    """Bytes of the weights a module keeps on its accelerator or CPU device: parameters, buffers and
    the packed tensors of fused quantized plans (``LeechqLinear``'s kernel layout), each storage
    counted once. The canonical records a ``LeechqLinear`` keeps on the host are not counted."""
    if module is None:
        return 0
    tensors = [*module.parameters(), *module.buffers()]
    for sub in module.modules():
        plan = getattr(sub, "_fused", None)
        tensors.extend(t for t in getattr(plan, "tensors", {}).values() if torch.is_tensor(t))
    seen: set[tuple[str, int]] = set()
    total = 0
    for t in tensors:
        key = (str(t.device), t.untyped_storage().data_ptr())
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total
