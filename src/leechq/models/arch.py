"""Per-architecture facts the quantizer, baselines and evaluation need about a decoder-only model.

Owns, for each supported family (Llama, Mistral, Qwen2, Qwen3), where the decoder blocks live, the
seven projections of a block and which of them read the same activation (docs/quantizer.md §2: act 0
= attention input for q/k/v, act 1 = attention output for o, act 2 = MLP input for gate/up, act 3 =
``silu(gate)·up`` for down), the block and final norms, the embedding and head paths, and whether
the head is tied to the embedding. Everything here is a fact about transformers' module tree
(``LlamaForCausalLM`` and friends), looked up by ``config.model_type``; nothing is computed.

It deliberately does not decide *policy* (which layers a recipe quantizes, lm_head precision); that
belongs to the recipe. Unknown families raise :class:`~leechq.errors.UnsupportedArchitecture` with
the list of supported ones.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from leechq.errors import UnsupportedArchitecture

# Activation indices of docs/quantizer.md §2 (one Hessian per index per block).
ACT_ATTN_IN = 0
ACT_ATTN_OUT = 1
ACT_MLP_IN = 2
ACT_MLP_PRODUCT = 3


@dataclass(frozen=True)
class Projection:
    """One linear layer of a decoder block.

    Attributes:
        name: path relative to the block, e.g. ``"self_attn.q_proj"``.
        act: index of the activation it reads (0..3, docs/quantizer.md §2); projections with the
            same
            index share one input and therefore one Hessian.
    """

    name: str
    act: int

    @property
    def short(self) -> str:
        """The last path component (``"q_proj"``)."""
        return self.name.rsplit(".", 1)[-1]


_LLAMA_PROJECTIONS = (
    Projection("self_attn.q_proj", ACT_ATTN_IN),
    Projection("self_attn.k_proj", ACT_ATTN_IN),
    Projection("self_attn.v_proj", ACT_ATTN_IN),
    Projection("self_attn.o_proj", ACT_ATTN_OUT),
    Projection("mlp.gate_proj", ACT_MLP_IN),
    Projection("mlp.up_proj", ACT_MLP_IN),
    Projection("mlp.down_proj", ACT_MLP_PRODUCT),
)


@dataclass(frozen=True)
class ArchSpec:
    """Facts about one decoder-only architecture family as laid out by transformers.

    Attributes:
        name: family name (``"llama"``, ``"qwen2"``, ...).
        model_types: ``config.model_type`` values that map to this family.
        gguf_names: ``general.architecture`` values of GGUF files of this family.
        layers_path: dotted path from the CausalLM module to the ``ModuleList`` of blocks.
        projections: the seven projections of a block, in quantization order.
        block_norms: the two RMSNorm modules of a block (before attention, before MLP).
        extra_norms: further per-block norms (Qwen3's per-head ``q_norm``/``k_norm``).
        final_norm_path: the norm after the last block.
        embed_path: the input embedding.
        head_path: the output projection (``lm_head``).
        qkv_bias: whether q/k/v carry a bias (Qwen2).
    """

    name: str
    model_types: tuple[str, ...]
    gguf_names: tuple[str, ...]
    layers_path: str = "model.layers"
    projections: tuple[Projection, ...] = _LLAMA_PROJECTIONS
    block_norms: tuple[str, str] = ("input_layernorm", "post_attention_layernorm")
    extra_norms: tuple[str, ...] = ()
    final_norm_path: str = "model.norm"
    embed_path: str = "model.embed_tokens"
    head_path: str = "lm_head"
    qkv_bias: bool = False

    def groups(self) -> dict[int, tuple[str, ...]]:
        """Projection names by shared activation index.

        ``{0: (q, k, v), 1: (o,), 2: (gate, up), 3: (down,)}`` for every supported family.
        """
        out: dict[int, list[str]] = {}
        for proj in self.projections:
            out.setdefault(proj.act, []).append(proj.name)
        return {act: tuple(names) for act, names in sorted(out.items())}

    def layers(self, model: Any) -> Any:
        """The ``ModuleList`` of decoder blocks of ``model`` (a ``*ForCausalLM``)."""
        return _get_path(model, self.layers_path, self.name)

    def block_linears(self, block: Any) -> dict[str, Any]:
        """The seven projection modules of one block, keyed by :attr:`Projection.name`."""
        return {p.name: _get_path(block, p.name, self.name) for p in self.projections}

    def iter_linears(self, model: Any) -> Iterator[tuple[int, Projection, Any, str]]:
        """Yield ``(block index, projection, module, qualified name)`` for each block projection."""
        for index, block in enumerate(self.layers(model)):
            for proj in self.projections:
                module = _get_path(block, proj.name, self.name)
                yield index, proj, module, f"{self.layers_path}.{index}.{proj.name}"

    def embedding(self, model: Any) -> Any:
        """The input embedding module."""
        return _get_path(model, self.embed_path, self.name)

    def head(self, model: Any) -> Any:
        """The output head module (``lm_head``)."""
        return _get_path(model, self.head_path, self.name)

    def tied_embeddings(self, model: Any) -> bool:
        """Whether the head shares its weight tensor with the input embedding.

        Checked on the live tensors (same storage), not only on ``config.tie_word_embeddings``: a
        GGUF that ships a separate ``output.weight`` loads untied even when the original was tied.
        """
        head_w = self.head(model).weight
        emb_w = self.embedding(model).weight
        return bool(head_w is emb_w or head_w.data_ptr() == emb_w.data_ptr())


ARCHITECTURES: dict[str, ArchSpec] = {
    spec.name: spec
    for spec in (
        ArchSpec("llama", model_types=("llama",), gguf_names=("llama",)),
        ArchSpec("mistral", model_types=("mistral",), gguf_names=()),
        ArchSpec("qwen2", model_types=("qwen2",), gguf_names=("qwen2",), qkv_bias=True),
        ArchSpec(
            "qwen3",
            model_types=("qwen3",),
            gguf_names=("qwen3",),
            extra_norms=("self_attn.q_norm", "self_attn.k_norm"),
        ),
    )
}


def supported_names() -> list[str]:
    """Names of the supported families, sorted."""
    return sorted(ARCHITECTURES)


def arch_for_model_type(model_type: str) -> ArchSpec:
    """The family of a transformers ``config.model_type``.

    Raises:
        UnsupportedArchitecture: the model type is not one of the supported families.
    """
    for spec in ARCHITECTURES.values():
        if model_type in spec.model_types:
            return spec
    raise UnsupportedArchitecture(
        f"model_type {model_type!r} is not supported; supported families: "
        f"{', '.join(supported_names())}"
    )


def arch_for_gguf(architecture: str) -> ArchSpec:
    """The family of a GGUF ``general.architecture`` string (``"llama"``, ``"qwen2"``, ``"qwen3"``).

    Raises:
        UnsupportedArchitecture: no supported family reads this GGUF architecture.
    """
    for spec in ARCHITECTURES.values():
        if architecture in spec.gguf_names:
            return spec
    known = sorted(n for s in ARCHITECTURES.values() for n in s.gguf_names)
    raise UnsupportedArchitecture(
        f"GGUF architecture {architecture!r} is not supported; supported GGUF architectures: "
        f"{', '.join(known)}"
    )


def arch_of(model_or_config: Any) -> ArchSpec:
    """The family of a transformers model or config (via ``config.model_type``).

    Raises:
        UnsupportedArchitecture: unknown family, or the object carries no ``model_type``.
    """
    config = getattr(model_or_config, "config", model_or_config)
    model_type = getattr(config, "model_type", None)
    if not isinstance(model_type, str):
        raise UnsupportedArchitecture(
            f"{type(model_or_config).__name__} has no config.model_type; expected a transformers "
            f"causal LM of one of: {', '.join(supported_names())}"
        )
    return arch_for_model_type(model_type)


def _get_path(root: Any, path: str, family: str) -> Any:
    obj = root
    for part in path.split("."):
        nxt = getattr(obj, part, None)
        if nxt is None:
            raise UnsupportedArchitecture(
                f"{type(root).__name__} has no submodule {path!r} (missing {part!r}); it does not "
                f"follow the {family} layout leechq expects"
            )
        obj = nxt
    return obj
