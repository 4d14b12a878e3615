"""Continuous batching on CPU: the slot pool and the scheduler give every request the tokens it
gets alone, whatever joins or leaves around it."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from leechq.errors import InvalidInput
from leechq.serve.build import from_hf_model
from leechq.serve.generate import Engine
from leechq.serve.pool import SlotPool, batch_bucket
from leechq.serve.sampling import RowSampler, SamplingConfig, row_uniforms
from leechq.serve.scheduler import QueueFull, Request, Scheduler

from .conftest import tiny_hf_model

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(from_hf_model(tiny_hf_model("qwen3")))


def _prompts(n: int, seed: int = 0, longest: int = 30) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, longest, (n,), generator=g).tolist()
    return [torch.randint(4, 97, (s,), generator=g).tolist() for s in sizes]


def test_batch_bucket() -> None:
    assert [batch_bucket(n, 6) for n in (1, 2, 3, 4, 5, 6)] == [1, 2, 4, 4, 6, 6]


def test_concurrent_greedy_equals_alone_with_rebases(engine: Engine) -> None:
    prompts = _prompts(16)
    alone = [engine.generate_ids([p], 20).tokens[0] for p in prompts]
    # 4 rows and a 64-token context: requests queue, join mid-flight, and the clock is rebased.
    sched = Scheduler(engine, max_batch=4, max_context=64)
    try:
        handles = [sched.submit(Request(p, 20)) for p in prompts]
        got = [h.result(timeout=60)[0] for h in handles]
        assert got == alone
        assert all(h.finish_reason == "length" and h.completion_tokens == 20 for h in handles)
        assert sched.stats()["rows"] == 4
    finally:
        sched.close()


def test_sliding_window_rows_through_the_pool_equal_alone() -> None:
    """Gemma-3's sliding layers (window 5) under the pool's shared clock and rebases: the window
    is on token positions, so a row's tokens do not depend on the rows beside it."""
    gemma = Engine(from_hf_model(tiny_hf_model("gemma3")))
    prompts = _prompts(6, seed=1)
    alone = [gemma.generate_ids([p], 16).tokens[0] for p in prompts]
    sched = Scheduler(gemma, max_batch=4, max_context=48)
    try:
        handles = [sched.submit(Request(p, 16, stop_ids=[])) for p in prompts]
        assert [h.result(timeout=60)[0] for h in handles] == alone
    finally:
        sched.close()


def test_pool_rebase_keeps_positions(engine: Engine) -> None:
    pool = SlotPool(engine, rows=2, context=16)
    p = _prompts(1, seed=3, longest=8)[0]
    alone = engine.generate_ids([p], 15 - len(p)).tokens[0]
    rows, first = pool.admit([p], [SamplingConfig()], [0])
    toks = [first[0]]
    rebased = False
    while len(toks) < len(alone):
        before = pool.clock
        toks.append(pool.step()[rows[0]])
        rebased |= pool.clock != before + 1
        if len(toks) == 4:
            pool.rebase(pool.live_span() + 3)  # an explicit move mid-request
            rebased = True
    assert rebased and toks == alone
    with pytest.raises(InvalidInput, match="rebase"):
        pool.rebase(pool.live_span() - 1)


