"""The decode-step attention kernels (``ops.decode_attention``) against their float64 twin
(``reference.decode_attention``): under the Triton interpreter at small shapes, on the GPU at the
Qwen3 shapes.

Tolerances: float32 inputs (IEEE products) within 1e-5 of the twin; float16 / bfloat16 inputs
within four units in the last place of the output dtype at the output's magnitude, plus the
softmax weights' rounding to that dtype before they meet the values (as any flash kernel does).
"""

from __future__ import annotations

import os

import pytest
import torch

from leechq.errors import InvalidInput
from leechq.kernels import reference as ref

pytest.importorskip("triton")
interp = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                            reason="the Triton interpreter (TRITON_INTERPRET=1) is off")

_TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _ops():  # imported lazily: TRITON_INTERPRET must be set before triton compiles anything
    from leechq.kernels.triton import ops

    return ops


def _case(b: int, n_kv: int, g: int, hd: int, seq: int, dtype: torch.dtype, device: str,
          seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, n_kv, g, hd, generator=gen)
    k = torch.randn(b, n_kv, seq, hd, generator=gen)
    v = torch.randn(b, n_kv, seq, hd, generator=gen)
    return tuple(t.to(device=device, dtype=dtype) for t in (q, k, v))  # type: ignore[return-value]


def _check(q, k, v, slot: int, pad: list[int], window: int = 0) -> None:
    dev = q.device
    s = torch.tensor([slot], device=dev)
    p = torch.tensor(pad, device=dev)
    scale = q.shape[-1] ** -0.5
    out = _ops().decode_attention(q, k, v, s, p, scale, window=window)
    want = ref.decode_attention(q, k, v, s, p, scale, window=window)
    assert out.dtype == q.dtype and out.shape == q.shape and out.is_contiguous()
    assert torch.isfinite(out).all()
    err = (out.float() - want).abs().max().item()
    assert err <= _TOL[q.dtype] * max(1.0, want.abs().max().item()), err


@interp
@pytest.mark.parametrize(("dtype", "b", "n_kv", "g", "hd", "seq", "slot", "pad"), [
    (torch.float32, 1, 2, 4, 32, 100, 37, [0]),        # two splits, the second partly seen
    (torch.float32, 2, 2, 3, 24, 300, 250, [0, 7]),    # odd head_dim and groups, a padded row
    (torch.float32, 1, 1, 1, 16, 64, 0, [0]),          # the first slot: the query sees itself
    (torch.float32, 2, 1, 2, 16, 200, 5, [0, 9]),      # a pad query (pad > slot): itself only
    (torch.float16, 2, 2, 2, 32, 200, 130, [0, 64]),   # pad on a tile boundary
    (torch.bfloat16, 1, 2, 4, 32, 130, 129, [3]),      # the last slot
])
def test_matches_twin(dtype, b, n_kv, g, hd, seq, slot, pad) -> None:
    q, k, v = _case(b, n_kv, g, hd, seq, dtype, "cpu")
    _check(q, k, v, slot, pad)


@interp
def test_several_tiles_per_split(monkeypatch: pytest.MonkeyPatch) -> None:
    ops = _ops()
    from leechq.kernels.triton import ops_attention

    monkeypatch.setattr(ops_attention, "DECODE_ATTN_MAX_SPLITS", 2)
    assert ops.decode_attention_splits(300) == (192, 2)
    q, k, v = _case(1, 2, 2, 16, 300, torch.float32, "cpu", seed=4)
    _check(q, k, v, 290, [0])
    _check(q, k, v, 100, [10])  # the second split empty


@interp
@pytest.mark.parametrize(("slot", "pad", "window"), [
    (250, [0, 7], 5),      # a short window: the tiles and splits before it skipped
    (250, [0, 240], 64),   # the padding inside the window hides more
    (130, [0, 0], 1),      # the query alone
    (100, [0, 3], 500),    # a window wider than the context: no change
    (63, [0, 0], 64),      # the window ends on the tile boundary
])
def test_sliding_window_matches_twin(slot: int, pad: list[int], window: int) -> None:
    q, k, v = _case(2, 2, 3, 16, 300, torch.float32, "cpu", seed=slot + window)
    _check(q, k, v, slot, pad, window)
    if window >= slot + 1:  # a window that hides nothing gives the plain attention
        s, p = torch.tensor([slot]), torch.tensor(pad)
        full = ref.decode_attention(q, k, v, s, p, 0.25)
        assert torch.equal(ref.decode_attention(q, k, v, s, p, 0.25, window=window), full)


