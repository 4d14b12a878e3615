"""Test helpers: random canonical records, tiny random Llama/Qwen2/Qwen3 models, a tiny tokenizer
and small artifacts built from them — no download, seconds on a CPU.

Records here are *valid* but not *quantized* (random labels, realistic row scales): they exercise
every code path of loading and serving (rotation, tail, int4, biases, tied heads) exactly, which is
what the loader and module tests need; quantization quality is tested elsewhere.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from leechq.codebooks import BLOCK
from leechq.formats.quantized_weight import Int4Weight, QuantizedWeight
from leechq.formats.rotation import generate_rotation, rotation_seed

LABEL_LIMIT = {"tetra": 1 << 47, "ball": 1 << 40}

ARCHS = ("llama", "qwen2", "qwen3")


def have_codebook(name: str) -> bool:
    from leechq.codebooks import names

    return name in names()


def lattice_record(
    codebook: str,
    d_out: int,
    d_in: int,
    *,
    rotate: bool = True,
    gain_bits: int = 1,
    seed: int = 0,
    rotation_seed_value: int | None = None,
    weight: torch.Tensor | None = None,
) -> QuantizedWeight:
    """A random valid lattice record [d_out, d_in] (row scales from ``weight`` when given)."""
    g = torch.Generator().manual_seed(seed)
    nb, tail = d_in // BLOCK, d_in % BLOCK
    labels = torch.randint(0, LABEL_LIMIT[codebook], (d_out, nb), generator=g, dtype=torch.int64)
    n_c = 2**gain_bits
    gains = torch.randint(0, n_c, (d_out, nb), generator=g).to(torch.uint8)
    if weight is not None:
        w = weight.detach().to(torch.float64)
        row_scales = torch.sqrt((w * w).sum(dim=1) / max(1, nb))
    else:
        row_scales = torch.rand(d_out, generator=g, dtype=torch.float64) + 0.5
    centroids = torch.sort(torch.rand(n_c, generator=g, dtype=torch.float64) * 0.8 + 0.6).values
    tail_t = (torch.randn(d_out, tail, generator=g) * 0.05).to(torch.float32)
    rot = None
    if rotate:
        rot = generate_rotation(d_in, seed if rotation_seed_value is None else rotation_seed_value)
    return QuantizedWeight(
        codebook=codebook,
        d_out=d_out,
        d_in=d_in,
        labels=labels,
        gains=gains,
        row_scales=row_scales,
        centroids=centroids,
        tail=tail_t,
        rotation=rot,
    )


def int4_record(
    d_out: int, d_in: int, seed: int = 0, weight: torch.Tensor | None = None
) -> Int4Weight:
    """A round-to-nearest int4 g128 record of ``weight`` (random when None)."""
    if weight is None:
        weight = torch.randn(d_out, d_in, generator=torch.Generator().manual_seed(seed)) * 0.05
    return Int4Weight.quantize(weight.detach().to(torch.float32), group=128)


def tiny_config(arch: str, vocab_size: int = 96) -> Any:
    """A tiny config with ragged widths (tails of 8 columns) and grouped-query attention."""
    import transformers

    common = dict(
        vocab_size=vocab_size,
        hidden_size=56,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    if arch == "llama":
        return transformers.LlamaConfig(**common)
    if arch == "qwen2":
        return transformers.Qwen2Config(**common)  # q/k/v biases
    if arch == "qwen3":
        common["tie_word_embeddings"] = False
        return transformers.Qwen3Config(head_dim=16, **common)
    raise ValueError(arch)


def tiny_model(arch: str, seed: int = 0) -> Any:
    """A randomly initialized dense causal LM of :func:`tiny_config` (float32, eval mode)."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(arch), dtype=torch.float32)
    with torch.no_grad():  # non-trivial norms and biases so that loading mistakes show
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.05 * torch.randn_like(p))
    return model.eval()