def test_seeded_sampling_does_not_depend_on_the_batch(engine: Engine) -> None:
    prompts = _prompts(6, seed=1)
    cfgs = [SamplingConfig(temperature=0.9, top_k=20, top_p=0.9, min_p=0.05, seed=i,
                           presence_penalty=0.5, frequency_penalty=0.3) for i in range(6)]
    sched = Scheduler(engine, max_batch=8, max_context=64, max_prefill_tokens=64)
    admit, batches = sched.pool.admit, []

    def counted(prompts: list[list[int]], *a: Any) -> Any:
        batches.append(len(prompts) * max(map(len, prompts)))
        return admit(prompts, *a)

    sched.pool.admit = counted  # type: ignore[method-assign]
    try:
        with sched._cv:  # all six wait together: the prefill budget splits them
            together = [sched.submit(Request(p, 12, c))
                        for p, c in zip(prompts, cfgs, strict=True)]
        together_t = [h.result(timeout=60)[0] for h in together]
        assert len(batches) > 1 and all(b <= 64 for b in batches)
        alone = [sched.submit(Request(p, 12, c)).result(timeout=60)[0]
                 for p, c in zip(prompts, cfgs, strict=True)]
        assert together_t == alone
        other = sched.submit(Request(prompts[0], 12, SamplingConfig(temperature=0.9, seed=99)))
        assert other.result(timeout=60)[0] != alone[0]  # another seed, another stream
    finally:
        sched.close()


def test_mixed_greedy_and_sampled_rows(engine: Engine) -> None:
    prompts = _prompts(4, seed=2)
    alone = [engine.generate_ids([p], 10).tokens[0] for p in prompts[:2]]
    sched = Scheduler(engine, max_batch=4, max_context=64)
    try:
        hs = [sched.submit(Request(p, 10)) for p in prompts[:2]]
        hs += [sched.submit(Request(p, 10, SamplingConfig(temperature=1.0, seed=5)))
               for p in prompts[2:]]
        res = [h.result(timeout=60)[0] for h in hs]
        assert res[:2] == alone
    finally:
        sched.close()


def test_penalties_change_greedy_tokens_like_openai(engine: Engine) -> None:
    """A frequency penalty subtracts count × penalty from the logits (checked on the sampler)."""
    s = RowSampler(2, 5, "cpu")
    for r in range(2):
        s.load(r, SamplingConfig(frequency_penalty=2.0 if r == 0 else 0.0), seed=0, prompt=[])
    s.counts[:, 1] = 1
    logits = torch.tensor([[0.0, 1.5, 0.2, 0.0, 0.0]] * 2)
    assert s.select(logits, 2, (False, False, True)).tolist() == [2, 1]
    assert s.counts[:, 2].tolist() == [1, 0] and s.counts[:, 1].tolist() == [1, 2]


def test_row_uniforms_are_uniform_and_keyed() -> None:
    u = row_uniforms(torch.tensor([1, 1, 2]), torch.tensor([0, 1, 0]), 50000)
    assert bool((u > 0).all() and (u < 1).all())
    assert abs(float(u.mean()) - 0.5) < 0.01
    assert not torch.equal(u[0], u[1]) and not torch.equal(u[0], u[2])
    again = row_uniforms(torch.tensor([1]), torch.tensor([0]), 50000)
    assert torch.equal(again[0], u[0])


