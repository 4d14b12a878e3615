"""Throughput of the batched exact ball search (codebooks.ball_search), verified before it is timed.

1. Verify: the search on ``--device`` must return exactly the CPU search's points and scores on
   Gaussian and adversarial blocks (ties, zeros, repeated values, one-hots, extreme scales), for
   both stage-1 dtypes, and the CPU search must equal the numpy reference on a subset.
2. Time: blocks/s of ``search_batch`` (Λ24(12), exact) for several chunk sizes and both stage-1
   dtypes on ``--device``, the approximate mode for comparison, and the CPU with all its threads.
3. Optionally profile one chunk (``--profile FILE``): where the time goes, per kernel.

Usage: ``python benchmarks/ball_search_throughput.py --device cuda [--blocks 65536] [--profile
p.txt]``. The last stdout line is JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch

from leechq.codebooks import ball_search as bs
from leechq.lattice import nearest as nr


def adversarial(rng: np.random.Generator, count: int) -> np.ndarray:
    rows = []
    for k in range(count):
        kind = k % 6
        if kind == 0:
            x = rng.integers(-2, 3, 24).astype(np.float64)
        elif kind == 1:
            x = np.zeros(24)
            x[rng.choice(24, int(rng.integers(1, 5)), replace=False)] = rng.choice([-1.0, 1.0])
        elif kind == 2:
            x = rng.choice([-1.0, 0.0, 1.0, 2.0, 0.5], 24)
        elif kind == 3:
            x = rng.standard_normal(24) * 10.0 ** float(rng.integers(-30, 30))
        elif kind == 4:
            x = np.round(rng.standard_normal(24) * 2) / 2
        else:
            x = np.abs(rng.standard_normal(24)).astype(np.float32).astype(np.float64)
            x[:12] = x[12:] * rng.choice([-1.0, 1.0], 12)
        rows.append(x)
    return np.array(rows)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def rate(x: torch.Tensor, **kwargs: object) -> float:
    """Blocks per second of one search_batch call on x (after a warm-up call)."""
    bs.search_batch(x[: min(len(x), 4096)], **kwargs)  # type: ignore[arg-type]
    sync(x.device)
    start = time.perf_counter()
    bs.search_batch(x, **kwargs)  # type: ignore[arg-type]
    sync(x.device)
    return x.shape[0] / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--blocks", type=int, default=65536)
    parser.add_argument("--verify-blocks", type=int, default=3000)
    parser.add_argument("--reference-blocks", type=int, default=100)
    parser.add_argument("--chunks", default="1024,2048,4096")
    parser.add_argument("--cpu-blocks", type=int, default=2000)
    parser.add_argument("--profile", default="")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    out: dict[str, object] = {"device": str(device), "torch": torch.__version__}
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    out["cpu_threads"] = torch.get_num_threads()

    # 1. verification
    rng = np.random.default_rng(2026)
    xv = torch.from_numpy(np.concatenate([
        rng.standard_normal((args.verify_blocks, 24)), adversarial(rng, 300), np.zeros((2, 24))
    ]))
    t0 = time.perf_counter()
    cpu_p, cpu_s = bs.search_batch(xv)
    out["cpu_verify_s"] = round(time.perf_counter() - t0, 2)
    for row in range(min(args.reference_blocks, xv.shape[0])):
        p, s = nr.search(xv[row].numpy())
        if not (np.array_equal(p, cpu_p[row].numpy()) and s == float(cpu_s[row])):
            raise SystemExit(f"CPU search differs from the reference on row {row}")
    adv = xv[args.verify_blocks : args.verify_blocks + 100]
    for row in range(adv.shape[0]):
        p, _ = nr.search(adv[row].numpy())
        if not np.array_equal(p, cpu_p[args.verify_blocks + row].numpy()):
            raise SystemExit(f"CPU search differs from the reference on adversarial row {row}")
    if device.type != "cpu":
        for dtype in (torch.float32, torch.float64):
            p, s = bs.search_batch(xv.to(device), work_dtype=dtype)
            if not (torch.equal(p.cpu(), cpu_p) and torch.equal(s.cpu(), cpu_s)):
                diff = int((p.cpu() != cpu_p).any(dim=1).sum())
                raise SystemExit(f"{device} ({dtype}) differs from CPU on {diff} rows")
    out["verified_blocks"] = xv.shape[0]
    print(f"verified {xv.shape[0]} blocks: {device} == CPU == reference subset", flush=True)

    # 2. throughput
    x = torch.randn(args.blocks, 24, generator=torch.Generator().manual_seed(0)).to(device)
    results: dict[str, float] = {}
    if device.type != "cpu":
        for dtype in (torch.float32, torch.float64):
            for chunk in [int(c) for c in args.chunks.split(",")]:
                key = f"exact {str(dtype)[6:]} chunk {chunk}"
                results[key] = rate(x, work_dtype=dtype, chunk_size=chunk)
                print(f"{key}: {results[key]:,.0f} blocks/s", flush=True)
        memory = {}
        for dtype in (torch.float32, torch.float64):
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
            bs.search_batch(x[:4096], work_dtype=dtype, chunk_size=4096)
            peak = torch.cuda.max_memory_allocated(device) - base
            memory[str(dtype)[6:]] = round(peak / 4096 / 2**20, 2)
        out["peak_mib_per_query_chunk_4096"] = memory
        print(f"peak temporaries per query (MiB): {memory}", flush=True)
        out["default_chunk"] = bs.default_chunk(device)
        best = max((v, k) for k, v in results.items() if "float32" in k)[1]
        chunk = int(best.split()[-1])
        for top in (16, 24):
            key = f"approx top {top} float32 chunk {chunk}"
            results[key] = rate(x, mode="approx", top_classes=top, chunk_size=chunk)
            print(f"{key}: {results[key]:,.0f} blocks/s", flush=True)
        key = f"exact float32 chunk {chunk}, Λ24(13)"
        results[key] = rate(x, max_shell=13, chunk_size=chunk)
        print(f"{key}: {results[key]:,.0f} blocks/s", flush=True)
    xc = x[: args.cpu_blocks].cpu()
    results["cpu exact float32 chunk 32"] = rate(xc)
    print(f"cpu: {results['cpu exact float32 chunk 32']:,.0f} blocks/s", flush=True)
    out["blocks_per_s"] = results

    # 3. profile of one chunk
    if args.profile and device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        xp = x[:4096]
        bs.search_batch(xp, chunk_size=4096)
        sync(device)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            bs.search_batch(xp, chunk_size=4096)
            sync(device)
        table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=40)
        with open(args.profile, "w") as fh:
            fh.write(table)
        print(table, flush=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
