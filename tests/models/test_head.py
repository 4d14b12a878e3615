"""A lattice-coded output head end to end on a tiny untied model (``QuantConfig.lattice_head``):
``quantize_model`` codes the head as one more block after the decoder layers (the Hessian of the
final norm's output) and records it beside the projections; ``leechq.load`` serves it as a
:class:`LeechqLinear` with the logits of the in-place model, the serving engine as a projection;
a tied head or a head that is not a linear is refused before any work; the int4 patterns reach it;
and a configuration without the field keeps the digest it had before the field existed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from leechq_tiny import (
    assert_saves_back,
    calib_windows,
    ids,
    quantize_tiny,
    tiny_model,
    tiny_quant_config,
    tiny_tokenizer,
)

from leechq.config import QuantConfig
from leechq.errors import InvalidInput
from leechq.formats.accounting import artifact_report
from leechq.formats.artifact import read_artifact
from leechq.formats.quantized_weight import QuantizedWeight
from leechq.models.arch import arch_of
from leechq.models.head import HeadBlock, check_lattice_head, head_block
from leechq.models.load import load
from leechq.models.quantize import quantize_model
from leechq.nn.linear import LeechqLinear


def _cfg(**kw: object) -> QuantConfig:
    return tiny_quant_config(**{"lattice_head": True, **kw})


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    return quantize_tiny(tmp_path_factory.mktemp("head") / "qwen3-head", _cfg())


def test_the_head_is_a_record_and_loads_as_a_leechq_linear(
        artifact: tuple[Path, torch.nn.Module]) -> None:
    out, quantized = artifact
    art = read_artifact(out)
    rec = art.records["lm_head"]
    assert isinstance(rec, QuantizedWeight) and (rec.d_out, rec.d_in) == (96, 56)
    assert "lm_head.weight" not in art.raw and "model.embed_tokens.weight" in art.raw
    assert art.quant_config.lattice_head
    assert torch.equal(quantized.lm_head.weight.detach(), rec.dequantize())
    model, _ = load(out, device="cpu", tokenizer=False)
    assert isinstance(model.lm_head, LeechqLinear)
    assert model.get_output_embeddings() is model.lm_head
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, quantized(x).logits, rtol=0, atol=2e-5)
    report = artifact_report(out)
    assert report["matrices"]["lm_head"]["kind"] == "lattice"


@pytest.mark.parametrize("embedding", ["keep", "int4", "lattice"])
def test_a_config_that_says_tied_keeps_the_coded_head(tmp_path: Path, embedding: str) -> None:
    """A model whose tensors are untied while its config says ``tie_word_embeddings`` (a GGUF that
    ships its own ``output.weight``): the recorded head is its own in ``leechq.load`` and in
    ``from_pretrained``, beside a dense, a 4-bit or a lattice-coded embedding."""
    from transformers import AutoModelForCausalLM

    import leechq.integrations.transformers  # noqa: F401  (registers the method)

    model = tiny_model("qwen3")
    model.config.tie_word_embeddings = True
    out = quantize_model(model, tiny_tokenizer(), calib_windows(),
                         _cfg(embedding_encoding=embedding), tmp_path / embedding, progress=False)
    ours, _ = load(out, device="cpu", tokenizer=False)
    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    x = ids()
    with torch.no_grad():
        want = model(x).logits
        for loaded in (ours, hf):
            assert isinstance(loaded.lm_head, LeechqLinear)
            torch.testing.assert_close(loaded(x).logits, want, rtol=0, atol=2e-5)


def test_save_writes_the_artifact_back(artifact: tuple[Path, torch.nn.Module],
                                       tmp_path: Path) -> None:
    assert_saves_back(artifact[0], tmp_path)


def test_the_head_block_reads_the_final_norm_of_the_last_states() -> None:
    """The block's input hook sees ``norm(hidden)``, the head itself never runs and the states
    come back as they went in."""
    model = tiny_model("qwen3")
    arch = arch_of(model)
    block = head_block(model, arch, 7)
    assert isinstance(block, HeadBlock) and block.index == 7
    assert [s.name for s in block.linears] == ["lm_head"] and not block.linears[0].int4
    seen: list[torch.Tensor] = []
    handle = model.lm_head.register_forward_pre_hook(lambda _m, a: seen.append(a[0]))
    ran: list[bool] = []
    model.lm_head.register_forward_hook(lambda *_: ran.append(True))
    hidden = torch.randn(2, 5, 56)
    try:
        with torch.no_grad():
            assert block.forward(hidden) is hidden
    finally:
        handle.remove()
    assert len(seen) == 1 and not ran
    with torch.no_grad():
        assert torch.equal(seen[0], model.model.norm(hidden))
    assert head_block(model, arch, 2, int4=True).linears[0].int4


def test_refusals_come_before_any_work(tmp_path: Path) -> None:
    tied = tiny_model("llama")  # one table for the embedding and the head
    with pytest.raises(InvalidInput, match=r"head must be untied.*lm_head"):
        quantize_model(tied, None, calib_windows(), _cfg(), tmp_path / "no", progress=False)
    assert not (tmp_path / "no").exists()
    odd = tiny_model("qwen3")
    odd.lm_head = torch.nn.Identity()
    with pytest.raises(InvalidInput, match=r"needs an nn\.Linear at lm_head, got Identity"):
        check_lattice_head(odd, arch_of(tiny_model("qwen3")))
    with pytest.raises(InvalidInput, match="lattice_head must be a bool"):
        _cfg(lattice_head=1)


def test_int4_patterns_reach_the_head(tmp_path: Path) -> None:
    from leechq.formats.quantized_weight import Int4Weight

    model = tiny_model("qwen3")
    cfg = _cfg(int4_modules=("lm_head",), int4_group=8)
    out = quantize_model(model, None, calib_windows(), cfg, tmp_path / "int4", progress=False)
    assert isinstance(read_artifact(out).records["lm_head"], Int4Weight)


def test_the_digest_without_the_field_is_unchanged() -> None:
    """``lattice_head`` off is absent from ``to_dict`` (the digest of every earlier configuration
    stands); on, it is recorded and survives the round trip."""
    off = QuantConfig(codebook="tetra")
    assert "lattice_head" not in off.to_dict()
    blob = json.dumps(off.to_dict(), sort_keys=True, separators=(",", ":"))
    assert off.digest() == hashlib.sha256(blob.encode()).hexdigest()
    on = off.replace(lattice_head=True)
    assert on.to_dict()["lattice_head"] is True and on.digest() != off.digest()
    assert QuantConfig.from_dict(on.to_dict()) == on and QuantConfig.from_dict(off.to_dict()) == off
    assert "head on the lattice" in on.describe() and "head on" not in off.describe()


def test_serving_runs_the_head_as_a_projection(artifact: tuple[Path, torch.nn.Module]) -> None:
    """``from_hf_model`` serves the head through a projection group; the engine's greedy tokens
    are transformers' own over the same loaded model."""
    from leechq.nn.group import LeechqGroup
    from leechq.serve.build import from_hf_model
    from leechq.serve.generate import Engine

    out, _ = artifact
    model, tok = load(out, device="cpu")
    serving = from_hf_model(model)
    assert isinstance(serving.head, (LeechqGroup, LeechqLinear))
    engine = Engine(serving)
    prompt = tok.encode("the model reads the words", add_special_tokens=False)
    got = engine.generate_ids([prompt], 8).tokens[0]
    with torch.no_grad():
        want = model.generate(torch.tensor([prompt]), max_new_tokens=8, min_new_tokens=8,
                              do_sample=False, pad_token_id=0, eos_token_id=None)
    assert len(got) >= 1 and got == want[0, len(prompt):].tolist()[: len(got)]