class _Tok:
    """Decodes id i to the word ``w{i}`` (space separated)."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(f" w{i}" for i in ids)


def test_stop_ids_and_stop_strings(engine: Engine) -> None:
    p = _prompts(1, seed=4)[0]
    free = engine.generate_ids([p], 12).tokens[0]
    sched = Scheduler(engine, tokenizer=_Tok(), max_batch=2, max_context=64)
    try:
        ids, text, reason = sched.submit(Request(p, 12, stop_ids=[free[4]])).result(timeout=60)
        k = free.index(free[4])
        assert ids == free[: k + 1] and reason == "stop"
        assert text == "".join(f" w{i}" for i in free[:k])  # the stop id's text is left out
        stop = f" w{free[3]}"
        ids, text, reason = sched.submit(Request(p, 12, stop=[stop], stop_ids=[])).result(60)
        full = "".join(f" w{i}" for i in free)
        assert reason == "stop" and text == full[: full.index(stop)]
        ids, text, reason = sched.submit(Request(p, 12, stop=["zz"], stop_ids=[])).result(60)
        assert reason == "length" and text == full and ids == free
    finally:
        sched.close()


def test_cancel_frees_the_row_and_queue_is_bounded(engine: Engine) -> None:
    sched = Scheduler(engine, max_batch=1, max_context=128, max_queue=1)
    step = sched.pool.step

    def slow_step() -> list[int]:
        time.sleep(0.02)
        return step()

    sched.pool.step = slow_step  # type: ignore[method-assign]
    try:
        p = _prompts(1)[0]
        running = sched.submit(Request(p, 100, stop_ids=[]))
        deadline = time.monotonic() + 10
        while sched.stats()["running"] == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        waiting = sched.submit(Request(p, 3, stop_ids=[]))
        with pytest.raises(QueueFull):
            sched.submit(Request(p, 3))
        sched.cancel(running)
        ids, _, reason = running.result(timeout=30)
        assert reason == "cancelled" and len(ids) < 100
        assert waiting.result(timeout=30)[2] == "length"
        assert sched.stats() == {**sched.stats(), "running": 0, "waiting": 0, "rows": 1}
    finally:
        sched.close()


@pytest.mark.parametrize(
    ("request_", "match"),
    [
        (Request([]), "empty"),
        (Request([5, 1000]), "outside"),
        (Request([5] * 40, max_tokens=30), "context"),
        (Request([5] * 64), "context"),
        (Request([5], max_tokens=0), "max_tokens"),
    ],
)
def test_bad_requests_are_refused(engine: Engine, request_: Request, match: str) -> None:
    sched = Scheduler(engine, max_batch=1, max_context=64)
    try:
        with pytest.raises(InvalidInput, match=match):
            sched.submit(request_)
    finally:
        sched.close()


def test_async_iteration(engine: Engine) -> None:
    import asyncio

    p = _prompts(1, seed=7)[0]
    alone = engine.generate_ids([p], 8).tokens[0]
    sched = Scheduler(engine, max_batch=2, max_context=64)

    async def main() -> list[Any]:
        h = sched.submit(Request(p, 8))
        return [ev async for ev in h]

    try:
        events = asyncio.run(main())
        assert [t for ev in events for t in ev.token_ids] == alone
        assert events[-1].finish_reason == "length"
    finally:
        sched.close()


@pytest.mark.interp
def test_pool_through_the_decode_attention_kernel(engine: Engine,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The decode kernel (Triton interpreter) reads each row's slots of the shared clock as the
    masked SDPA does: the same tokens, with a rebase on the way."""
    pytest.importorskip("triton")
    if __import__("os").environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs TRITON_INTERPRET=1")
    prompts = _prompts(3, seed=8, longest=12)

    def run() -> list[list[int]]:
        sched = Scheduler(engine, max_batch=2, max_context=24)
        try:
            hs = [sched.submit(Request(p, 6, stop_ids=[])) for p in prompts]
            return [h.result(timeout=300)[0] for h in hs]
        finally:
            sched.close()

    from leechq.serve import model as serve_model

    monkeypatch.setattr(serve_model, "INTERPRETED_DECODE_KERNEL", False)
    sdpa = run()
    from leechq.kernels.triton import ops

    calls = []
    kernel = ops.decode_attention

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(ops, "decode_attention", counted)
    monkeypatch.setattr(serve_model, "INTERPRETED_DECODE_KERNEL", True)
    assert run() == sdpa
    assert calls  # the decode steps went through the kernel


def test_a_failing_step_fails_every_request_loudly(engine: Engine) -> None:
    from leechq.serve.scheduler import SchedulerClosed

    sched = Scheduler(engine, max_batch=2, max_context=64)

    def broken() -> list[int]:
        raise RuntimeError("device lost")

    sched.pool.step = broken  # type: ignore[method-assign]
    handles = [sched.submit(Request(p, 5)) for p in _prompts(3)]
    for h in handles:
        with pytest.raises(SchedulerClosed, match="device lost"):
            h.result(timeout=30)
    assert not sched.alive and "device lost" in (sched.error or "")
    with pytest.raises(SchedulerClosed):
        sched.submit(Request([5], 2))
