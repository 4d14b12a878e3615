"""The lattice-coded token embedding: every looked-up row equals the record's dequantization bit
for bit (both codebooks, tails, several dtypes), the record comes back unchanged, and bad input is
refused by name."""

from __future__ import annotations

import pytest
import torch

from leechq.config import QuantConfig
from leechq.errors import InvalidInput
from leechq.formats.quantized_weight import QuantizedWeight
from leechq.nn.lattice_embedding import LatticeEmbedding
from leechq.quant.embedding import encode_embedding


def _record(codebook: str, vocab: int = 40, dim: int = 53, seed: int = 0) -> QuantizedWeight:
    w = torch.randn(vocab, dim, generator=torch.Generator().manual_seed(seed))
    return encode_embedding(w, QuantConfig(codebook=codebook, device="cpu"))


@pytest.mark.parametrize("codebook", ["tetra", "ball"])
@pytest.mark.parametrize("dim", [53, 72])  # a 5-column tail; none
def test_rows_equal_the_records_dequantization(codebook: str, dim: int) -> None:
    rec = _record(codebook, dim=dim, seed=dim)
    emb = LatticeEmbedding.from_record(rec)
    emb.finalize("cpu", torch.float32)
    ids = torch.tensor([[3, 0, 39], [7, 7, 1]])
    want = rec.dequantize()
    got = emb(ids)
    assert got.shape == (2, 3, dim) and got.dtype == torch.float32
    assert torch.equal(got, want[ids])
    assert torch.equal(emb(ids.to(torch.int32)), want[ids])
    assert torch.equal(emb.dequantize_rows(torch.arange(rec.d_out)), want)
    for dtype in (torch.float16, torch.bfloat16):
        emb.finalize("cpu", dtype)
        assert torch.equal(emb(ids), want[ids].to(dtype))


@pytest.mark.parametrize("codebook", ["tetra", "ball"])
def test_record_round_trip_and_dtype_casts(codebook: str) -> None:
    rec = _record(codebook, dim=53, seed=1)
    emb = LatticeEmbedding.from_record(rec)
    emb.finalize("cpu", torch.float32)
    back = emb.record()
    for field in ("labels", "gains", "row_scales", "centroids", "tail"):
        assert torch.equal(getattr(back, field), getattr(rec, field)), field
    assert back.codebook == codebook and back.rotation is not None
    assert back.rotation.seed == rec.rotation.seed
    assert (back.rotation.signs == rec.rotation.signs).all()
    emb.half()  # the activation dtype follows; the float64 scales and tables stay float64
    assert emb.execution.dtype == torch.float16 and emb.row_scales.dtype == torch.float64
    assert torch.equal(emb(torch.tensor([5])), rec.dequantize()[[5]].half())
    big = LatticeEmbedding.from_record(_record(codebook, vocab=400, dim=72, seed=4))
    # codes (6 or 14 bytes a block, rows padded to 8 bytes) and an f64 scale a row, then the
    # fixed tables: under a quarter of the float32 table
    assert big.packed_bytes() < 400 * 72 * 4 / 4


def test_embed_scale_and_unrotated_records() -> None:
    rec = _record("tetra", dim=48, seed=2)
    rec.rotation = None  # a table coded unrotated decodes without the inverse rotation
    emb = LatticeEmbedding.from_record(rec, embed_scale=8.0 ** 0.5)
    emb.finalize("cpu", torch.bfloat16)
    scale = float(torch.tensor(8.0 ** 0.5, dtype=torch.bfloat16))
    want = rec.dequantize().to(torch.bfloat16)[[0, 4]] * scale
    assert torch.equal(emb(torch.tensor([0, 4])), want)
    assert "embed_scale" in repr(emb) and "codebook=tetra" in repr(emb)


def test_bad_input_is_refused() -> None:
    rec = _record("tetra", vocab=12, dim=24)
    emb = LatticeEmbedding.from_record(rec)
    with pytest.raises(RuntimeError, match="never finalized"):
        emb(torch.tensor([0]))
    emb.finalize("cpu")
    with pytest.raises(InvalidInput, match="token id 12 outside"):
        emb(torch.tensor([0, 12]))
    with pytest.raises(InvalidInput, match="token id -1 outside"):
        emb(torch.tensor([-1]))
    with pytest.raises(InvalidInput, match="int32/int64 token ids"):
        emb(torch.tensor([0.0]))
    with pytest.raises(InvalidInput, match="serves float32"):
        emb.finalize("cpu", torch.int8)
    with pytest.raises(InvalidInput, match="meta device"):
        emb.finalize("meta")
    wide = encode_embedding(torch.randn(4, 24), QuantConfig(codebook="tetra", gain_bits=2,
                                                            device="cpu"))
    with pytest.raises(InvalidInput, match="one gain bit"):
        LatticeEmbedding.from_record(wide)
    with pytest.raises(InvalidInput, match="QuantizedWeight"):
        LatticeEmbedding.from_record(torch.zeros(3, 24))  # type: ignore[arg-type]


# ------------------------------------------------------------------ CUDA


@pytest.mark.gpu
@pytest.mark.parametrize("codebook", ["tetra", "ball"])
def test_cuda_rows_equal_the_cpu_rows_and_replay_in_a_graph(codebook: str) -> None:
    """On CUDA the same torch decode gives the CPU's rows bit for bit (the float64 arithmetic is
    element-wise, in the same order), and a lookup captured in a CUDA graph replays for new ids
    (nothing syncs with the host, the decoder's tables were built by finalize)."""
    rec = _record(codebook, vocab=256, dim=896, seed=5)  # qwen2.5's width: a 7-wide odd block
    cpu = LatticeEmbedding.from_record(rec)
    cpu.finalize("cpu", torch.bfloat16)
    emb = LatticeEmbedding.from_record(rec)
    emb.finalize("cuda", torch.bfloat16)
    assert emb.codes.is_cuda and emb.row_scales.dtype == torch.float64
    ids = torch.randint(0, rec.d_out, (4, 9), generator=torch.Generator().manual_seed(6))
    assert torch.equal(emb(ids.cuda()).cpu(), cpu(ids))
    static = ids[:, :1].clone().cuda()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        emb(static)  # warm-up on the side stream, as graph capture wants
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = emb(static)
    for col in range(1, 4):
        static.copy_(ids[:, col : col + 1])
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out.cpu(), cpu(ids[:, col : col + 1]))
