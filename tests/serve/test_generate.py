"""The decode loop on CPU: greedy == transformers' greedy generate, batching, sampling, stops,
errors."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from leechq.errors import InvalidInput
from leechq.serve.build import from_hf_model
from leechq.serve.chat import chat_loop, format_chat
from leechq.serve.generate import Engine, generate
from leechq.serve.sampling import SamplingConfig

from .conftest import tiny_hf_model

pytest.importorskip("transformers")


def _hf_greedy(hf: Any, prompt: list[int], n: int, **kw: Any) -> list[int]:
    out = hf.generate(
        torch.tensor([prompt]),
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=False,
        pad_token_id=0,
        eos_token_id=None,
        **kw,
    )
    return out[0, len(prompt) :].tolist()


def test_greedy_tokens_match_transformers_generate(hf_model: Any) -> None:
    engine = Engine(from_hf_model(hf_model))
    prompt = torch.randint(0, 97, (7,), generator=torch.Generator().manual_seed(4)).tolist()
    ours = engine.generate_ids([prompt], 40)
    assert ours.tokens[0] == _hf_greedy(hf_model, prompt, 40)
    assert ours.steps == 39


def test_repetition_penalty_matches_transformers() -> None:
    hf = tiny_hf_model("qwen2")
    engine = Engine(from_hf_model(hf))
    prompt = [3, 17, 17, 40, 2, 9]
    ours = engine.generate_ids([prompt], 32, SamplingConfig(repetition_penalty=1.3))
    assert ours.tokens[0] == _hf_greedy(hf, prompt, 32, repetition_penalty=1.3)


def test_left_padded_batch_equals_individual_runs() -> None:
    engine = Engine(from_hf_model(tiny_hf_model("llama")))
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 97, (n,), generator=g).tolist() for n in (3, 11, 6, 1)]
    batch = engine.generate_ids(prompts, 32)
    alone = [engine.generate_ids([p], 32).tokens[0] for p in prompts]
    assert batch.tokens == alone


def test_stop_ids_end_rows_and_trim() -> None:
    engine = Engine(from_hf_model(tiny_hf_model("qwen3")), check_every=2)
    prompts = [[1, 2, 3], [50, 60]]
    free = engine.generate_ids(prompts, 24).tokens
    stop = free[0][5]  # a token row 0 really produces
    out = engine.generate_ids(prompts, 24, stop_ids=[stop], pad_id=0)
    assert out.tokens[0] == free[0][: free[0].index(stop) + 1]
    for row, full in zip(out.tokens, free, strict=True):
        assert row == full[: len(row)]  # a stop never changes what came before it
    assert out.steps == 23 or all(r[-1] == stop for r in out.tokens)


def test_stream_sees_every_token_once() -> None:
    engine = Engine(from_hf_model(tiny_hf_model("qwen2")))
    seen: dict[int, list[int]] = {0: [], 1: []}
    out = engine.generate_ids([[4, 5], [6, 7, 8]], 10, stream=lambda r, t: seen[r].append(t))
    assert seen[0] == out.tokens[0] and seen[1] == out.tokens[1]


def test_sampling_is_seeded_and_top_k_1_is_greedy() -> None:
    engine = Engine(from_hf_model(tiny_hf_model("qwen3")))
    prompt = [[9, 8, 7, 6]]
    cfg = SamplingConfig(temperature=1.5, top_p=0.95, min_p=0.01, seed=123)
    a = engine.generate_ids(prompt, 24, cfg).tokens
    b = engine.generate_ids(prompt, 24, cfg).tokens
    c = engine.generate_ids(prompt, 24, SamplingConfig(temperature=1.5, seed=124)).tokens
    assert a == b and a != c
    greedy = engine.generate_ids(prompt, 24).tokens
    assert (
        engine.generate_ids(prompt, 24, SamplingConfig(temperature=2.0, top_k=1, seed=1)).tokens
        == greedy
    )


def test_prompt_longer_than_cache_is_a_clear_error() -> None:
    engine = Engine(from_hf_model(tiny_hf_model("llama")))
    with pytest.raises(InvalidInput, match=r"needs 45 cache slots but the KV cache has 32"):
        engine.generate_ids([list(range(40))], 5, seq_len=32)
    with pytest.raises(InvalidInput, match="max_position_embeddings"):
        engine.generate_ids([[1] * 250], 10)


@pytest.mark.parametrize(
    ("prompts", "n", "match"),
    [
        ([], 4, "non-empty"),
        ([[]], 4, "prompt 0"),
        ([[1, 2, 500]], 4, "outside"),
        ([[1, 2]], 0, "max_new_tokens"),
    ],
)
def test_bad_inputs_are_named(prompts: Any, n: int, match: str) -> None:
    engine = Engine(from_hf_model(tiny_hf_model("qwen2")))
    with pytest.raises(InvalidInput, match=match):
        engine.generate_ids(prompts, n)


def test_graphs_need_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(InvalidInput, match="CUDA"):
        Engine(from_hf_model(tiny_hf_model("llama")), graphs=True)


class _CharTokenizer:
    """A byte-level toy tokenizer over a 97-token vocabulary (no download)."""

    eos_token_id = 96
    pad_token_id = 0
    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [1 + (ord(c) % 90) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(32 + t % 90) for t in ids if not (skip_special_tokens and t == 96))


def test_text_generate_and_stream_agree() -> None:
    hf = tiny_hf_model("qwen3")
    tok = _CharTokenizer()
    pieces: list[str] = []
    out = generate(hf, tok, "hello", max_new_tokens=12, stream=lambda r, s: pieces.append(s))
    assert "".join(pieces) == out.texts[0]
    ids = tok.encode("hello")
    assert out.tokens[0] == _hf_greedy(hf, ids, 12)[: len(out.tokens[0])]


def test_chat_loop_scripted() -> None:
    hf = tiny_hf_model("llama")
    tok = _CharTokenizer()
    script = iter(["hi there", "/reset", "again", "/exit"])
    written: list[str] = []
    msgs = chat_loop(hf, tok, max_new_tokens=6, read=lambda _p: next(script), write=written.append)
    assert [m["role"] for m in msgs] == ["user", "assistant"]
    assert msgs[0]["content"] == "again"
    assert "(conversation reset)\n" in written
    assert format_chat(tok, msgs[:1])[-len(tok.encode("Assistant:")) :] == tok.encode("Assistant:")


def test_memory_report_counts_weights_and_cache() -> None:
    hf = tiny_hf_model("qwen3")  # tied head: the embedding is counted once
    engine = Engine(from_hf_model(hf))
    engine.generate_ids([[1, 2, 3]], 5)
    mem = engine.memory()
    n_params = sum(p.numel() for p in hf.parameters())  # parameters() yields a tied tensor once
    rope = engine.model.inv_freq.numel() * 4  # the RoPE table is a buffer of the model too
    assert mem["weights"] == 4 * n_params + rope
    assert mem["embed_head"] == 4 * hf.config.vocab_size * hf.config.hidden_size
    a = engine.model.args
    assert mem["kv_cache"] == 2 * a.n_layers * 1 * a.n_kv_heads * 128 * a.head_dim * 4


def test_reference_fallback_on_an_accelerator_is_announced() -> None:
    from leechq.serve.build import execution_paths, warn_if_reference
    from leechq.serve.random_codes import model_args, random_quantized_model

    model = random_quantized_model(model_args("qwen3-tiny"), "cpu", torch.float32, int4_v=True)
    assert execution_paths(model) == {"dense": 14}
    with pytest.warns(UserWarning, match=r"14 of 14 quantized modules on cuda run the dense"):
        warn_if_reference(model, torch.device("cuda"))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_reference(model, torch.device("cpu"))  # the CPU path is the reference by design


def test_prefill_buckets() -> None:
    from leechq.serve.generate import prefill_bucket

    assert [prefill_bucket(n) for n in (1, 16, 17, 100, 256, 257, 700)] == \
        [16, 16, 32, 128, 256, 512, 768]


def test_padded_prefill_equals_unpadded() -> None:
    """The bucket padding the engine applies on CUDA (forced here on the CPU) leaves the tokens
    unchanged: padding positions are invisible to the prompt's."""
    model = from_hf_model(tiny_hf_model("qwen3"))
    plain = Engine(model)
    padded = Engine(model)
    padded.pad_prompts = True
    prompts = [[5, 9, 13, 2, 77, 31, 4], [8, 8, 1]]
    assert padded._prefill_span(7, 10, 128) == 16
    assert padded.generate_ids(prompts, 10).tokens == plain.generate_ids(prompts, 10).tokens
    assert padded._prefill_span(120, 10, 128) == 120  # no room for the bucket: unpadded
    long = [[(7 * i) % 97 for i in range(120)]]
    assert padded.generate_ids(long, 5).tokens == plain.generate_ids(long, 5).tokens
    assert padded.session(1, 0).seq_len == 256  # the engine sized the cache for the bucket
    assert plain.session(1, 0).seq_len == 128
