"""Where the time of a served step goes: the decode step by kernel kind, and the prefill's host
and device time (issue 4's "report where the time goes", beyond the projections).

Run on a CUDA machine from the repository root::

    PYTHONPATH=src python benchmarks/step_breakdown.py --model qwen3-8b --arms fp16,tetra48

For each arm (built as ``bench_e2e`` builds it: random codes at real shapes, fp16 embedding and
head) and batch 1:

1. **Decode step under its CUDA graph**: ms per step (median of ``--repeats`` generations), then
   one profiled run of graph replays: the kernels' summed durations by kind (``m1`` projections,
   rotations, attention, compiled pieces, GEMMs, ...). Under programmatic dependent launch kernels
   overlap, so a kind's sum can exceed its share of the wall time; ``busy`` is the sum of all.
2. **Prefill** of ``--prompt-lens`` tokens as the engine runs it (a captured graph per bucket
   width since session s; eager before): wall ms (median of ``--repeats``), and in one profiled
   run the device busy time, the kernel launches and the host operators with the most self
   time.

The last stdout line is one JSON object ``{"bench": "step_breakdown", ...}``, also written to
``$OUT/step-breakdown.json`` when ``OUT`` is set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_e2e

from leechq.serve.generate import Engine

KINDS = (
    ("m1", ("m1_kernel",)),
    ("rotation", ("rotate", "norm_rot", "silu_mul_rot")),
    ("int8", ("imma",)),
    ("dequant", ("dequant",)),
    ("epilogue", ("scale_tail",)),
    ("attention", ("fmha", "flash", "attention", "attn", "softmax")),
    ("gemm/gemv", ("gemm", "gemv", "cutlass", "xmma", "nvjet", "splitk", "sm90")),
    ("compiled pieces", ("triton_",)),
    ("copies", ("copy", "index", "cat", "fill", "elementwise", "reduce", "where", "scatter")),
)
"""Kernel kinds by name fragments (first match wins; anything else is ``other``)."""


def kind_of(name: str) -> str:
    low = name.lower()
    for kind, frags in KINDS:
        if any(f in low for f in frags):
            return kind
    return "other"


def kernel_events(prof: Any) -> list[Any]:
    return [e for e in prof.events() if e.device_type.name == "CUDA"]


def by_kind(events: list[Any], n: int) -> dict[str, dict[str, float]]:
    """Launches and summed ms per step of each kernel kind (``n`` steps profiled)."""
    out: dict[str, dict[str, float]] = {}
    for e in events:
        entry = out.setdefault(kind_of(e.name), {"launches": 0.0, "ms": 0.0})
        entry["launches"] += 1
        entry["ms"] += e.time_range.elapsed_us() / 1000
    return {k: {"launches": round(v["launches"] / n, 1), "ms": round(v["ms"] / n, 4)}
            for k, v in sorted(out.items(), key=lambda kv: -kv[1]["ms"])}


def top_names(events: list[Any], n: int, top: int = 12) -> list[dict[str, Any]]:
    agg: dict[str, list[float]] = {}
    for e in events:
        entry = agg.setdefault(e.name[:90], [0, 0.0])
        entry[0] += 1
        entry[1] += e.time_range.elapsed_us() / 1000
    rows = sorted(agg.items(), key=lambda kv: -kv[1][1])[:top]
    return [{"name": k, "launches": round(c / n, 1), "ms": round(t / n, 4)} for k, (c, t) in rows]


@torch.no_grad()
def decode_breakdown(engine: Engine, vocab: int, seq_len: int, repeats: int) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    prompts = bench_e2e.random_prompts(1, 32, vocab, seed=1)
    new = 64
    engine.generate_ids(prompts, new, seq_len=seq_len)  # warm-up: compile, capture
    runs = [engine.generate_ids(prompts, new, seq_len=seq_len) for _ in range(repeats)]
    ms = statistics.median(1000 * r.decode_s / r.steps for r in runs)
    sess = engine.session(1, seq_len)
    graph = next(iter(sess.graphs.values()))
    n = 20
    bench_e2e.sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            graph()
        bench_e2e.sync()
    events = kernel_events(prof)
    busy = sum(e.time_range.elapsed_us() for e in events) / 1000 / n
    return {"ms_per_step": round(ms, 4), "kernels_per_step": round(len(events) / n, 1),
            "busy_ms": round(busy, 4), "kinds": by_kind(events, n),
            "top": top_names(events, n)}


@torch.no_grad()
def prefill_breakdown(engine: Engine, vocab: int, seq_len: int, length: int,
                      repeats: int) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    prompts = bench_e2e.random_prompts(1, length, vocab, seed=length)
    engine.generate_ids(prompts, 1, seq_len=seq_len)  # warm-up: this width's kernels compiled
    walls = []
    for _ in range(repeats):
        bench_e2e.sync()
        walls.append(1000 * engine.generate_ids(prompts, 1, seq_len=seq_len).prefill_s)
    bench_e2e.sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        engine.generate_ids(prompts, 1, seq_len=seq_len)
        bench_e2e.sync()
        wall_prof = 1000 * (time.perf_counter() - t0)
    events = kernel_events(prof)
    busy = sum(e.time_range.elapsed_us() for e in events) / 1000
    host = sorted(
        (a for a in prof.key_averages() if a.self_cpu_time_total > 0),
        key=lambda a: -a.self_cpu_time_total)[:15]
    return {
        "prompt_len": length,
        "prefill_ms": round(statistics.median(walls), 2),
        "prefill_ms_all": [round(w, 2) for w in walls],
        "profiled_wall_ms": round(wall_prof, 2),
        "device_busy_ms": round(busy, 3),
        "kernels": len(events),
        "kinds": by_kind(events, 1),
        "host_self_ms": [{"op": a.key[:70], "calls": a.count,
                          "self_ms": round(a.self_cpu_time_total / 1000, 3)} for a in host],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="qwen3-8b")
    p.add_argument("--arms", default="fp16,tetra48")
    p.add_argument("--prompt-lens", default="32,512")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--no-decode", action="store_true")
    p.add_argument("--no-prefill", action="store_true")
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("step_breakdown needs a CUDA device", file=sys.stderr)
        return 2
    results: list[dict[str, Any]] = []
    for arm in a.arms.split(","):
        model, info = bench_e2e.build_arm(arm, a.model)
        engine = Engine(model)
        vocab = model.args.vocab_size
        row: dict[str, Any] = {"model": a.model, "arm": arm, "batch": 1, **info}
        with bench_e2e._arm_env(arm):
            if not a.no_decode:
                row["decode"] = decode_breakdown(engine, vocab, a.seq_len, a.repeats)
                d = row["decode"]
                print(f"{arm:10s} decode {d['ms_per_step']:.3f} ms/step, busy {d['busy_ms']:.3f}"
                      f" ms, {d['kernels_per_step']} kernels", flush=True)
                for k, v in d["kinds"].items():
                    print(f"    {k:16s} {v['launches']:7.1f} {v['ms']:8.4f} ms", flush=True)
            row["prefill"] = []
            for length in ([] if a.no_prefill else [int(s) for s in a.prompt_lens.split(",")]):
                pf = prefill_breakdown(engine, vocab, a.seq_len, length, a.repeats)
                row["prefill"].append(pf)
                print(f"{arm:10s} prefill {length:5d}: {pf['prefill_ms']:8.2f} ms wall, device "
                      f"busy {pf['device_busy_ms']:7.2f} ms, {pf['kernels']} kernels", flush=True)
                for k, v in pf["kinds"].items():
                    print(f"    {k:16s} {v['launches']:7.1f} {v['ms']:8.4f} ms", flush=True)
                for h in pf["host_self_ms"][:8]:
                    print(f"    host {h['op']:50s} {h['calls']:6d} {h['self_ms']:9.3f} ms",
                          flush=True)
        results.append(row)
        engine.release()
        del engine, model
        bench_e2e.free()
    record = {"bench": "step_breakdown", **bench_e2e.environment(), "results": results}
    out = os.environ.get("OUT")
    if out:
        Path(out, "step-breakdown.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
