"""Tetra codec benchmark: decode / encode throughput, where the encoder's time goes, and quality.

Measures (tetra-format.md §1.5, layouts-kernels-recipe.md §2.8, leech-core.md §6.2):

* correctness first: device decode == CPU reference decode on random labels; for each encoder
  method (``fast``: tetra_fast, ``exact``: tetra_encoder's DP) device labels/cosines against the
  CPU ``exact`` encoder on 2000 Gaussian blocks;
* decoder blocks/s (device and CPU); CPU encoder blocks/s with one intra-op thread
  (``torch.set_num_threads(1)``) for ``fast`` at 1 and 2 worker threads and for ``exact``, with
  the machine's load average at the time; on a GPU, encoder blocks/s per chunk size and method;
* per-stage time of one ``exact`` search (end sections, middle section, join, backtrack, scoring);
* retention of each method on the §6.2 Gaussian protocol (1 gain bit, norm rule).

Usage: ``PYTHONPATH=src python benchmarks/bench_tetra_codec.py --device cuda --out result.json``
(GPU) or ``--device cpu --decode-blocks 1048576 --chunks ""`` (CPU only: skips the chunk sweep).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Callable

import numpy as np
import torch

from leechq.codebooks import tetra_encoder as te
from leechq.codebooks.tetra import decode, decode_reference
from leechq.utils.splitmix import SplitMix64

SEED = 0x64A42026


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best_time(fn: Callable[[], object], device: torch.device, repeats: int = 3) -> float:
    fn()
    _sync(device)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def _gaussians(eval_blocks: int) -> tuple[np.ndarray, np.ndarray]:
    rng = SplitMix64(SEED)
    train = rng.gaussians(24 * 4000).reshape(4000, 24)
    return train, rng.gaussians(24 * eval_blocks).reshape(eval_blocks, 24)


def _lloyd_max(samples: np.ndarray, levels: int = 2, iterations: int = 60) -> np.ndarray:
    ordered = np.sort(samples)
    c = np.array([ordered[(2 * j + 1) * ordered.size // (2 * levels)] for j in range(levels)])
    for _ in range(iterations):
        assign = np.argmin(np.abs(samples[:, None] - c[None, :]), axis=1)
        for j in range(levels):
            if (assign == j).any():
                c[j] = samples[assign == j].mean()
        c = np.sort(c)
    return c


def retention(train: np.ndarray, x: np.ndarray, labels: torch.Tensor) -> dict[str, float]:
    """MSE per coordinate and retention at R = 2 (1 gain bit, Lloyd–Max on train norms)."""
    centroids = _lloyd_max(np.linalg.norm(train, axis=1))
    y = decode(labels.cpu()).numpy().astype(np.float64)
    t = (x * y).sum(axis=1) / np.linalg.norm(y, axis=1)
    norms = np.linalg.norm(x, axis=1)
    g = centroids[np.argmin(np.abs(norms[:, None] - centroids[None, :]), axis=1)]
    mse = float((norms**2 - 2 * g * t + g**2).sum() / x.size)
    return {
        "mse": mse,
        "retention_pct": 100.0 * (-0.5 * math.log2(mse)) / 2.0,
        "mean_cos": float((t / norms).mean()),
    }


def stage_times(z: torch.Tensor) -> dict[str, float]:
    """Seconds spent in each stage of one search over ``z`` [N, 24] (synchronized per stage)."""
    device = z.device
    k = te._constants(str(device))
    out: dict[str, float] = {}

    def timed(name: str, fn: Callable[[], object]) -> object:
        _sync(device)
        start = time.perf_counter()
        result = fn()
        _sync(device)
        out[name] = out.get(name, 0.0) + time.perf_counter() - start
        return result

    te._search(z[:256], k)  # warm-up
    zt = timed("transpose", lambda: z.t().index_select(0, k["order"]))
    ends = torch.cat((zt[0:8], zt[16:24]), dim=1)
    e_end = timed("sections_1_3", lambda: te._section_scores(ends, (0, 1), k))
    e_mid = timed("section_2", lambda: te._section_scores(zt[8:16].contiguous(), (2, 3), k))
    j = timed("join", lambda: te._join(e_end, e_mid, k))
    p = j["p"]
    c1 = k["prefixes"][j["s8"], j["b1"]]
    c2 = k["branch_c2"][j["s8"], j["b2"]]
    c3 = k["suffixes"][j["s16"], j["b3"]]
    timed("backtrack", lambda: (
        te._best_rows(zt[0:8], p, c1, j["r"], k),
        te._best_rows(zt[8:16], p, c2, 2 + j["delta"], k),
        te._best_rows(zt[16:24], p, c3, j["k3"], k),
    ))  # fmt: skip
    labels, _ = te._search(z, k)
    timed("decode_and_ratio", lambda: (decode(labels).double() * z.double()).sum(-1))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--decode-blocks", type=int, default=1 << 24)
    parser.add_argument("--encode-blocks", type=int, default=1 << 18)
    parser.add_argument("--chunks", default="8192,32768,65536,131072")
    parser.add_argument("--eval-blocks", type=int, default=20_000)
    parser.add_argument("--seconds-per-point", type=float, default=4.0)
    parser.add_argument("--cpu-blocks", type=int, default=16384)
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    result: dict[str, object] = {"device": str(device), "torch": torch.__version__}
    if device.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(device)
    rng = np.random.default_rng(0)

    # 1. Correctness: device decode == CPU reference (random + boundary labels).
    labels = torch.from_numpy(rng.integers(0, 1 << 47, size=1 << 20, dtype=np.int64))
    labels[:4] = torch.tensor([0, (1 << 47) - 1, 1, int("f994070f3202", 16) & ((1 << 47) - 1)])
    ref = decode_reference(labels)
    dev_points = decode(labels.to(device)).cpu()
    result["decode_equal_reference"] = bool(torch.equal(dev_points, ref))
    print("decode == reference:", result["decode_equal_reference"], flush=True)

    # 2. Decoder throughput.
    big = rng.integers(0, 1 << 47, size=args.decode_blocks, dtype=np.int64)
    big = torch.from_numpy(big).to(device)
    t = _best_time(lambda: decode(big), device)
    result["decode_blocks_per_s"] = args.decode_blocks / t
    cpu_labels = labels[: 1 << 20]
    t_cpu = _best_time(lambda: decode(cpu_labels), torch.device("cpu"))
    result["decode_cpu_blocks_per_s"] = cpu_labels.numel() / t_cpu
    result["cpu_threads"] = torch.get_num_threads()
    print(f"decode {result['decode_blocks_per_s']:.3e} blocks/s on {device}, "
          f"{result['decode_cpu_blocks_per_s']:.3e} on CPU", flush=True)  # fmt: skip

    # 3. Encoder agreement with the CPU exact encoder on 2000 Gaussian blocks, per method.
    train, ev = _gaussians(args.eval_blocks)
    x2k = torch.from_numpy(ev[:2000])
    cpu_lab = te.encode(x2k, method="exact")
    cos_cpu = te.cosine_of(x2k, cpu_lab)
    for method in ("exact", "fast"):
        dev_lab = te.encode(x2k.to(device), method=method).cpu()
        cos_dev = te.cosine_of(x2k, dev_lab)
        same = float((cpu_lab == dev_lab).double().mean())
        result[f"encode_{method}_same_labels_fraction"] = same
        result[f"encode_{method}_max_abs_cos_diff"] = float((cos_cpu - cos_dev).abs().max())
        agreement = (
            result[f"encode_{method}_same_labels_fraction"],
            result[f"encode_{method}_max_abs_cos_diff"],
        )
        print(f"{method} on {device} vs exact on CPU (same labels, max |Δcos|):", agreement)
    save(result, args.out)

    # 4. CPU encoder throughput, one intra-op thread per worker (the demo's setting).
    cpu_rate: dict[str, object] = {"blocks": args.cpu_blocks}
    xc = torch.from_numpy(np.random.default_rng(2).standard_normal((args.cpu_blocks, 24))).float()
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        arms = (("fast_1_thread", "fast", 1), ("fast_2_threads", "fast", 2), ("exact", "exact", 1))
        for name, method, threads in arms:
            cpu_rate[f"load_before_{name}"] = os.getloadavg()[0]
            n = args.cpu_blocks if method == "fast" else max(1024, args.cpu_blocks // 4)
            t = _best_time(
                lambda m=method, th=threads, n=n: te.encode(xc[:n], method=m, threads=th),
                torch.device("cpu"),
                repeats=2,
            )
            cpu_rate[name] = n / t
            print(f"CPU encode {name}: {n / t:.0f} blocks/s", flush=True)
    finally:
        torch.set_num_threads(previous)
    result["cpu_encode_blocks_per_s"] = cpu_rate
    save(result, args.out)

    # 5. Quality of each method on the device, full §6.2 protocol.
    for method in ("exact", "fast"):
        for name, norms in (("default", te.DEFAULT_NORMS), ("quality", te.QUALITY_NORMS)):
            start = time.perf_counter()
            labels_ev = te.encode(torch.from_numpy(ev).to(device), norms=norms, method=method)
            _sync(device)
            seconds = time.perf_counter() - start
            key = f"gaussian_{method}_{name}"
            result[key] = {"norms": list(norms), "seconds": seconds}
            result[key].update(retention(train, ev, labels_ev))
            print(key, result[key], flush=True)
    save(result, args.out)

    # 6. Device encoder throughput per chunk size and method (default schedule: two searches per
    # block); the block count is capped so that each measurement takes a few seconds.
    chunks = [int(c) for c in args.chunks.split(",") if c]
    if not chunks:
        print(json.dumps(result, indent=2))
        return 0
    gen = np.random.default_rng(1)
    probe = torch.from_numpy(gen.standard_normal((16384, 24))).float().to(device)
    rate = 16384 / _best_time(lambda: te.encode(probe, method="exact"), device, repeats=1)
    n_blocks = max(16384, min(args.encode_blocks, int(rate * args.seconds_per_point)))
    xs = torch.from_numpy(gen.standard_normal((n_blocks, 24))).float().to(device)
    for method in ("exact", "fast"):
        throughput = {"blocks": n_blocks}
        for chunk in chunks:
            t = _best_time(
                lambda chunk=chunk, m=method: te.encode(xs, chunk=chunk, method=m),
                device,
                repeats=2,
            )
            throughput[str(chunk)] = n_blocks / t
            print(f"{method} encode chunk {chunk}: {throughput[str(chunk)]:.3e} blocks/s")
            result[f"encode_{method}_blocks_per_s_by_chunk"] = throughput
            save(result, args.out)
    n_stage = min(n_blocks, 65536)
    unit = xs[:n_stage] / xs[:n_stage].norm(dim=-1, keepdim=True)
    stages = stage_times(unit * te.DEFAULT_NORMS[0])
    result["stage_seconds_one_search"] = {"blocks": n_stage, **stages}
    print("stages:", result["stage_seconds_one_search"], flush=True)

    save(result, args.out)
    print(json.dumps(result, indent=2))
    return 0


def save(result: dict, path: str) -> None:
    """Write the results so far (a killed run still leaves its numbers)."""
    if path:
        with open(path, "w") as fh:
            fh.write(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