WORDS = [
    "user",
    "assistant",
    "system",
    "the",
    "a",
    "of",
    "to",
    "and",
    "in",
    "is",
    "it",
    "you",
    "that",
    "was",
    "for",
    "on",
    "are",
    "with",
    "as",
    "I",
    "his",
    "they",
    "be",
    "at",
    "one",
    "have",
    "this",
    "from",
    "or",
    "had",
    "by",
    "hot",
    "word",
    "but",
    "what",
    "some",
    "we",
    "can",
    "out",
    "other",
    "were",
    "all",
    "there",
    "when",
    "up",
    "use",
    "your",
    "how",
    "said",
    "an",
    "each",
    "she",
    "which",
    "do",
    "their",
    "time",
    "if",
    "will",
    "way",
    "about",
    "many",
    "then",
    "them",
    "write",
    "would",
    "like",
    "so",
    "these",
    "her",
    "long",
    "make",
    "thing",
    "see",
    "him",
    "two",
    "has",
    "look",
    "more",
    "day",
    "could",
    "go",
    "come",
    "did",
    "number",
    "sound",
    "no",
    "most",
    "people",
    "my",
    "over",
    "know",
    "water",
    "than",
]


def tiny_tokenizer(chat_template: bool = True) -> Any:
    """A word-level fast tokenizer over ≤ 96 ids ([PAD]=0, [BOS]=1, [EOS]=2, [UNK]=3)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[BOS]", "[EOS]", "[UNK]"]
    vocab = {t: i for i, t in enumerate(specials + [w for w in dict.fromkeys(WORDS)][:92])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="[BOS]",
        eos_token="[EOS]",
        unk_token="[UNK]",
        pad_token="[PAD]",
    )
    if chat_template:
        fast.chat_template = (
            "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}assistant {% endif %}"
        )
    return fast


def quantize_randomly(
    model: Any,
    codebook: str = "tetra",
    int4: tuple[str, ...] = ("self_attn.v_proj",),
    rotate: bool = True,
    seed: int = 0,
) -> dict[str, Any]:
    """Random records for every projection of ``model`` (q/k/v and gate/up share a rotation).

    Returns:
        module name → record (int4 for the module suffixes in ``int4``).
    """
    from leechq.models.arch import arch_of

    spec = arch_of(model)
    records: dict[str, Any] = {}
    for layer, proj, lin, name in spec.iter_linears(model):
        w = lin.weight.detach()
        if any(proj.name.endswith(s) for s in int4):
            records[name] = int4_record(w.shape[0], w.shape[1], weight=w)
        else:
            records[name] = lattice_record(
                codebook,
                w.shape[0],
                w.shape[1],
                rotate=rotate,
                seed=seed + len(records),
                rotation_seed_value=rotation_seed(layer, proj.act),
                weight=w,
            )
    return records


def make_artifact(
    tmp: Path,
    arch: str = "llama",
    codebook: str = "tetra",
    int4: tuple[str, ...] = ("self_attn.v_proj",),
    tokenizer: bool = True,
    seed: int = 0,
) -> tuple[Path, Any]:
    """A tiny artifact: random records for every projection, raw tensors of a random model.

    Returns:
        ``(directory, dense model with the same raw tensors)``.
    """
    from leechq.config import QuantConfig
    from leechq.formats.artifact import write_artifact
    from leechq.models.save import raw_tensors

    model = tiny_model(arch, seed=seed)
    records = quantize_randomly(model, codebook=codebook, int4=int4, seed=seed)
    raw, tied = raw_tensors(model, {})
    raw = {k: v for k, v in raw.items() if not (k.endswith(".weight") and k[:-7] in records)}
    cfg = QuantConfig(codebook=codebook, int4_modules=tuple(int4))
    out = tmp / f"{arch}-{codebook}"
    base = model.config.to_dict()
    write_artifact(
        out,
        base_config=base,
        quant_config=cfg,
        records=records,
        raw=raw,
        tied=tied,
        tokenizer=tiny_tokenizer() if tokenizer else None,
        provenance={"source": f"tiny random {arch}"},
    )
    return out, model


def make_tetra_dir(tmp: Path, arch: str = "qwen3") -> tuple[Path, Path]:
    """A tiny artifact in what the published Tetra format carries (random Tetra records, an int4
    v_proj, a 4-bit embedding table, bf16 norms, the tiny tokenizer) and the Tetra checkpoint
    leechq's published-format writer makes of it.

    Returns:
        ``(artifact directory, Tetra directory)``.
    """
    from leechq.config import QuantConfig
    from leechq.formats.artifact import GroupAffine, write_artifact
    from leechq.formats.tetra_write import artifact_to_tetra_dir
    from leechq.models.save import raw_tensors

    model = tiny_model(arch)
    records = quantize_randomly(model, codebook="tetra")
    raw, tied = raw_tensors(model, {})
    raw = {k: v.to(torch.bfloat16) for k, v in raw.items() if k[:-7] not in records}
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        if name in raw:
            raw[name] = GroupAffine.quantize(raw[name].float(), 4, 64)
    art = tmp / f"art-{arch}"
    write_artifact(
        art,
        base_config=model.config.to_dict(),
        quant_config=QuantConfig(codebook="tetra", int4_modules=("self_attn.v_proj",)),
        records=records,
        raw=raw,
        tied=tied,
        tokenizer=tiny_tokenizer(),
    )
    return art, Path(artifact_to_tetra_dir(art, tmp / f"tetra-{arch}"))


def ids(n: int = 12, batch: int = 2, seed: int = 0, vocab: int = 96) -> torch.Tensor:
    """Random token ids [batch, n] (avoiding the special ids 0..3)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, vocab, (batch, n), generator=g)


