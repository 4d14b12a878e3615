"""Per-architecture facts the quantizer, baselines and evaluation need about a decoder-only model.

Owns, for each supported family, where the decoder blocks live, which ``nn.Linear`` modules of a
block are quantized and which of them read the same activation (one Hessian and one rotation per
shared input), the block and final norms, the embedding and head paths, and whether the head is
tied to the embedding.

The linears of a block are found by walking the block (:meth:`ArchSpec.block_projections`): every
``nn.Linear`` inside it is quantized except the ones the family keeps dense (routers of a mixture
of experts). A small per-family table holds only what differs between families: the projections
whose activation index is fixed (for Llama-shaped blocks, docs/quantizer.md §2's act 0 = attention
input for q/k/v, act 1 = attention output for o, act 2 = MLP input for gate/up, act 3 =
``act(gate)·up`` for down; Phi-3 stores q/k/v and gate/up as one fused matrix each), the names of
sibling linears that share an input (q/k/v, gate/up, Mixtral's w1/w3) and the dense names. Every
linear found beyond the table (experts of a mixture, a shared expert, the dense MLP of a sparse
model's non-sparse layers) gets the next free activation index, siblings that share an input
together. Experts stored as one 3-D parameter are first split into one linear per expert matrix by
:mod:`leechq.models.experts`.

Everything here is a fact about transformers' module tree looked up by ``config.model_type``;
nothing is computed from weights. Policy (which layers a recipe quantizes, lm_head precision)
belongs to the recipe. Unknown families raise :class:`~leechq.errors.UnsupportedArchitecture` with
the list of supported ones.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from leechq.errors import UnsupportedArchitecture

# Activation indices of the Llama-shaped block (one Hessian per index per block).
ACT_ATTN_IN = 0
ACT_ATTN_OUT = 1
ACT_MLP_IN = 2
ACT_MLP_PRODUCT = 3


@dataclass(frozen=True)
class Projection:
    """One linear layer of a decoder block.

    Attributes:
        name: path relative to the block, e.g. ``"self_attn.q_proj"``.
        act: index of the activation it reads; projections with the same index share one input and
            therefore one Hessian and one rotation.
    """

    name: str
    act: int

    @property
    def short(self) -> str:
        """The last path component (``"q_proj"``)."""
        return self.name.rsplit(".", 1)[-1]


_ATTN = (
    Projection("self_attn.q_proj", ACT_ATTN_IN),
    Projection("self_attn.k_proj", ACT_ATTN_IN),
    Projection("self_attn.v_proj", ACT_ATTN_IN),
    Projection("self_attn.o_proj", ACT_ATTN_OUT),
)
_LLAMA_PROJECTIONS = (
    *_ATTN,
    Projection("mlp.gate_proj", ACT_MLP_IN),
    Projection("mlp.up_proj", ACT_MLP_IN),
    Projection("mlp.down_proj", ACT_MLP_PRODUCT),
)
_PHI3_PROJECTIONS = (
    Projection("self_attn.qkv_proj", ACT_ATTN_IN),
    Projection("self_attn.o_proj", ACT_ATTN_OUT),
    Projection("mlp.gate_up_proj", ACT_MLP_IN),
    Projection("mlp.down_proj", ACT_MLP_PRODUCT),
)

SHARED_INPUTS: tuple[tuple[str, ...], ...] = (
    ("q_proj", "k_proj", "v_proj"),
    ("gate_proj", "up_proj"),
    ("w1", "w3"),
)
"""Leaf names of sibling linears (same parent module) that read one activation."""

DENSE_LEAVES: tuple[str, ...] = ("gate", "router", "shared_expert_gate")
"""Leaf names of linears kept dense: mixture-of-experts routers (a ``gate`` linear is a router; the
gated MLP's own projection is ``gate_proj``)."""


@dataclass(frozen=True)
class ArchSpec:
    """Facts about one decoder-only architecture family as laid out by transformers.

    Attributes:
        name: family name (``"llama"``, ``"qwen2"``, ...).
        model_types: ``config.model_type`` values that map to this family.
        gguf_names: ``general.architecture`` values of GGUF files of this family.
        layers_path: dotted path from the CausalLM module to the ``ModuleList`` of blocks.
        projections: the projections every block has, with their fixed activation index, in
            quantization order; further linears are found by the walk.
        block_norms: the two norms of a block (before attention, before MLP; Olmo2 normalizes after
            each sublayer instead).
        extra_norms: further per-block norms (per-head ``q_norm``/``k_norm``, Gemma's sandwich
            norms).
        final_norm_path: the norm after the last block.
        embed_path: the input embedding.
        head_path: the output projection (``lm_head``).
        qkv_bias: whether q/k/v carry a bias (Qwen2).
        moe: whether blocks hold a mixture of experts.
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
    moe: bool = False

    def groups(self) -> dict[int, tuple[str, ...]]:
        """The fixed projections' names by shared activation index.

        ``{0: (q, k, v), 1: (o,), 2: (gate, up), 3: (down,)}`` for Llama-shaped families. A mixture
        of experts has more linears per block: see :meth:`block_groups`.
        """
        return _group(self.projections)

    def block_groups(self, block: Any) -> dict[int, tuple[str, ...]]:
        """Every quantized linear of ``block`` by shared activation index (see
        :meth:`block_projections`)."""
        return _group(self.block_projections(block))

    def layers(self, model: Any) -> Any:
        """The ``ModuleList`` of decoder blocks of ``model`` (a ``*ForCausalLM``)."""
        return _get_path(model, self.layers_path, self.name)

    def block_projections(self, block: Any) -> tuple[Projection, ...]:
        """Every quantized linear of one block, with its activation index, in quantization order.

        The fixed :attr:`projections` first (each must exist), then every other ``nn.Linear`` of the
        block in module order, except the dense ones (:data:`DENSE_LEAVES`); siblings named in
        :data:`SHARED_INPUTS` share an index, any other linear gets an index of its own.

        Raises:
            UnsupportedArchitecture: a fixed projection is missing or is not a linear.
        """
        from torch import nn

        fixed = list(self.projections)
        for p in fixed:
            module = _get_path(block, p.name, self.name)
            if not isinstance(module, nn.Linear):
                raise UnsupportedArchitecture(
                    f"{p.name} of a {self.name} block is a {type(module).__name__}, not an "
                    "nn.Linear"
                )
        known = {p.name for p in fixed}
        next_act = max((p.act for p in fixed), default=-1) + 1
        shared: dict[tuple[str, int], int] = {}
        found: list[Projection] = []
        for name, module in block.named_modules():
            if not isinstance(module, nn.Linear) or name in known:
                continue
            parent, _, leaf = name.rpartition(".")
            if leaf in DENSE_LEAVES:
                continue
            group = next((i for i, g in enumerate(SHARED_INPUTS) if leaf in g), None)
            if group is not None and (parent, group) in shared:
                act = shared[(parent, group)]
            else:
                act = next_act
                next_act += 1
                if group is not None:
                    shared[(parent, group)] = act
            found.append(Projection(name, act))
        return tuple(fixed + found)

    def block_linears(self, block: Any) -> dict[str, Any]:
        """The quantized linear modules of one block, keyed by :attr:`Projection.name`."""
        return {p.name: block.get_submodule(p.name) for p in self.block_projections(block)}

    def iter_linears(self, model: Any) -> Iterator[tuple[int, Projection, Any, str]]:
        """Yield ``(block index, projection, module, qualified name)`` for each block linear."""
        for index, block in enumerate(self.layers(model)):
            for proj in self.block_projections(block):
                module = block.get_submodule(proj.name)
                yield index, proj, module, f"{self.layers_path}.{index}.{proj.name}"

    def embedding(self, model: Any) -> Any:
        """The input embedding module."""
        return _get_path(model, self.embed_path, self.name)

    def head(self, model: Any) -> Any:
        """The output head module (``lm_head``)."""
        return _get_path(model, self.head_path, self.name)

    def final_norm(self, model: Any) -> Any:
        """The norm after the last block, whose output the head reads."""
        return _get_path(model, self.final_norm_path, self.name)

    def tied_embeddings(self, model: Any) -> bool:
        """Whether the head shares its weight tensor with the input embedding.

        Checked on the live tensors (same storage), not only on ``config.tie_word_embeddings``: a
        GGUF that ships a separate ``output.weight`` loads untied even when the original was tied.
        """
        head_w = self.head(model).weight
        emb_w = self.embedding(model).weight
        return bool(head_w is emb_w or head_w.data_ptr() == emb_w.data_ptr())


def _group(projections: tuple[Projection, ...]) -> dict[int, tuple[str, ...]]:
    out: dict[int, list[str]] = {}
    for proj in projections:
        out.setdefault(proj.act, []).append(proj.name)
    return {act: tuple(names) for act, names in sorted(out.items())}


_QK_NORMS = ("self_attn.q_norm", "self_attn.k_norm")
_GEMMA_NORMS = ("pre_feedforward_layernorm", "post_feedforward_layernorm")

ARCHITECTURES: dict[str, ArchSpec] = {
    spec.name: spec
    for spec in (
        ArchSpec("llama", model_types=("llama",), gguf_names=("llama",)),
        ArchSpec("mistral", model_types=("mistral",), gguf_names=("mistral",)),
        ArchSpec("qwen2", model_types=("qwen2",), gguf_names=("qwen2",), qkv_bias=True),
        ArchSpec("qwen3", model_types=("qwen3",), gguf_names=("qwen3",), extra_norms=_QK_NORMS),
        ArchSpec(
            "gemma2", model_types=("gemma2",), gguf_names=("gemma2",), extra_norms=_GEMMA_NORMS
        ),
        ArchSpec(
            "gemma3",
            model_types=("gemma3_text",),
            gguf_names=("gemma3",),
            extra_norms=_QK_NORMS + _GEMMA_NORMS,
        ),
        ArchSpec(
            "phi3", model_types=("phi3",), gguf_names=("phi3",), projections=_PHI3_PROJECTIONS
        ),
        ArchSpec(
            "olmo2",
            model_types=("olmo2",),
            gguf_names=(),
            block_norms=("post_attention_layernorm", "post_feedforward_layernorm"),
            extra_norms=_QK_NORMS,
        ),
        ArchSpec(
            "qwen3_moe",
            model_types=("qwen3_moe",),
            gguf_names=("qwen3moe",),
            projections=_ATTN,
            extra_norms=_QK_NORMS,
            moe=True,
        ),
        ArchSpec("mixtral", model_types=("mixtral",), gguf_names=(), projections=_ATTN, moe=True),
        # Further families the walk handles as they are (each tested like the ten above).
        ArchSpec("gemma", model_types=("gemma",), gguf_names=()),
        ArchSpec("granite", model_types=("granite",), gguf_names=()),
        ArchSpec("smollm3", model_types=("smollm3",), gguf_names=()),
        ArchSpec("helium", model_types=("helium",), gguf_names=()),
        ArchSpec("olmo", model_types=("olmo",), gguf_names=()),
        ArchSpec("cohere", model_types=("cohere",), gguf_names=()),
        ArchSpec(
            "glm",
            model_types=("glm",),
            gguf_names=(),
            projections=(
                *_ATTN,
                Projection("mlp.gate_up_proj", ACT_MLP_IN),
                Projection("mlp.down_proj", ACT_MLP_PRODUCT),
            ),
        ),
        ArchSpec(
            "starcoder2",
            model_types=("starcoder2",),
            gguf_names=("starcoder2",),
            projections=(
                *_ATTN,
                Projection("mlp.c_fc", ACT_MLP_IN),
                Projection("mlp.c_proj", ACT_MLP_PRODUCT),
            ),
        ),
        ArchSpec(
            "qwen2_moe",
            model_types=("qwen2_moe",),
            gguf_names=("qwen2moe",),
            projections=_ATTN,
            qkv_bias=True,
            moe=True,
        ),
        ArchSpec("olmoe", model_types=("olmoe",), gguf_names=(), projections=_ATTN, moe=True),
        ArchSpec("phimoe", model_types=("phimoe",), gguf_names=(), projections=_ATTN, moe=True),
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