@pytest.mark.gpu
def test_cuda_serves_the_head_fused_in_the_engine(artifact: tuple[Path, torch.nn.Module]) -> None:
    """On CUDA the head runs a fused lattice kernel, in ``leechq.load``'s model (the in-place
    model's logits) and in the engine, whose CUDA-graph greedy tokens are the in-place model's."""
    from leechq.serve.build import from_hf_model
    from leechq.serve.generate import Engine

    out, quantized = artifact
    model, tok = load(out, device="cuda", dtype="float32")
    assert model.lm_head.execution.path == "fused"
    for n in (1, 12):  # a decode-sized and a prefill-sized call
        x = ids(n=n)
        with torch.no_grad():
            got, want = model(x.cuda()).logits.cpu(), quantized(x).logits
        assert float((got - want).abs().max() / want.abs().max()) < 1e-3, n
    serving = from_hf_model(model)
    assert serving.head.execution.path == "fused"
    prompt = tok.encode("the model reads the words", add_special_tokens=False)
    got_tokens = Engine(serving).generate_ids([prompt], 12).tokens[0]
    with torch.no_grad():
        want_tokens = quantized.generate(torch.tensor([prompt]), max_new_tokens=12,
                                         min_new_tokens=12, do_sample=False, pad_token_id=0,
                                         eos_token_id=None)[0, len(prompt):].tolist()
    assert len(got_tokens) >= 1 and got_tokens == want_tokens[: len(got_tokens)]