def calib_windows(vocab: int = 96) -> torch.Tensor:
    """Four calibration windows of 16 token ids (int64 [4, 16]) for the tiny models."""
    return torch.randint(3, vocab, (4, 16), generator=torch.Generator().manual_seed(0))


def tiny_quant_config(**fields: Any) -> Any:
    """A :class:`~leechq.config.QuantConfig` that quantizes a tiny model for real on the CPU over
    :func:`calib_windows` (Tetra, two windows a batch), with ``fields`` set."""
    from leechq.config import QuantConfig

    return QuantConfig(**{"codebook": "tetra", "calib_windows": 4, "calib_window_len": 16,
                          "calib_batch": 2, "device": "cpu", **fields})


def quantize_tiny(out: Path, config: Any) -> tuple[Path, Any]:
    """Quantize a fresh untied tiny Qwen3 for real over :func:`calib_windows` with ``config`` (a
    :class:`~leechq.config.QuantConfig`) into the artifact ``out``; return ``(out, model)``, the
    model holding its decoded weights in place."""
    from leechq.models.quantize import quantize_model

    model = tiny_model("qwen3")
    out = quantize_model(model, tiny_tokenizer(), calib_windows(), config, out, progress=False)
    return out, model


def assert_saves_back(out: Path, tmp: Path) -> None:
    """``leechq.models.save`` of the model ``leechq.load`` makes of the artifact ``out`` writes its
    tensors back: the same names, dtypes and values (into ``tmp / "again"``)."""
    from safetensors.torch import load_file

    from leechq.models.load import load
    from leechq.models.save import save

    model, tok = load(out, device="cpu")
    again = save(model, tmp / "again", tokenizer=tok)
    fa, fb = load_file(str(out / "model.safetensors")), load_file(str(again / "model.safetensors"))
    assert set(fa) == set(fb)
    for k in fa:
        assert fa[k].dtype == fb[k].dtype and torch.equal(fa[k], fb[k]), k


