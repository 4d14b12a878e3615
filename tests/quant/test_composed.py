"""Group-affine composed modules (``leechq.quant.composed``): their row-chunked forward and direct
backward against autograd through the plain composition."""

from __future__ import annotations

import pytest
import torch
from leechq_tiny import int4_record

import leechq.quant.composed as composed
from leechq.formats.artifact import GroupAffine
from leechq.quant.composed import ComposedEmbedding, ComposedLinear

CPU = torch.device("cpu")


def _perturb(m: torch.nn.Module, seed: int) -> None:
    """Factors away from their start (ρ = 1, δ = 0), so every gradient term is exercised."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        m.rho.copy_(1 + 0.1 * torch.randn(m.rho.shape, generator=gen))
        m.delta.copy_(0.1 * torch.randn(m.delta.shape, generator=gen))


def _plain(m: torch.nn.Module, x: torch.Tensor, embed: bool) -> torch.Tensor:
    """The module's output by autograd through ``compose()`` (the whole weight, float64)."""
    w, b = m.compose()
    if embed:
        return torch.nn.functional.embedding(x, w.double())
    return torch.nn.functional.linear(x, w.double(), None if b is None else b.double())


@pytest.mark.parametrize("source", ["int4", "table4", "table8"])
@pytest.mark.parametrize("chunk", [3, 8192])
def test_affine_linear_forward_and_gradients_match_the_plain_composition(
        source: str, chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows composed ``ROW_CHUNK`` at a time (3: several chunks and a short last one) give the
    output and the gradients of ρ, δ, the bias and the input that autograd gives through the
    whole composed weight; a ragged last group (40 columns in groups of 16) included."""
    monkeypatch.setattr(composed, "ROW_CHUNK", chunk)
    gen = torch.Generator().manual_seed(1)
    if source == "int4":
        src = int4_record(11, 256, seed=2)
        d_in = 256
    else:
        d_in = 40
        src = GroupAffine.quantize(torch.randn(11, d_in, generator=gen), 4 if source == "table4"
                                   else 8, 16)
    m = ComposedLinear(src, torch.randn(11, generator=gen), ("int4", "tables", "biases"), CPU,
                       torch.float64)
    _perturb(m, 3)
    x = torch.randn(2, 5, d_in, dtype=torch.float64, generator=gen, requires_grad=True)
    y = m(x)
    y.pow(2).sum().backward()
    got = {n: p.grad.clone() for n, p in m.named_parameters()} | {"x": x.grad.clone()}
    m.zero_grad()
    x2 = x.detach().clone().requires_grad_(True)
    want_y = _plain(m, x2, embed=False)
    want_y.pow(2).sum().backward()
    want = {n: p.grad for n, p in m.named_parameters()} | {"x": x2.grad}
    torch.testing.assert_close(y.double(), want_y, rtol=1e-6, atol=1e-7)
    assert set(got) == {"rho", "delta", "bias", "x"}
    for name in got:
        torch.testing.assert_close(got[name].double(), want[name].double(), rtol=1e-5,
                                   atol=1e-6, msg=name)  # float32 factors, another sum order


@pytest.mark.parametrize("tied", [False, True])
def test_affine_embedding_composes_only_the_looked_up_rows_and_its_gradients_match(
        tied: bool) -> None:
    """A lookup (repeated ids included) gives the plain composition's rows and, from those rows
    alone, its gradients of ρ and δ (zero at rows never looked up); tied to a head, the two
    modules' gradients add up in the shared factors."""
    gen = torch.Generator().manual_seed(4)
    table = GroupAffine.quantize(torch.randn(30, 40, generator=gen), 4, 16)
    head = ComposedLinear(table, None, ("tables",), CPU, torch.float64) if tied else None
    emb = ComposedEmbedding(table, ("tables",), CPU, torch.float64, share=head)
    _perturb(emb, 5)
    ids = torch.tensor([[3, 7, 3, 29], [0, 7, 12, 12]])
    h = torch.randn(2, 4, 40, dtype=torch.float64, generator=gen)

    def loss(out: torch.Tensor, logits: torch.Tensor | None) -> torch.Tensor:
        value = (out * h).sum()
        return value if logits is None else value + logits.pow(2).sum()

    x = torch.randn(3, 40, dtype=torch.float64, generator=gen)
    out = emb(ids)
    loss(out, None if head is None else head(x)).backward()
    got = {n: p.grad.clone() for n, p in emb.named_parameters()}
    emb.zero_grad()
    want_out = _plain(emb, ids, embed=True)
    loss(want_out, None if head is None else _plain(head, x, embed=False)).backward()
    torch.testing.assert_close(out.double(), want_out, rtol=0, atol=0)  # the same rows
    for name, p in emb.named_parameters():
        torch.testing.assert_close(got[name], p.grad, rtol=1e-5, atol=1e-6, msg=name)
    if not tied:
        unseen = [r for r in range(30) if r not in ids.unique().tolist()]
        assert torch.equal(got["rho"][unseen], torch.zeros_like(got["rho"][unseen]))