def test_sliding_window_twin_hides_the_old_keys() -> None:
    """The twin's window itself: with the values one-hot per slot, the output's weight on a slot
    is zero exactly for the slots outside ``(t - window, t]``."""
    seq, t, window = 12, 9, 4
    q = torch.randn(1, 1, 1, 4)
    k = torch.randn(1, 1, seq, 4)
    v = torch.eye(seq)[None, None, :, :]  # value of slot s = e_s (head_dim = seq)
    k = torch.nn.functional.pad(k, (0, seq - 4))
    q = torch.nn.functional.pad(q, (0, seq - 4))
    out = ref.decode_attention(q, k, v, torch.tensor([t]), torch.tensor([0]), 0.5, window=window)
    seen = (out[0, 0, 0] > 0).nonzero().flatten().tolist()
    assert seen == list(range(t - window + 1, t + 1))


def test_split_arithmetic() -> None:
    ops = _ops()
    assert ops.decode_attention_splits(1) == (64, 1)
    assert ops.decode_attention_splits(1024) == (64, 16)
    assert ops.decode_attention_splits(4096) == (64, 64)
    assert ops.decode_attention_splits(4097) == (128, 33)
    assert ops.decode_attention_splits(32768) == (512, 64)


@interp
def test_strided_query_and_cache_views() -> None:
    """The serving model's q is a permuted view and its caches may be slices of a larger one."""
    q, k, v = _case(1, 2, 4, 16, 96, torch.float32, "cpu", seed=5)
    q_view = q.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)  # strided over heads
    _check(q_view, k[:, :, :80], v[:, :, :80], 50, [0])


@pytest.mark.parametrize("slot", [0, 63, 64, 130])  # a tile's first, last, the next split
def test_step_key_and_value_written_by_the_kernel(slot: int) -> None:
    """With the step's own key and value the kernel writes them into slot t (only there) and
    attends to them; the twin writes them first, then attends."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the Triton interpreter (TRITON_INTERPRET=1) is off")
    q, k, v = _case(2, 2, 3, 16, 200, torch.float32, "cpu", seed=slot)
    k_new, v_new = (torch.randn(2, 2, 1, 16) for _ in range(2))
    s, p = torch.tensor([slot]), torch.tensor([0, min(slot, 5)])
    kc, vc = k.clone(), v.clone()
    out = _ops().decode_attention(q, kc, vc, s, p, 0.25, k_new=k_new, v_new=v_new)
    kr, vr = k.clone(), v.clone()
    want = ref.decode_attention(q, kr, vr, s, p, 0.25, k_new=k_new, v_new=v_new)
    assert torch.equal(kc, kr) and torch.equal(vc, vr)
    assert torch.equal(kc[:, :, slot], k_new[:, :, 0]) and (kc != k).sum() > 0
    assert (out - want).abs().max().item() <= 1e-5


@interp
def test_slot_past_the_cache_reads_and_writes_nothing_past_it() -> None:
    q, k, v = _case(1, 2, 2, 16, 70, torch.float32, "cpu", seed=6)
    kc, vc = k.clone(), v.clone()
    k_new, v_new = torch.randn(1, 2, 1, 16), torch.randn(1, 2, 1, 16)
    s, p = torch.tensor([75]), torch.tensor([0])
    out = _ops().decode_attention(q, kc, vc, s, p, 0.25, k_new=k_new, v_new=v_new)
    assert torch.equal(kc, k) and torch.equal(vc, v)  # slot 75 does not exist: nothing written
    want = ref.decode_attention(q, k, v, s, p, 0.25)  # every slot seen
    assert (out - want).abs().max().item() <= 1e-5


@interp
def test_bad_input_is_named() -> None:
    ops = _ops()
    q, k, v = _case(1, 2, 2, 16, 64, torch.float32, "cpu")
    s, p = torch.tensor([3]), torch.tensor([0])
    with pytest.raises(InvalidInput, match=r"k_cache is torch\.float16"):
        ops.decode_attention(q, k.half(), v, s, p, 0.25)
    with pytest.raises(InvalidInput, match="k_cache and v_cache must be"):
        ops.decode_attention(q, k[:, :1], v[:, :1], s, p, 0.25)
    with pytest.raises(InvalidInput, match="pad must have shape"):
        ops.decode_attention(q, k, v, s, torch.tensor([0, 0]), 0.25)
    with pytest.raises(InvalidInput, match=r"slot must be torch\.int64"):
        ops.decode_attention(q, k, v, s.int(), p, 0.25)
    with pytest.raises(InvalidInput, match="unit stride along head_dim"):
        ops.decode_attention(q.transpose(2, 3).contiguous().transpose(2, 3), k, v, s, p, 0.25)
    with pytest.raises(InvalidInput, match="4-D"):
        ops.decode_attention(q[0], k, v, s, p, 0.25)
    with pytest.raises(InvalidInput, match="no slots"):
        ops.decode_attention(q, k[:, :, :0], v[:, :, :0], s, p, 0.25)
    with pytest.raises(InvalidInput, match="go together"):
        ops.decode_attention(q, k, v, s, p, 0.25, k_new=k[:, :, :1])
    with pytest.raises(InvalidInput, match="window"):
        ops.decode_attention(q, k, v, s, p, 0.25, window=-1)
    with pytest.raises(InvalidInput, match=r"v_new must be \[1, 2, 1, 16\]"):
        ops.decode_attention(q, k, v, s, p, 0.25, k_new=k[:, :, :1], v_new=v[:, :, :2])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("b", "n_kv", "g", "seq", "slot", "pad"), [
    (1, 8, 4, 4096, 4000, [0]),          # Qwen3-8B
    (3, 8, 5, 1024, 700, [0, 13, 699]),  # Qwen3-14B's groups, padded rows
    (1, 8, 4, 40000, 39999, [0]),        # several tiles per split, the last slot
])
def test_full_shapes_on_gpu(dtype, b, n_kv, g, seq, slot, pad) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    q, k, v = _case(b, n_kv, g, 128, seq, dtype, "cuda", seed=seq)
    _check(q, k, v, slot, pad)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("hd", "seq", "slot", "pad", "window"), [
    (256, 8192, 5000, [0, 4500], 1024),  # Gemma-3's local layers: head 256, window 1024
    (128, 4096, 4095, [0, 0], 4096),     # Gemma-2's window, the whole cache
])
def test_sliding_window_on_gpu(dtype, hd, seq, slot, pad, window) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    q, k, v = _case(2, 4, 2, hd, seq, dtype, "cuda", seed=window)
    _check(q, k, v, slot, pad, window)


_OFFLINE = r"""
from leechq.kernels.triton import introspect as I
from leechq.kernels.triton.decode_attention import (
    decode_attention_combine_kernel, decode_attention_partial_kernel)

