"""GPU tier of continuous batching: captured decode steps per bucket equal eager steps, concurrent
equals sequential, the fused quantized model and ``leechq serve`` on CUDA.

Run on a CUDA machine: ``PYTHONPATH=src python -m pytest tests/serve/test_scheduler_gpu.py -m gpu``.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from leechq.serve.build import from_hf_model
from leechq.serve.generate import Engine
from leechq.serve.random_codes import model_args, random_quantized_model
from leechq.serve.sampling import SamplingConfig
from leechq.serve.scheduler import Request, Scheduler

from .conftest import tiny_hf_model

pytestmark = pytest.mark.gpu


def _prompts(n: int, vocab: int = 97) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(4, vocab, (int(s),), generator=g).tolist()
            for s in torch.randint(1, 40, (n,), generator=g)]


def _run_all(engine: Engine, prompts: list[list[int]], cfgs: list[SamplingConfig], n: int,
             rows: int) -> list[list[int]]:
    """Every request submitted at once (they all join the first prefill) and run to n tokens."""
    sched = Scheduler(engine, max_batch=rows, max_context=96)
    try:
        with sched._cv:  # the worker sees all of them together: the same bucket history each run
            hs = [sched.submit(Request(p, n, c, stop_ids=[]))
                  for p, c in zip(prompts, cfgs, strict=True)]
        return [h.result(timeout=300)[0] for h in hs]
    finally:
        sched.close()


def _mixed(n: int) -> list[SamplingConfig]:
    return [SamplingConfig() if i % 2 else
            SamplingConfig(temperature=0.9, top_k=30, top_p=0.9, presence_penalty=0.3, seed=i)
            for i in range(n)]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_pool_graphs_equal_eager_steps(arch: str) -> None:
    pytest.importorskip("transformers")
    model = from_hf_model(tiny_hf_model(arch), dtype=torch.float16, device="cuda")
    prompts = _prompts(6)
    a = _run_all(Engine(model, graphs=True, compile=True), prompts, _mixed(6), 40, 8)
    b = _run_all(Engine(model, graphs=False, compile=True), prompts, _mixed(6), 40, 8)
    assert a == b and all(len(t) == 40 for t in a)


def test_concurrent_equals_sequential_float32() -> None:
    pytest.importorskip("transformers")
    model = from_hf_model(tiny_hf_model("qwen3"), dtype=torch.float32, device="cuda")
    engine = Engine(model)
    prompts = _prompts(12)
    sched = Scheduler(engine, max_batch=4, max_context=96)
    try:
        conc = [h.result(timeout=300)[0] for h in
                [sched.submit(Request(p, 24, stop_ids=[])) for p in prompts]]
        seq = [sched.submit(Request(p, 24, stop_ids=[])).result(timeout=300)[0]
               for p in prompts]
    finally:
        sched.close()
    assert conc == seq


def test_fused_quantized_pool_graphs_equal_eager() -> None:
    args = model_args("qwen3-tiny")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = random_quantized_model(args, "cuda", torch.float16, seed=0, prefer="fused")
    prompts = _prompts(8, args.vocab_size)
    a = _run_all(Engine(model, graphs=True), prompts, _mixed(8), 32, 8)
    b = _run_all(Engine(model, graphs=False), prompts, _mixed(8), 32, 8)
    assert a == b


def test_openai_client_against_a_cuda_artifact(tmp_path: Any) -> None:
    pytest.importorskip("fastapi")
    openai = pytest.importorskip("openai")
    from leechq_tiny import make_artifact

    from leechq.models.load import load
    from leechq.serve.generate import engine_for, stop_ids_for
    from leechq.serve.server import ServerThread, create_app

    out, _ = make_artifact(tmp_path, "qwen3")
    model, tok = load(out, device="cuda")
    sched = Scheduler(engine_for(model), tok, max_batch=4, max_context=96,
                      stop_ids=stop_ids_for(model, tok))
    sched.pool.warmup()
    server = ServerThread(create_app(sched, tok, "tiny"))
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        msgs = [{"role": "user", "content": "the water is here"}]
        whole = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=16,
                                               temperature=0)
        parts = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=16,
                                               temperature=0, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
        assert text == whole.choices[0].message.content
        assert whole.usage.completion_tokens >= 1
    finally:
        server.stop()
        sched.close()
