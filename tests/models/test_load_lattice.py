"""A lattice-coded token embedding end to end on a tiny untied model: ``quantize_model`` with
``embedding_encoding="lattice"`` records the table beside the projections, ``leechq.load`` serves
it as a :class:`LatticeEmbedding` (no dense table) with the logits of the decoded model, ``save``
writes it back byte for byte; a tied table is refused before any work, and an artifact whose head
is tied to a lattice table is refused by the loader."""

from __future__ import annotations

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
)

from leechq.config import QuantConfig
from leechq.errors import ArtifactError, InvalidInput
from leechq.formats.accounting import artifact_report
from leechq.formats.artifact import read_artifact
from leechq.formats.quantized_weight import QuantizedWeight
from leechq.models.load import load
from leechq.models.quantize import quantize_model
from leechq.nn.lattice_embedding import LatticeEmbedding

EMBED = "model.embed_tokens"


def _cfg(**kw: object) -> QuantConfig:
    return tiny_quant_config(**{"embedding_encoding": "lattice", **kw})


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    return quantize_tiny(tmp_path_factory.mktemp("lat") / "qwen3-lattice", _cfg())


def test_the_embedding_is_a_record_and_loads_as_a_lattice_module(
        artifact: tuple[Path, torch.nn.Module]) -> None:
    out, quantized = artifact
    art = read_artifact(out)
    rec = art.records[EMBED]
    assert isinstance(rec, QuantizedWeight) and (rec.d_out, rec.d_in) == (96, 56)
    assert f"{EMBED}.weight" not in art.raw and "lm_head.weight" in art.raw
    assert art.quantization_config["config"]["embedding_encoding"] == "lattice"
    # the in-place model evaluates the decoded table
    assert torch.equal(quantized.model.embed_tokens.weight.detach(), rec.dequantize())
    model, _ = load(out, device="cpu", tokenizer=False)
    emb = model.model.embed_tokens
    assert isinstance(emb, LatticeEmbedding) and model.get_input_embeddings() is emb
    held = [n for n, t in model.named_parameters() if tuple(t.shape) == (96, 56)]
    assert held == ["lm_head.weight"]  # the dense untied head only: no dense embedding
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, quantized(x).logits, rtol=0, atol=2e-5)
    report = artifact_report(out)  # the table counts at its coded rate
    dense = read_artifact(out).dense_state_dict()
    params = sum(t.numel() for t in dense.values())
    assert report["counts"]["parameters"] == params
    assert report["matrices"][EMBED]["kind"] == "lattice"
    assert 2 < report["matrices"][EMBED]["kernel_bits_per_weight"] < 8  # 8 of 56 columns: f32 tail


def test_save_round_trip_and_dtypes(artifact: tuple[Path, torch.nn.Module],
                                    tmp_path: Path) -> None:
    out, _ = artifact
    assert_saves_back(out, tmp_path)
    model, _ = load(out, device="cpu", tokenizer=False)
    m16, _ = load(out, device="cpu", dtype="bfloat16", tokenizer=False)
    x = ids()
    assert m16.model.embed_tokens(x).dtype == torch.bfloat16
    assert torch.equal(m16.model.embed_tokens(x), model.model.embed_tokens(x).to(torch.bfloat16))


def test_tied_tables_are_refused(tmp_path: Path, artifact: tuple[Path, torch.nn.Module]) -> None:
    with pytest.raises(InvalidInput, match="one gain bit"):
        quantize_model(tiny_model("qwen3"), None, calib_windows(), _cfg(gain_bits=2),
                       tmp_path / "wide", progress=False)
    tied = tiny_model("llama")  # one table for the embedding and the head
    with pytest.raises(InvalidInput, match="tied to it"):
        quantize_model(tied, None, calib_windows(), _cfg(), tmp_path / "no", progress=False)
    assert not (tmp_path / "no").exists()
    # an artifact whose head would be tied to the lattice table (no head of its own stored)
    out, _ = artifact
    art = read_artifact(out)
    from leechq.models.load import (
        base_config,
        build_skeleton,
        install_packed_tables,
        split_embedding_record,
    )

    skeleton = build_skeleton(base_config(art.config), torch.float32)
    name, lattice, rest = split_embedding_record(skeleton, art.records)
    assert name == EMBED and lattice is art.records[EMBED] and EMBED not in rest
    art.raw.pop("lm_head.weight")
    skeleton.config.tie_word_embeddings = True
    with pytest.raises(ArtifactError, match="tied to the lattice-coded embedding"):
        install_packed_tables(skeleton, art, skeleton.config, lattice)


def test_serving_reuses_the_lattice_embedding(artifact: tuple[Path, torch.nn.Module]) -> None:
    """``from_hf_model`` keeps the module; the engine's greedy tokens are transformers' own over
    the same loaded model, and the memory report counts the coded table."""
    from leechq.serve.build import from_hf_model
    from leechq.serve.generate import Engine

    out, _ = artifact
    model, tok = load(out, device="cpu")
    serving = from_hf_model(model)
    assert serving.embed is model.model.embed_tokens
    engine = Engine(serving)
    prompt = tok.encode("the model reads the words", add_special_tokens=False)
    got = engine.generate_ids([prompt], 8).tokens[0]
    with torch.no_grad():
        want = model.generate(torch.tensor([prompt]), max_new_tokens=8, min_new_tokens=8,
                              do_sample=False, pad_token_id=0, eos_token_id=None)
    assert len(got) >= 1 and got == want[0, len(prompt):].tolist()[: len(got)]
    emb_bytes = serving.embed.packed_bytes()
    assert engine.memory()["embed_head"] == emb_bytes + 4 * 96 * 56  # + the dense f32 head
