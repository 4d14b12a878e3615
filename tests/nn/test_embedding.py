"""PackedEmbedding / PackedHead (leechq.nn.embedding): lookups bit-exact against the dequantized
table, logits against the float64 product (per-output tolerance from the dtypes,
tests/tolerance.py), Triton (interpreter) against the reference twins, tied heads sharing one table,
memory accounting, clear errors — and the same on CUDA (gpu marker)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tolerance import assert_matmul_close

from leechq.errors import InvalidInput, KernelUnavailable
from leechq.formats.artifact import GroupAffine
from leechq.formats.int8_weight import Int8Weight
from leechq.formats.quantized_weight import Int4Weight
from leechq.nn.embedding import PackedEmbedding, PackedHead

VOCAB, DIM = 44, 72  # two groups of 64 columns, the second one short


def table(bits: int, seed: int = 0, vocab: int = VOCAB, dim: int = DIM,
          group: int = 64) -> GroupAffine:
    g = torch.Generator().manual_seed(seed)
    return GroupAffine.quantize(torch.randn(vocab, dim, generator=g) * 0.3, bits, group)


def token_ids(shape: tuple[int, ...], seed: int = 1, vocab: int = VOCAB) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def activations(rows: int, seed: int = 2, dim: int = DIM) -> torch.Tensor:
    return torch.randn(rows, dim, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_lookup_is_the_dequantized_row_bit_for_bit(bits: int, dtype: torch.dtype) -> None:
    ga = table(bits)
    emb = PackedEmbedding.from_group_affine(ga)
    ex = emb.finalize("cpu", dtype)
    assert (ex.path, ex.kernel) == ("reference", f"reference-int{bits}-embedding")
    ids = token_ids((3, 5))
    got = emb(ids)
    assert got.shape == (3, 5, DIM) and got.dtype == dtype
    dense = ga.dequantize(torch.float32).to(dtype)
    assert torch.equal(got, F.embedding(ids, dense))
    assert torch.equal(emb(ids.to(torch.int32)), got)
    assert torch.equal(emb.dequantize_rows(), ga.dequantize(torch.float32))
    assert torch.equal(emb.dequantize_rows(7, 19), ga.dequantize(torch.float32)[7:19])


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("chunk_rows", [None, 5])
def test_head_matches_the_dense_product(bits: int, chunk_rows: int | None) -> None:
    ga = table(bits, seed=3)
    head = PackedHead.from_group_affine(ga, chunk_rows=chunk_rows)
    head.finalize("cpu", torch.float32)
    dense = ga.dequantize(torch.float32)
    for rows in (1, 3, 8, 13):
        x = activations(rows)
        got = head(x)
        assert got.shape == (rows, VOCAB) and got.dtype == torch.float32
        assert_matmul_close(got, x.double() @ dense.double().T, x, dense, torch.float32)
    x3 = activations(6).reshape(2, 3, DIM)
    assert_matmul_close(head(x3), x3.double() @ dense.double().T, x3, dense, torch.float32)
    head.finalize("cpu", torch.bfloat16)
    x16 = activations(4).bfloat16()
    y16 = head(x16)
    assert y16.dtype == torch.bfloat16
    assert_matmul_close(y16, x16.double() @ dense.double().T, x16, dense, torch.bfloat16)


def test_chunks_do_not_change_the_logits() -> None:
    """The chunked product equals the one-chunk product (the same dense rows, cut differently)."""
    ga = table(8, seed=4)
    whole = PackedHead.from_group_affine(ga)
    cut = PackedHead.from_group_affine(ga, chunk_rows=3)
    whole.finalize("cpu")
    cut.finalize("cpu")
    x = activations(11)
    torch.testing.assert_close(cut(x), whole(x), rtol=1e-6, atol=1e-6)
    assert whole.chunk_rows >= VOCAB and cut.chunk_rows == 3


def test_tied_head_shares_the_embedding_table() -> None:
    emb = PackedEmbedding.from_group_affine(table(4, seed=5))
    head = PackedHead.tied_to(emb)
    emb.finalize("cpu")
    head.finalize("cpu")
    assert head.table is emb and head.tied
    assert head.packed_bytes() == emb.packed_bytes()
    owned = {b.data_ptr() for b in emb.buffers()}
    holder = torch.nn.ModuleList([emb, head])
    assert {b.data_ptr() for b in holder.buffers()} == owned  # one table, counted once
    assert not list(holder.parameters())
    x = activations(2)
    w = emb.dequantize_rows()
    assert_matmul_close(head(x), x.double() @ w.double().T, x, w, torch.float32)


@pytest.mark.parametrize("bits", [4, 8])
def test_packed_bytes(bits: int) -> None:
    emb = PackedEmbedding.from_group_affine(table(bits))
    groups = 2  # ceil(72 / 64)
    assert emb.packed_bytes() == VOCAB * DIM * bits // 8 + 2 * 2 * VOCAB * groups
    assert emb.dense_bytes(torch.bfloat16) == 2 * VOCAB * DIM
    assert emb.dense_bytes(torch.float32) == 4 * VOCAB * DIM
    assert emb.packed_bytes() < emb.dense_bytes(torch.bfloat16) / (16 / bits) * 1.3


def test_from_table_and_group_affine_round_trip() -> None:
    ga = table(4, seed=6)
    rec4 = Int4Weight(VOCAB, DIM, ga.qweight, ga.scales, ga.biases, 64)
    emb = PackedEmbedding.from_table(rec4)
    back = emb.to_group_affine()
    assert (back.dims, back.bits, back.group) == ((VOCAB, DIM), 4, 64)
    assert torch.equal(back.qweight, ga.qweight) and torch.equal(back.scales, ga.scales)
    ga8 = table(8, seed=6)
    rec8 = Int8Weight(VOCAB, DIM, ga8.qweight, ga8.scales, ga8.biases, 64)
    assert isinstance(PackedEmbedding.from_table(rec8).table(), Int8Weight)


def test_a_dtype_cast_keeps_the_f16_scales() -> None:
    ga = table(8, seed=7)
    emb = PackedEmbedding.from_group_affine(ga)
    emb.finalize("cpu", torch.float32)
    ids = token_ids((6,))
    before = emb(ids)
    emb.to(torch.bfloat16)  # a cast of the whole model must not round the f16 scales to bf16
    assert emb.scales.dtype == torch.float16 and emb.biases.dtype == torch.float16
    assert emb.qweight.dtype == torch.uint8
    after = emb(ids)  # still finalized: the served dtype follows the cast, the values the table
    assert after.dtype == torch.bfloat16 and torch.equal(after, before.bfloat16())
    head = PackedHead.tied_to(emb)
    head.finalize("cpu", torch.bfloat16)
    head.float()
    assert head.execution.dtype == torch.float32 and emb.execution.dtype == torch.float32
    assert head(activations(2)).dtype == torch.float32


def test_errors() -> None:
    ga = table(4)
    emb = PackedEmbedding.from_group_affine(ga)
    with pytest.raises(RuntimeError, match="never finalized"):
        emb(token_ids((2,)))
    with pytest.raises(InvalidInput, match="prefer"):
        emb.finalize("cpu", prefer="fast")
    with pytest.raises(InvalidInput, match="float32/float16/bfloat16"):
        emb.finalize("cpu", torch.float64)
    emb.finalize("cpu")
    with pytest.raises(InvalidInput, match="int32/int64"):
        emb(torch.tensor([1.0, 2.0]))
    with pytest.raises(InvalidInput, match=r"\[0, 44\)"):
        emb(torch.tensor([0, VOCAB]))
    with pytest.raises(InvalidInput, match=r"\[0, 44\)"):
        emb(torch.tensor([-1]))
    with pytest.raises(InvalidInput, match="4 or 8 bits"):
        PackedEmbedding(3, VOCAB, DIM, 64, ga.qweight, ga.scales, ga.biases)
    with pytest.raises(InvalidInput, match="qweight"):
        PackedEmbedding(8, VOCAB, DIM, 64, ga.qweight, ga.scales, ga.biases)  # 4-bit bytes
    with pytest.raises(InvalidInput, match="scales"):
        PackedEmbedding(4, VOCAB, DIM, 64, ga.qweight, ga.scales.float(), ga.biases)
    with pytest.raises(InvalidInput, match="2-D"):
        PackedEmbedding.from_group_affine(GroupAffine.quantize(torch.randn(2, 4, 8), 8, 64))
    head = PackedHead.tied_to(emb)
    with pytest.raises(RuntimeError, match="never finalized"):
        head(activations(1))
    head.finalize("cpu")
    with pytest.raises(InvalidInput, match=r"\[..., 72\]"):
        head(activations(1, dim=DIM - 8))
    with pytest.raises(InvalidInput, match="PackedEmbedding"):
        PackedHead(torch.nn.Embedding(3, 4), tied=False)  # type: ignore[arg-type]


def test_fused_without_a_kernel_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    emb = PackedEmbedding.from_group_affine(table(8))
    with pytest.raises(KernelUnavailable, match="triton-int8-embedding"):
        emb.finalize("cpu", prefer="fused")
    emb.finalize("cpu", prefer="reference")
    head = PackedHead.tied_to(emb)
    with pytest.raises(KernelUnavailable, match="triton-int8-matvec"):
        head.finalize("cpu", prefer="fused")


# ------------------------------------------------------------------ Triton (CPU interpreter)


@pytest.mark.interp
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("tied", [True, False])
def test_triton_kernels_match_the_reference_twins(bits: int, tied: bool) -> None:
    ga = table(bits, seed=8)
    head_ga = ga if tied else table(bits, seed=9)
    fused_emb = PackedEmbedding.from_group_affine(ga)
    ref_emb = PackedEmbedding.from_group_affine(ga)
    assert fused_emb.finalize("cpu", prefer="fused").kernel == f"triton-int{bits}-embedding"
    ref_emb.finalize("cpu", prefer="reference")
    fused_head = (PackedHead.tied_to(fused_emb) if tied
                  else PackedHead.from_group_affine(head_ga, chunk_rows=16))
    ref_head = PackedHead.tied_to(ref_emb) if tied else PackedHead.from_group_affine(head_ga)
    ex = fused_head.finalize("cpu", prefer="fused")
    assert ex.path == "fused" and f"triton-int{bits}-matvec" in str(ex.kernel)
    assert ref_head.finalize("cpu", prefer="reference").path == "reference"
    ids = token_ids((2, 7), seed=10)
    assert torch.equal(fused_emb(ids), ref_emb(ids))  # both exact: bit-identical
    dense = head_ga.dequantize(torch.float32).double()
    for rows in (1, 2, 5, 8, 9):  # the matvec kernel up to 8 rows, chunks beyond
        x = activations(rows, seed=rows)
        want = x.double() @ dense.T
        assert_matmul_close(fused_head(x), want, x, dense, torch.float32, what=f"fused {rows}")
        assert_matmul_close(ref_head(x), want, x, dense, torch.float32, what=f"ref {rows}")


@pytest.mark.interp
def test_triton_head_reads_the_activation_dtype() -> None:
    ga = table(4, seed=11)
    head = PackedHead.from_group_affine(ga)
    head.finalize("cpu", torch.bfloat16, prefer="fused")
    x = activations(3).bfloat16()
    y = head(x)
    assert y.dtype == torch.bfloat16
    dense = ga.dequantize(torch.float32).double()
    assert_matmul_close(y, x.double() @ dense.T, x, dense, torch.bfloat16)


# ------------------------------------------------------------------ CUDA


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_packed_tables_match_the_reference(bits: int, dtype: torch.dtype) -> None:
    vocab, dim = 1000, 576  # a realistic width, ragged vocabulary
    ga = table(bits, seed=12, vocab=vocab, dim=dim)
    cpu = PackedEmbedding.from_group_affine(ga)
    cpu.finalize("cpu", dtype)
    emb = PackedEmbedding.from_group_affine(ga)
    ex = emb.finalize("cuda", dtype)  # auto: the Triton gather
    assert ex.path == "fused" and emb.qweight.is_cuda and emb.scales.dtype == torch.float16
    ids = token_ids((3, 17), seed=13, vocab=vocab)
    assert torch.equal(emb(ids.cuda()).cpu(), cpu(ids))
    ref = PackedEmbedding.from_group_affine(ga)
    assert ref.finalize("cuda", dtype, prefer="reference").path == "reference"
    assert torch.equal(ref(ids.cuda()).cpu(), cpu(ids))  # the sync-free torch gather
    head = PackedHead.tied_to(emb, chunk_rows=300)
    assert head.finalize("cuda", dtype).path == "fused"
    dense = ga.dequantize(torch.float32).double()
    for rows in (1, 4, 8, 33):  # the Triton matvec up to 8 rows, chunked dequantize + matmul beyond
        x = activations(rows, seed=rows, dim=dim).to(dtype)
        got = head(x.cuda())
        assert got.dtype == dtype and got.shape == (rows, vocab)
        assert_matmul_close(got.cpu(), x.double() @ dense.T, x, dense, dtype, what=f"{rows} rows")
    emb.cpu()  # moving re-finalizes on the new device (reference on the CPU)
    assert emb.execution is not None and emb.execution.device == "cpu"
    assert torch.equal(emb(ids), cpu(ids))
