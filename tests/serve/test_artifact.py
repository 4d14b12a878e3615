"""Serving a real leechq artifact (tiny, random records) the way ``leechq run`` does: load, convert,
generate — greedy tokens equal transformers' own ``generate`` on the loaded model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_generate_on_a_loaded_artifact_matches_transformers(tmp_path: Path, arch: str) -> None:
    from leechq_tiny import make_artifact

    from leechq.models.load import load
    from leechq.serve.build import execution_paths
    from leechq.serve.generate import engine_for, generate

    out, _ = make_artifact(tmp_path, arch)
    model, tok = load(out, device="cpu")
    prompt = tok.encode("the model reads the words", add_special_tokens=False)
    res = generate(model, tok, [prompt], max_new_tokens=16)
    engine = engine_for(model)
    assert execution_paths(engine.model)["dense"] == 7 * model.config.num_hidden_layers
    with torch.no_grad():
        ref = model.generate(
            torch.tensor([prompt]), max_new_tokens=16, min_new_tokens=16, do_sample=False,
            pad_token_id=0, eos_token_id=None,
        )[0, len(prompt) :].tolist()
    got = res.tokens[0]
    assert len(got) >= 1 and got == ref[: len(got)]
    assert res.texts[0] == tok.decode(got, skip_special_tokens=True)
    mem = engine.memory()
    assert mem["weights"] > 0 and mem["kv_cache"] > 0
