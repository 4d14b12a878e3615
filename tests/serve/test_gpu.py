"""GPU tier of the serving loop: graphs vs eager, compiled vs eager, GPU vs CPU, fused vs reference.

Run on a CUDA machine: ``PYTHONPATH=src python -m pytest tests/serve/test_gpu.py -m gpu -q``.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from leechq.errors import KernelUnavailable
from leechq.serve.build import execution_paths, from_hf_model
from leechq.serve.cache import KVCache
from leechq.serve.generate import Engine
from leechq.serve.model import EAGER, ModelArgs, Pieces
from leechq.serve.random_codes import random_quantized_model
from leechq.serve.sampling import SamplingConfig

from .conftest import tiny_hf_model


@contextlib.contextmanager
def _sync_errors() -> Iterator[None]:
    """A synchronizing CUDA call raises inside the block; the mode is reset whatever happens (and
    torch's note that the mode is a prototype is not an error of the test)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Synchronization debug mode", UserWarning)
        torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")

pytestmark = pytest.mark.gpu

PROMPTS = [[5, 9, 13, 2, 77, 31, 4], [8, 8, 1], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50]]


def _cuda_model(arch: str = "qwen3", dtype: torch.dtype = torch.float16) -> Any:
    pytest.importorskip("transformers")
    return from_hf_model(tiny_hf_model(arch), dtype=dtype, device="cuda")


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma2", "gemma3"])
def test_graph_tokens_equal_eager_tokens(arch: str) -> None:
    model = _cuda_model(arch)
    graph = Engine(model, graphs=True, compile=True).generate_ids(PROMPTS, 48).tokens
    eager = Engine(model, graphs=False, compile=True).generate_ids(PROMPTS, 48).tokens
    assert graph == eager
    assert all(len(t) == 48 for t in graph)


def test_sampled_graph_equals_sampled_eager() -> None:
    model = _cuda_model()
    cfg = SamplingConfig(temperature=0.9, top_k=40, top_p=0.9, repetition_penalty=1.1, seed=7)
    g = Engine(model, graphs=True, compile=True)
    a, b = g.generate_ids(PROMPTS, 40, cfg).tokens, g.generate_ids(PROMPTS, 40, cfg).tokens
    eager = Engine(model, graphs=False, compile=True).generate_ids(PROMPTS, 40, cfg).tokens
    assert a == b == eager


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_compiled_pieces_match_eager_pieces(arch: str) -> None:
    model = _cuda_model(arch)
    tokens = torch.tensor([PROMPTS[2]], device="cuda")
    out = []
    for fns in (EAGER, Pieces.compiled()):
        cache = KVCache(model.args, 1, 64, torch.float16, "cuda")
        slots = torch.arange(tokens.shape[1], device="cuda")
        pad = torch.zeros(1, dtype=torch.int64, device="cuda")
        out.append(model(tokens, slots, pad, cache.k, cache.v, last_only=False, fns=fns))
    err = (out[0] - out[1]).abs().max().item()
    assert err <= 1e-2 * out[0].abs().max().item(), err


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_gpu_greedy_equals_cpu_greedy_float32(arch: str) -> None:
    pytest.importorskip("transformers")
    hf = tiny_hf_model(arch)
    cpu = Engine(from_hf_model(hf)).generate_ids(PROMPTS, 32).tokens
    gpu = Engine(from_hf_model(hf, dtype=torch.float32, device="cuda")).generate_ids(PROMPTS, 32)
    assert gpu.tokens == cpu


@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
@torch.no_grad()
def test_gemma_decode_steps_match_transformers(arch: str) -> None:
    """Prefill of 4 positions, then single-position steps on the GPU in float32 (Gemma-3's sliding
    layers through the split-key kernel with its window, Gemma-2's soft-capped scores through the
    explicit attention) == transformers' one forward over all 14 positions on the CPU, for a
    prompt longer than the window of 5."""
    pytest.importorskip("transformers")
    hf = tiny_hf_model(arch)
    model = from_hf_model(hf, dtype=torch.float32, device="cuda")
    tokens = torch.randint(0, 97, (2, 14), generator=torch.Generator().manual_seed(6))
    want = hf(tokens).logits
    x = tokens.cuda()
    cache = KVCache(model.args, 2, 64, torch.float32, "cuda")
    pad = torch.zeros(2, dtype=torch.int64, device="cuda")
    steps = [model(x[:, :4], torch.arange(4, device="cuda"), pad, cache.k, cache.v,
                   last_only=False)]
    for s in range(4, 14):
        steps.append(model(x[:, s:s + 1], torch.tensor([s], device="cuda"), pad, cache.k, cache.v))
    got = torch.cat(steps, dim=1).cpu()
    err = (got - want).abs().max().item()
    assert err <= 1e-3 * want.abs().max().item(), err


