"""Serving benchmark: aggregate tokens/s and time to first token of continuous batching at 1, 4, 16
and 32 concurrent streams, 2-bit (random Tetra codes) against fp16 in the same process.

Run on a CUDA machine from the repository root::

    PYTHONPATH=src python benchmarks/bench_serve.py                      # Qwen3-8B shape
    PYTHONPATH=src python benchmarks/bench_serve.py --tiny --device cpu  # a dry run, seconds

Protocol, per arm (``tetra48``: every projection a random Tetra matrix, fused kernels, fp16
embedding and head — :func:`leechq.serve.random_codes.random_quantized_model`; ``fp16``: the same
shape with dense fp16 weights, the same engine): one :class:`~leechq.serve.scheduler.Scheduler`
with ``--max-batch`` rows (decode graphs of every bucket captured before timing), one warm-up
round at the highest concurrency, then for each concurrency ``c``: ``c`` client threads, each
submitting ``--requests`` requests one after another (random prompts of ``--prompt-len`` tokens,
exactly ``--new-tokens`` greedy tokens: no end-of-sequence id). Requests join and leave the running
batch as they come, as a server's would.

Reported per (arm, c): ``agg_tok_s`` = generated tokens of all requests / wall time of the round
(prefills included), ``ttft_ms`` median and p90 (submission to first token, queueing included),
``itl_ms`` median inter-token latency per request, ``steps`` (decode steps of the round).
``ratio_vs_fp16`` divides ``agg_tok_s`` by the fp16 arm's at the same ``c``.

The last stdout line is one JSON object ``{"bench": "serve", ...}`` (also written to ``$OUT`` when
that is set).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from leechq.serve.build import random_dense
from leechq.serve.generate import Engine
from leechq.serve.random_codes import model_args, random_quantized_model
from leechq.serve.scheduler import Request, Scheduler


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def build(arm: str, shape: str, device: str) -> Any:
    args = model_args(shape)
    dtype = torch.float16 if device.startswith("cuda") else torch.float32
    if arm == "fp16":
        return random_dense(args, dtype, device, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return random_quantized_model(args, device, dtype, seed=0,
                                      direct=device.startswith("cuda"))


def one_round(sched: Scheduler, streams: int, requests: int, prompt_len: int, new_tokens: int,
              vocab: int, seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    prompts = [[torch.randint(0, vocab, (prompt_len,), generator=g).tolist()
                for _ in range(requests)] for _ in range(streams)]
    ttft: list[float] = []
    itl: list[float] = []
    tokens = [0] * streams
    lock = threading.Lock()

    def client(i: int) -> None:
        for p in prompts[i]:
            t0 = time.perf_counter()
            h = sched.submit(Request(p, new_tokens, stop_ids=[]))
            first = last = None
            n = 0
            for ev in h.events(timeout=600):
                now = time.perf_counter()
                if ev.token_ids:
                    n += len(ev.token_ids)
                    if first is None:
                        first = now
                    last = now
            if ev.error:
                raise RuntimeError(ev.error)
            with lock:
                tokens[i] += n
                if first is not None:
                    ttft.append(first - t0)
                    if n > 1 and last is not None:
                        itl.append((last - first) / (n - 1))

    steps0 = sched.steps
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    q = statistics.quantiles(ttft, n=10) if len(ttft) > 1 else ttft * 9
    return {
        "streams": streams,
        "requests": streams * requests,
        "tokens": sum(tokens),
        "wall_s": round(wall, 3),
        "agg_tok_s": round(sum(tokens) / wall, 1),
        "ttft_ms": round(1e3 * statistics.median(ttft), 2),
        "ttft_p90_ms": round(1e3 * q[-1], 2),
        "itl_ms": round(1e3 * statistics.median(itl), 3) if itl else None,
        "steps": sched.steps - steps0,
    }


def bench_arm(arm: str, a: argparse.Namespace) -> list[dict[str, Any]]:
    t0 = time.perf_counter()
    model = build(arm, a.shape, a.device)
    engine = Engine(model)
    sched = Scheduler(engine, max_batch=a.max_batch, max_context=a.prompt_len + a.new_tokens)
    log(f"[{arm}] built in {time.perf_counter() - t0:.1f}s; capturing")
    sched.pool.warmup()
    vocab = model.args.vocab_size
    top = max(a.streams)
    one_round(sched, top, 1, a.prompt_len, a.new_tokens, vocab, seed=99)  # compile, prefills
    rows = []
    for c in a.streams:
        r = one_round(sched, c, a.requests, a.prompt_len, a.new_tokens, vocab, seed=c)
        r["arm"] = arm
        rows.append(r)
        log(f"[{arm}] c={c}: {r['agg_tok_s']} tok/s, ttft {r['ttft_ms']} ms "
            f"(p90 {r['ttft_p90_ms']}), itl {r['itl_ms']} ms, {r['steps']} steps")
    sched.close()
    del sched, engine, model
    gc.collect()
    if a.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="qwen3-8b", help="a leechq.serve.random_codes shape")
    p.add_argument("--tiny", action="store_true", help="the qwen3-tiny shape, short requests")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--arms", default="tetra48,fp16")
    p.add_argument("--streams", default="1,4,16,32", help="concurrencies")
    p.add_argument("--requests", type=int, default=2, help="requests per stream and round")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--max-batch", type=int, default=None, help="pool rows [max of --streams]")
    a = p.parse_args()
    a.streams = [int(s) for s in a.streams.split(",")]
    if a.tiny:
        a.shape, a.prompt_len, a.new_tokens = "qwen3-tiny", 16, 16
    a.max_batch = a.max_batch or max(a.streams)
    results = []
    for arm in a.arms.split(","):
        results += bench_arm(arm, a)
    fp16 = {r["streams"]: r["agg_tok_s"] for r in results if r["arm"] == "fp16"}
    for r in results:
        if r["streams"] in fp16 and fp16[r["streams"]]:
            r["ratio_vs_fp16"] = round(r["agg_tok_s"] / fp16[r["streams"]], 3)
    out = {
        "bench": "serve", "shape": a.shape, "device": a.device,
        "gpu": torch.cuda.get_device_name() if a.device.startswith("cuda") else None,
        "torch": torch.__version__, "prompt_len": a.prompt_len, "new_tokens": a.new_tokens,
        "requests_per_stream": a.requests, "max_batch": a.max_batch, "results": results,
    }
    line = json.dumps(out)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "bench_serve.json").write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