def max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a-b| / max |b| (float64)."""
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    return float((a64 - b64).abs().max() / b64.abs().max().clamp_min(math.ulp(1.0)))


# --------------------------------------------------------------------------------------------------
# Tiny random models of every supported family (the architecture-agnostic quantizer's tests)

FAMILIES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma2",
    "gemma3",
    "phi3",
    "olmo2",
    "qwen3_moe",
    "mixtral",
    "gemma",
    "granite",
    "smollm3",
    "helium",
    "olmo",
    "cohere",
    "glm",
    "starcoder2",
    "qwen2_moe",
    "olmoe",
    "phimoe",
)
"""Families :mod:`leechq.models.arch` supports, one tiny model each (:func:`family_config`)."""

EXPERTS = 4
"""Experts per sparse MLP of the tiny mixture-of-experts models (top 2)."""


def family_linears(family: str) -> int:
    """Quantized linears per block of :func:`family_model` (2 per expert for split experts)."""
    moe = {"qwen3_moe": 4, "mixtral": 4, "olmoe": 4, "phimoe": 4, "qwen2_moe": 4 + 3}
    fused = {"phi3": 4, "glm": 6, "starcoder2": 6}
    if family in moe:
        return moe[family] + 2 * EXPERTS
    return fused.get(family, 7)


def family_config(family: str, vocab_size: int = 96) -> Any:
    """A tiny config of ``family``: hidden 48, 2 layers, 4 heads of 12 (2 key/value heads), MLP
    width 96 (experts: 4 of width 48, top 2), widths that are multiples of 24 except where the
    family's own shapes make a tail (Phi-3's fused q/k/v of 96 rows is fine; Gemma's head 12 too).
    """
    import transformers

    common: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    if family == "llama":
        return transformers.LlamaConfig(**common)
    if family == "mistral":
        return transformers.MistralConfig(sliding_window=None, **common)
    if family == "qwen2":
        return transformers.Qwen2Config(**common)
    if family == "qwen3":
        return transformers.Qwen3Config(head_dim=12, **common)
    if family == "gemma2":
        common["tie_word_embeddings"] = True
        return transformers.Gemma2Config(head_dim=12, sliding_window=8, **common)
    if family == "gemma3":
        common["tie_word_embeddings"] = True
        return transformers.Gemma3TextConfig(
            head_dim=12,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"],
            **common,
        )
    if family == "phi3":
        return transformers.Phi3Config(**common)
    if family == "olmo2":
        return transformers.Olmo2Config(**common)
    if family == "qwen3_moe":
        return transformers.Qwen3MoeConfig(
            head_dim=12, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48, **common
        )
    if family == "mixtral":
        common["intermediate_size"] = 48
        return transformers.MixtralConfig(num_local_experts=4, num_experts_per_tok=2, **common)
    simple = {
        "gemma": "GemmaConfig",
        "granite": "GraniteConfig",
        "smollm3": "SmolLM3Config",
        "helium": "HeliumConfig",
        "olmo": "OlmoConfig",
        "cohere": "CohereConfig",
        "glm": "GlmConfig",
        "starcoder2": "Starcoder2Config",
    }
    if family in simple:
        extra = {"head_dim": 12} if family in ("gemma", "glm", "helium") else {}
        return getattr(transformers, simple[family])(**extra, **common)
    if family == "qwen2_moe":
        return transformers.Qwen2MoeConfig(
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=48,
            shared_expert_intermediate_size=48,
            **common,
        )
    if family == "olmoe":
        return transformers.OlmoeConfig(num_experts=4, num_experts_per_tok=2, **common)
    if family == "phimoe":
        return transformers.PhimoeConfig(num_local_experts=4, num_experts_per_tok=2, **common)
    raise ValueError(family)


def family_model(family: str, seed: int = 0) -> Any:
    """A randomly initialized dense causal LM of :func:`family_config` (float32, eval mode)."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(
        family_config(family), dtype=torch.float32
    )
    with torch.no_grad():  # non-trivial norms so that loading mistakes show
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                base = 0.0 if family.startswith("gemma") else 1.0  # Gemma scales by 1 + weight
                if family in ("olmo", "cohere", "starcoder2", "phimoe"):  # LayerNorm weights too
                    base = 1.0
                p.copy_(base + 0.1 * torch.randn_like(p))
    return model.eval()


def save_family_model(tmp: Path, family: str, seed: int = 0) -> tuple[Path, Any]:
    """:func:`family_model` saved with ``save_pretrained`` (plus :func:`tiny_tokenizer`).

    Returns:
        ``(directory, the model)``.
    """
    model = family_model(family, seed=seed)
    out = tmp / f"dense-{family}"
    model.save_pretrained(str(out))
    tiny_tokenizer().save_pretrained(str(out))
    return out, model