ints = ("sq_b", "sq_h", "sq_g", "sk_b", "sk_h", "sk_s", "sv_b", "sv_h", "sv_s", "skn_b", "skn_h",
        "svn_b", "svn_h", "seq_len")
for dtype, write, (n_kv, g, d) in [(t, w, s) for t in ("fp16", "bf16") for w in (False, True)
                                    for s in ((8, 4, 128), (4, 2, 256))]:
    sig = {"q_ptr": f"*{dtype}", "k_ptr": f"*{dtype}", "v_ptr": f"*{dtype}",
           "slot_ptr": "*i64", "pad_ptr": "*i64", "po_ptr": "*fp32", "pml_ptr": "*fp32",
           "kn_ptr": f"*{dtype}", "vn_ptr": f"*{dtype}", "qk_scale": "fp32",
           "window": "i32", **{k: "i32" for k in ints}}
    c = I.compile_for(decode_attention_partial_kernel, sig, dict(
        N_KV=n_kv, G=g, GP=16, D=d, DP=d, BLOCK_N=64, SPLIT=64, NSPLIT=64, IEEE=False,
        WRITE=write), num_warps=4, aligned_ints=ints)
    res = I.resource_usage(c)
    assert res.get("local", 0) == 0 and res.get("stack", 0) == 0, (dtype, write, d, res)
    text = I.sass(c)
    assert "HMMA" in text or "HGMMA" in text, (dtype, write, d)  # products on tensor cores
c = I.compile_for(decode_attention_combine_kernel,
                  {"po_ptr": "*fp32", "pml_ptr": "*fp32", "out_ptr": "*fp16"},
                  dict(G=4, D=128, DP=128, NSPLIT=64, SP=64), num_warps=1)
assert I.resource_usage(c).get("local", 0) == 0
print("ok")
"""


def test_kernels_compile_for_sm90_without_local_memory() -> None:
    """Offline (Triton's ptxas for sm_90, no GPU): both kernels at the Qwen3-8B shape (and the
    partial kernel at Gemma-3 4B/12B's: head 256, groups of 2), float16 and bfloat16, with and
    without the cache write, compile without local memory and run the
    partial kernel's products on tensor cores."""
    from offline_compile import run_offline

    out = run_offline(_OFFLINE, timeout=600)
    assert out.strip().endswith("ok"), out[-2000:]
