"""Quantized models of real shapes with random codes, for benchmarks and tests (no download).

Every 48-bit Tetra word is legal (docs/kernels.md: bits 0–46 are a bijection onto
2^47 lattice points), so uniformly random labels and gain bits make a valid Tetra matrix that
streams and decodes exactly like a trained one. Scales are chosen so each weight has variance about
``1/d_in`` (the block norm is ``c_g·σ_row``), keeping activations of a deep random model finite in
fp16.

:func:`random_quantized_model` builds the serving :class:`~leechq.serve.model.Transformer` with
:class:`~leechq.nn.linear.LeechqLinear` projections (one rotation per block and activation, shared
by q/k/v and by gate/up as in the quantizer's seeding), optionally int4 ``v_proj`` (the published
recipe, docs/kernels.md), and a dense embedding/head. Shapes of the benchmark models
are in :data:`SHAPES`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from leechq.codebooks.base import BLOCK
from leechq.errors import InvalidInput, KernelUnavailable
from leechq.formats.quantized_weight import Int4Weight, QuantizedWeight
from leechq.formats.rotation import RotationTables, generate_rotation, rotation_seed
from leechq.nn.group import LeechqGroup
from leechq.serve.build import TiedHead, dense_linear, finish_model
from leechq.serve.model import Block, ModelArgs, Transformer

LABEL_BITS = 47
CENTROIDS = (0.85, 1.15)
"""Gain levels (relative to σ_row) of the random matrices: two, ascending, as with one gain bit."""

SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-8b": dict(
        model_type="qwen3",
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        max_position_embeddings=40960,
        tie_word_embeddings=False,
    ),
    "qwen3-14b": dict(
        model_type="qwen3",
        vocab_size=151936,
        hidden_size=5120,
        intermediate_size=17408,
        num_hidden_layers=40,
        num_attention_heads=40,
        num_key_value_heads=8,
        head_dim=128,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        max_position_embeddings=40960,
        tie_word_embeddings=False,
    ),
    # A tiny one for tests and dry runs.
    "qwen3-tiny": dict(
        model_type="qwen3",
        vocab_size=512,
        hidden_size=96,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    ),
    # A small model of Qwen3's structure for correctness gates (the reference path is CPU-bound).
    "qwen3-gate": dict(
        model_type="qwen3",
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=128,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        max_position_embeddings=40960,
        tie_word_embeddings=False,
    ),
}


def model_args(shape: str | dict[str, Any]) -> ModelArgs:
    """:class:`ModelArgs` of a named shape in :data:`SHAPES` (or of an HF config dict)."""
    if isinstance(shape, str):
        if shape not in SHAPES:
            raise InvalidInput(f"unknown model shape {shape!r}; choices: {sorted(SHAPES)}")
        shape = SHAPES[shape]
    return ModelArgs.from_hf_config(shape)


def random_tetra(
    d_out: int, d_in: int, generator: torch.Generator, rotation: RotationTables | None = None
) -> QuantizedWeight:
    """A Tetra matrix with uniformly random labels and gain bits.

    Args:
        d_out, d_in: shape (``d_in >= 24``).
        generator: CPU generator (determinism).
        rotation: the input rotation tables (width ``d_in``) or None.

    Returns:
        A :class:`QuantizedWeight` whose weights have variance about ``1/d_in``.
    """
    nb, tail = d_in // BLOCK, d_in % BLOCK
    labels = torch.randint(0, 1 << LABEL_BITS, (d_out, nb), generator=generator, dtype=torch.int64)
    gains = torch.randint(0, 2, (d_out, nb), generator=generator, dtype=torch.uint8)
    scale = math.sqrt(BLOCK / d_in)  # block norm c_g·σ ≈ sqrt(24/d_in) → per-weight variance 1/d_in
    row_scales = torch.full((d_out,), scale, dtype=torch.float64)
    row_scales *= 1 + 0.1 * torch.rand(d_out, generator=generator, dtype=torch.float64)
    tail_w = torch.randn(d_out, tail, generator=generator) * d_in**-0.5
    return QuantizedWeight(
        codebook="tetra",
        d_out=d_out,
        d_in=d_in,
        labels=labels,
        gains=gains,
        row_scales=row_scales,
        centroids=torch.tensor(CENTROIDS, dtype=torch.float64),
        tail=tail_w.float(),
        rotation=rotation,
    )


def random_ball(
    d_out: int, d_in: int, generator: torch.Generator, rotation: RotationTables | None = None
) -> QuantizedWeight:
    """A ball-codebook matrix (Λ24(12), the ``planes14`` layout) with uniformly random labels
    (any of the ball's points, the origin included) and gain bits; shapes, scales and tail as
    :func:`random_tetra`."""
    from leechq.lattice.classes import ball_size

    rec = random_tetra(d_out, d_in, generator, rotation)
    labels = torch.randint(0, ball_size(12) + 1, rec.labels.shape, generator=generator,
                           dtype=torch.int64)
    return QuantizedWeight(
        codebook="ball", d_out=d_out, d_in=d_in, labels=labels, gains=rec.gains,
        row_scales=rec.row_scales, centroids=rec.centroids, tail=rec.tail, rotation=rotation,
    )


def random_int4(d_out: int, d_in: int, generator: torch.Generator, group: int = 128) -> Int4Weight:
    """An int4 g128 matrix with random codes; weights roughly uniform with variance about
    ``1/d_in``."""
    q = torch.randint(0, 256, (d_out, d_in // 2), generator=generator, dtype=torch.uint8)
    groups = -(-d_in // group)
    step = math.sqrt(12.0 / d_in) / 15.0  # 16 levels spanning ±sqrt(3/d_in)
    scales = torch.full((d_out, groups), step, dtype=torch.float16)
    biases = torch.full((d_out, groups), -7.5 * step, dtype=torch.float16)
    return Int4Weight(d_out=d_out, d_in=d_in, qweight=q, scales=scales, biases=biases, group=group)


def _leechq_linear(record: QuantizedWeight | Int4Weight) -> nn.Module:
    from leechq.nn.linear import LeechqLinear

    return LeechqLinear.from_record(record)


def random_quantized_model(
    args: ModelArgs,
    device: torch.device | str,
    dtype: torch.dtype = torch.float16,
    seed: int = 0,
    int4_v: bool = False,
    prefer: str = "auto",
    rotate: bool = True,
    head_kind: str = "dense",
    portable: bool = False,
    direct: bool = False,
    codebook: str = "tetra",
    layout: str | None = None,
) -> Transformer:
    """A serving model of ``args``' shape whose projections are random Tetra (or ball) matrices.

    Args:
        args: the shape.
        device: where the model runs (the fused kernels need CUDA).
        dtype: activation dtype.
        seed: makes the codes (and the dense embedding/head/norms) reproducible.
        int4_v: v_proj as int4 g128 instead of Tetra (the published recipe).
        prefer: "fused" (lattice groups as fused runs of :class:`~leechq.nn.group.LeechqGroup`,
            error if no kernel), "auto" (fused where possible) or "reference" (``LeechqLinear``
            dense path).
        rotate: give every lattice matrix its (block, activation) rotation.
        head_kind: "dense" (fp16 head, or tied) or "int4" (a random int4 g128 head).
        portable: draw the dense embedding/head on the CPU so the same seed gives the same model on
            every device (slower for big vocabularies).
        direct: draw the packed ``tetra48`` words (``planes14`` records for ball) on the device
            (no canonical records, no host packing; seconds instead of a minute for a 14B shape).
            Needs the fused kernels; the codes differ from the canonical path's for the same seed.
        codebook: "tetra" or "ball" (the lattice matrices' codebook).
        layout: with ``direct`` and Tetra, the layout the groups' words are drawn into
            ("tetra48", or "tetra64": ``formats.layouts.tetra64.Tetra64Weight`` records); None: as
            a served model built from records (``nn.group.serving_layout``).

    Returns:
        The :class:`Transformer` (eval mode) on ``device``.
    """
    if codebook not in ("tetra", "ball"):
        raise InvalidInput(f"codebook must be 'tetra' or 'ball', got {codebook!r}")
    if layout is not None and (not direct or codebook != "tetra"
                               or layout not in ("tetra48", "tetra64")):
        raise InvalidInput(f"layout {layout!r} is for direct Tetra models only "
                           "('tetra48' or 'tetra64')")
    g = torch.Generator().manual_seed(seed)
    a = args
    rots: dict[tuple[int, int], RotationTables] = {}
    draw = random_tetra if codebook == "tetra" else random_ball

    def rot(block: int, act: int, n: int) -> RotationTables | None:
        if not rotate:
            return None
        key = (block, act)
        if key not in rots:
            rots[key] = generate_rotation(n, rotation_seed(block, act))
        return rots[key]

    def tetra(d_out: int, d_in: int, block: int, act: int) -> Any:
        if direct:
            return _DirectLattice(d_out, d_in, rot(block, act, d_in), codebook)
        return draw(d_out, d_in, g, rot(block, act, d_in))

    def group(records: list[Any], index: int) -> nn.Module:
        if direct:
            return _direct_group(records, device, dtype, seed * 1_000_003 + index, layout)
        return LeechqGroup.from_records(records, device, dtype, prefer)

    blocks = []
    for i in range(a.n_layers):
        v = random_int4(a.kv_size, a.dim, g) if int4_v else tetra(a.kv_size, a.dim, i, 0)
        qkv = [tetra(a.q_size, a.dim, i, 0), tetra(a.kv_size, a.dim, i, 0), v]
        o = [tetra(a.dim, a.q_size, i, 1)]
        gate_up = [tetra(a.intermediate_size, a.dim, i, 2) for _ in range(2)]
        down = [tetra(a.dim, a.intermediate_size, i, 3)]
        made = [group(recs, 4 * i + j) for j, recs in enumerate((qkv, o, gate_up, down))]
        blocks.append(Block(a, wqkv=made[0], wo=made[1], w13=made[2], w2=made[3]))
    # Dense parts: drawn on the CPU when `portable` (identical on every device: reference twins),
    # else on the device (fast for large vocabularies).
    gen_dev = "cpu" if portable else device
    dg = torch.Generator(device=gen_dev).manual_seed(seed + 1)
    embed = nn.Embedding(a.vocab_size, a.dim, device="meta")
    w = torch.randn(a.vocab_size, a.dim, generator=dg, device=gen_dev, dtype=torch.float32)
    embed.weight = nn.Parameter(w.to(device, dtype), requires_grad=False)
    del w
    head: nn.Module
    if head_kind == "int4":
        head = _leechq_linear(random_int4(a.vocab_size, a.dim, g))
        head.finalize(device, dtype, prefer=prefer)  # type: ignore[operator]
    elif head_kind != "dense":
        raise InvalidInput(f"head_kind must be 'dense' or 'int4', got {head_kind!r}")
    elif a.tie_word_embeddings:
        head = TiedHead(embed)
    else:
        hw = torch.randn(a.vocab_size, a.dim, generator=dg, device=gen_dev) * a.dim**-0.5
        head = dense_linear([hw], [None], dtype, device)
    return finish_model(Transformer(a, embed, blocks, head), dtype, device)


class _DirectLattice:
    """A lattice matrix still to be drawn on the device (``direct=True``): shape, rotation and
    codebook ("tetra": ``tetra48`` words; "ball": ``planes14`` records)."""

    def __init__(self, d_out: int, d_in: int, rotation: RotationTables | None,
                 codebook: str = "tetra") -> None:
        self.d_out, self.d_in, self.rotation, self.codebook = d_out, d_in, rotation, codebook


def _direct_group(
    records: list[Any], device: torch.device | str, dtype: torch.dtype, seed: int,
    layout: str | None = None,
) -> nn.Module:
    """Device-drawn lattice matrices (runs) and host-drawn int4 ones, grouped as
    :meth:`LeechqGroup.from_records` would group them, with weights scaled to variance about
    ``1/d_in`` (``layout``: the Tetra runs' layout, "tetra48" or "tetra64"; None: the served
    default)."""
    from leechq.formats import layouts
    from leechq.formats.layouts import planes14, tetra48
    from leechq.nn.group import (
        PackedRun,
        assemble,
        fused_kernels_available,
        layout_for,
        serving_layout,
    )

    device = torch.device(device)
    segments: list[Any] = []
    run: list[_DirectLattice] = []

    def flush() -> None:
        if not run:
            return
        d_in, rot = run[0].d_in, run[0].rotation
        name = layout_for(run[0].codebook)
        draw = tetra48.random_tetra48 if name == "tetra48" else planes14.random_planes14
        why = fused_kernels_available(
            sum(r.d_out for r in run), d_in, 0 if rot is None else rot.odd, device, name
        )
        if why is not None:
            raise KernelUnavailable(why)
        packs = []
        for j, r in enumerate(run):
            w = draw(r.d_out, d_in, seed=seed * 16 + j, device=device)
            # both draw σ in [0.5, 1.5) and a unit tail: rescale to variance ~1/d_in.
            w.row_scales.mul_(math.sqrt(BLOCK / d_in))
            w.tail.mul_(d_in**-0.5)
            packs.append(w)
        cat = layouts.get(name).concat_rows(packs)
        if name == "tetra48" and layout is None:
            cat = serving_layout(cat)
        elif name == "tetra48" and layout == "tetra64":
            from leechq.formats.layouts.tetra64 import to_tetra64

            cat = to_tetra64(cat)
        segments.append(PackedRun((cat,), rot, None, len(run)))
        run.clear()

    for r in records:
        if isinstance(r, _DirectLattice):
            if run and (run[0].d_in != r.d_in or run[0].rotation is not r.rotation
                        or run[0].codebook != r.codebook):
                flush()
            run.append(r)
        else:
            flush()
            m = _leechq_linear(r)
            m.finalize(device, dtype, prefer="fused")  # type: ignore[operator]
            segments.append(m)
    flush()
    return assemble(segments)