def test_decode_step_never_syncs() -> None:
    model = _cuda_model()
    engine = Engine(model, graphs=False, compile=True)
    cfg = SamplingConfig(temperature=1.0, top_k=10, top_p=0.9, min_p=0.01, repetition_penalty=1.2)
    engine.generate_ids(PROMPTS, 4, cfg)  # compile and allocate outside the checked region
    sess = engine.session(len(PROMPTS), 0)
    step = engine._make_step(sess, cfg.key())
    torch.cuda.synchronize()
    with _sync_errors(), torch.no_grad():
        step()


def _tiny_quantized(prefer: str, device: str, dtype: torch.dtype, codebook: str = "tetra") -> Any:
    args = ModelArgs(
        arch="qwen3",
        vocab_size=512,
        dim=256,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        head_dim=64,
        intermediate_size=512,
        qk_norm=True,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return random_quantized_model(args, device, dtype, seed=3, prefer=prefer, portable=True,
                                      codebook=codebook)


def test_fused_logits_match_reference_logits() -> None:
    try:
        fused = _tiny_quantized("fused", "cuda", torch.float16)
    except KernelUnavailable as exc:
        pytest.skip(f"no fused kernel on this device: {exc}")
    assert execution_paths(fused) == {"fused": 14}
    ref = _tiny_quantized("reference", "cuda", torch.float16)
    tokens = torch.tensor([PROMPTS[0]], device="cuda")
    out = []
    for m in (fused, ref):
        cache = KVCache(m.args, 1, 64, torch.float16, "cuda")
        slots = torch.arange(tokens.shape[1], device="cuda")
        pad = torch.zeros(1, dtype=torch.int64, device="cuda")
        out.append(m(tokens, slots, pad, cache.k, cache.v, last_only=False))
    err = (out[0] - out[1]).abs().max().item()
    assert err <= 2e-2 * out[1].abs().max().item(), err
    g_fused = Engine(fused).generate_ids([PROMPTS[0]], 32).tokens[0]
    with pytest.warns(UserWarning, match="dense reference path"):  # the reference on purpose
        ref_engine = Engine(ref, graphs=False, compile=False)
    g_ref = ref_engine.generate_ids([PROMPTS[0]], 32).tokens[0]
    assert g_fused == g_ref


def test_fused_pre_ops_match_separate_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """The decode step with the norms and the SwiGLU inside the rotation launches (the default)
    against the same model with them as separate pieces (``fuses_pre_ops`` patched off): the fused
    launches are taken (3 per layer at batch 1, and again for 70 rows on the dequantized copy,
    where the rotation writes natural order), and the logits agree to the norm's rounding."""
    from leechq.kernels.triton import ops_rotate

    model = _fused_or_skip()
    calls = []
    for name in ("norm_rotate", "silu_mul_rotate"):
        fn = getattr(ops_rotate, name)
        monkeypatch.setattr(ops_rotate, name,
                            lambda *a, _fn=fn, **k: calls.append(1) or _fn(*a, **k))

    def logits(tokens: torch.Tensor) -> torch.Tensor:
        cache = KVCache(model.args, tokens.shape[0], 96, torch.float16, "cuda")
        slots = torch.arange(tokens.shape[1], device="cuda")
        pad = torch.zeros(tokens.shape[0], dtype=torch.int64, device="cuda")
        return model(tokens, slots, pad, cache.k, cache.v, last_only=False)

    one = torch.tensor([PROMPTS[0][:1]], device="cuda")
    fused = logits(one)
    assert len(calls) == 3 * model.args.n_layers
    prompt = torch.tensor([PROMPTS[0] * 10], device="cuda")[:, :70]  # 70 rows: the dense path
    many = logits(prompt)
    assert len(calls) == 6 * model.args.n_layers
    from leechq.nn.group import LeechqGroup

    monkeypatch.setattr(LeechqGroup, "fuses_pre_ops", lambda self, m_rows: False)
    separate = logits(one)
    many_separate = logits(prompt)
    assert len(calls) == 6 * model.args.n_layers
    err = (many - many_separate).abs().max().item()
    assert err <= 1e-2 * many_separate.abs().max().item(), err
    err = (fused - separate).abs().max().item()
    assert err <= 1e-2 * separate.abs().max().item(), err


@pytest.mark.parametrize(("codebook", "batch"), [("ball", 1), ("ball", 3), ("ball", 6),
                                                ("ball", 22), ("tetra", 4)])
def test_fused_ball_model_matches_reference(codebook: str, batch: int) -> None:
    """A ball-coded model serves through Planes14 groups (one rotation with the norm or SwiGLU
    fused into it, one matvec launch group per projection group): logits against the dense
    reference path, and graph tokens equal to eager tokens. 3 rows run the int8 kernel, the 9
    prompt rows of batch 3 one launch of it with two 8-row chunks of activation records, the 18
    of batch 6 and the 66 of batch 22 the float16 dequantized copy
    (``ops.planes14_matmul_dense``, from ``DENSE_MIN_ROWS`` = 17 rows); the Tetra model's 12
    prompt rows the int8 kernel's two chunks too."""
    from leechq.kernels.triton import ops
    from leechq.nn.group import LeechqGroup

    try:
        fused = _tiny_quantized("fused", "cuda", torch.float16, codebook=codebook)
    except KernelUnavailable as exc:
        pytest.skip(f"no fused kernel on this device: {exc}")
    assert execution_paths(fused) == {"fused": 14}
    assert isinstance(fused.blocks[0].wqkv, LeechqGroup)
    tetra = "tetra64" if ops.t64_serving("cuda") else "tetra48"  # the served Tetra layout
    assert fused.blocks[0].wqkv.layout == ("planes14" if codebook == "ball" else tetra)
    ref = _tiny_quantized("reference", "cuda", torch.float16, codebook=codebook)
    prompts = [PROMPTS[i % 3][: 3 + i] for i in range(batch)]
    tokens = torch.tensor([p[:3] for p in prompts], device="cuda")
    out = []
    for m in (fused, ref):
        cache = KVCache(m.args, batch, 64, torch.float16, "cuda")
        slots = torch.arange(tokens.shape[1], device="cuda")
        pad = torch.zeros(batch, dtype=torch.int64, device="cuda")
        out.append(m(tokens, slots, pad, cache.k, cache.v, last_only=False))
    err = (out[0] - out[1]).abs().max().item()
    assert err <= 2e-2 * out[1].abs().max().item(), err
    graph = Engine(fused, graphs=True, compile=True).generate_ids(prompts, 24).tokens
    eager = Engine(fused, graphs=False, compile=True).generate_ids(prompts, 24).tokens
    assert graph == eager


def _fused_or_skip() -> Any:
    try:
        return _tiny_quantized("fused", "cuda", torch.float16)
    except KernelUnavailable as exc:
        pytest.skip(f"no fused kernel on this device: {exc}")


@pytest.mark.parametrize("batch", [1, 3, 11])
def test_fused_graph_tokens_equal_eager_tokens(batch: int) -> None:
    model = _fused_or_skip()
    prompts = [PROMPTS[i % 3][: 3 + i] for i in range(batch)]
    graph = Engine(model, graphs=True, compile=True).generate_ids(prompts, 40).tokens
    eager = Engine(model, graphs=False, compile=True).generate_ids(prompts, 40).tokens
    assert graph == eager


def test_fused_decode_step_never_syncs() -> None:
    model = _fused_or_skip()
    engine = Engine(model, graphs=False, compile=True)
    engine.generate_ids(PROMPTS, 4)
    sess = engine.session(len(PROMPTS), 0)
    step = engine._make_step(sess, SamplingConfig().key())
    torch.cuda.synchronize()
    with _sync_errors(), torch.no_grad():
        step()


def test_graphs_survive_released_and_replaced_sessions() -> None:
    """Capture after the graphs of an earlier session were freed (release, then a new batch size;
    then a longer sequence that replaces a session): each session owns its graph pool."""
    model = _cuda_model()
    engine = Engine(model, graphs=True, compile=True)
    eager = Engine(model, graphs=False, compile=True)
    first = engine.generate_ids(PROMPTS[:1], 16).tokens
    engine.release()
    torch.cuda.empty_cache()
    assert engine.generate_ids(PROMPTS, 16).tokens == eager.generate_ids(PROMPTS, 16).tokens
    longer = engine.generate_ids(PROMPTS[:1], 96).tokens  # seq_len grows: session replaced
    assert longer == eager.generate_ids(PROMPTS[:1], 96).tokens
    assert longer[0][:16] == first[0]


def test_prefill_graphs_per_bucket_equal_eager_prefill() -> None:
    """Prompt batches of 11, 20 and 40 tokens (with padded rows) prefill through one captured
    graph per bucket width (16, 32, 64), reused by a later prompt of the same bucket; the tokens
    equal an engine that runs the same padded prefill eagerly, and a prompt that no bucket fits in
    the cache runs unpadded."""
    model = _cuda_model()
    graph = Engine(model, graphs=True, compile=True)
    eager = Engine(model, graphs=False, compile=True)
    assert graph.prefill_graphs and not eager.prefill_graphs
    g = torch.Generator().manual_seed(9)
    for width in (11, 20, 40, 30):
        prompts = [torch.randint(0, 97, (n,), generator=g).tolist() for n in (width, 3, width - 2)]
        got = graph.generate_ids(prompts, 24, seq_len=128)
        assert got.tokens == eager.generate_ids(prompts, 24, seq_len=128).tokens
    assert sorted(graph.session(3, 128).prefills) == [16, 32, 64]
    prompt = [torch.randint(0, 97, (120,), generator=g).tolist()]  # 128 + 8 > 128 slots
    assert graph._prefill_span(120, 8, 128) == 120
    assert graph.generate_ids(prompt, 8, seq_len=128).tokens == \
        eager.generate_ids(prompt, 8, seq_len=128).tokens
