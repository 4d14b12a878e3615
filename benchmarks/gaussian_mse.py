"""Gaussian-source benchmark of the direction codebooks with shape–gain coding (leech-core.md §6.2).

Protocol (the reference's ``llvq-bench`` harness): SplitMix64 seed 0x64A42026; 4 000 train blocks,
then 20 000 eval blocks, 24 N(0,1) draws per block in coordinate order (Box–Muller, two outputs
each). Gain centroids: Lloyd–Max, 60 iterations, quantile initialisation, fitted on the train block
norms (row scale s = 1, so centroids are raw norms). Shipped rule: the gain rounds ‖x‖; the
reconstruction is the production one (``codebooks.shape_gain``), and the MSE is cross-checked
against the closed form ``‖x‖² − 2ĝt + ĝ²`` with t = ⟨x, p⟩/‖p‖ (pitfall P7).
``D = Σ‖x − x̂‖² / (24·blocks)``, SQNR = −½·log2 D, retention = 100·SQNR/R at the packed rate
R = whole bits/24 (pitfall P8).

Rows: Λ24(12)+1 gain bit (48 bits; the deployed code), Λ24(13)+0 (48), Λ24(12)+0 (47), Λ24(12)+2
(49), the scalar 2-bit Lloyd–Max quantizer (fitted on the train coordinates), the Shannon bound
D = 2^(−2R), and one "+1 gain bit" row per extra registered codebook named in ``--codebooks`` (e.g.
tetra). Also the encoder throughput (blocks/s, labels included) on CPU and on ``--device``.

Usage: ``python benchmarks/gaussian_mse.py [--eval-blocks N] [--codebooks ball,tetra]
[--extra-blocks N] [--device cuda]``. Prints a table, then one JSON line (the last line).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from leechq import codebooks
from leechq.codebooks.ball import BallCodebook
from leechq.codebooks.shape_gain import choose_gains, exact_norms, fit_centroids, reconstruct
from leechq.utils.splitmix import SplitMix64

SEED = 0x64A42026
TRAIN_BLOCKS = 4000
EVAL_BLOCKS = 20000
LLOYD_ITERATIONS = 60
SPEC = {  # leech-core.md §6.2 (MSE, retention %)
    "L24(12)+1": (0.0781, 91.96),
    "L24(13)+0": (0.0850, 88.89),
    "L24(12)+0": (0.0905, 88.49),
    "L24(12)+2": (0.0735, 92.21),
}


@dataclass
class Row:
    code: str
    bits_per_block: int
    mse: float
    sqnr_bits: float
    retention: float
    spec_mse: float | None = None
    spec_retention: float | None = None
    note: str = ""


def draw_blocks(eval_blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """Train [4000, 24] and eval [eval_blocks, 24] float64 blocks of the §6.2 stream."""
    rng = SplitMix64(SEED)
    check = SplitMix64(SEED)
    expected = (0xF766D8CFE4F93372, 0x6CF2C7C65DE3D518, 0xA925591E9F758351)
    if tuple(check.next_u64() for _ in range(3)) != expected:
        raise RuntimeError("SplitMix64 does not reproduce the leech-core.md §5.3 test vectors")
    train = rng.gaussians(TRAIN_BLOCKS * 24).reshape(TRAIN_BLOCKS, 24)
    evaluation = rng.gaussians(eval_blocks * 24).reshape(eval_blocks, 24)
    if abs(train[0, 0] + 0.2333360949) > 1e-9 or abs(train[0, 1] + 0.8558603622) > 1e-9:
        raise RuntimeError("Gaussian stream does not match the §5.3 test vectors")
    return train, evaluation


def make_row(code: str, bits: int, mse: float, note: str = "") -> Row:
    sqnr = -0.5 * math.log2(mse)
    spec = SPEC.get(code)
    return Row(
        code=code,
        bits_per_block=bits,
        mse=mse,
        sqnr_bits=sqnr,
        retention=100.0 * sqnr / (bits / 24.0),
        spec_mse=spec[0] if spec else None,
        spec_retention=spec[1] if spec else None,
        note=note,
    )


def shape_gain_mse(
    x: torch.Tensor, points: torch.Tensor, train_norms: torch.Tensor, gain_bits: int
) -> float:
    """MSE per coordinate of the shipped shape–gain rule, with the closed-form cross-check."""
    centroids = fit_centroids(train_norms, gain_bits, LLOYD_ITERATIONS)
    ones = torch.ones(x.shape[0], dtype=torch.float64)
    norms = torch.sqrt((x * x).sum(dim=1))
    gains = choose_gains(norms, ones, centroids)
    xhat = reconstruct(points, gains, ones, centroids)
    direct = float(((x - xhat) ** 2).sum())
    t = (x * points.to(torch.float64)).sum(dim=1) / exact_norms(points)
    g = centroids[gains]
    closed = float((norms**2 - 2.0 * g * t + g * g).sum())
    if not math.isclose(direct, closed, rel_tol=1e-9):
        raise RuntimeError(f"reconstruction MSE {direct} disagrees with the closed form {closed}")
    return direct / (24 * x.shape[0])


def scalar_lloyd_max_mse(train: np.ndarray, x: np.ndarray, bits: int = 2) -> float:
    """Per-coordinate Lloyd–Max scalar quantizer (2^bits levels, fitted on train coordinates)."""
    levels = fit_centroids(torch.from_numpy(train.reshape(-1)), bits, LLOYD_ITERATIONS)
    flat = torch.from_numpy(x.reshape(-1))
    index = torch.argmin((flat[:, None] - levels[None, :]).abs(), dim=1)
    return float(((flat - levels[index]) ** 2).mean())


def timed_encode(codebook: object, x: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Labels and encoder throughput (blocks/s) of ``codebook.encode`` on x's device."""
    if x.device.type == "cuda":
        codebook.encode(x[:256])  # type: ignore[attr-defined]  # warm-up (tables, kernels)
        torch.cuda.synchronize()
    start = time.perf_counter()
    labels = codebook.encode(x)  # type: ignore[attr-defined]
    if x.device.type == "cuda":
        torch.cuda.synchronize()
    return labels, x.shape[0] / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eval-blocks", type=int, default=EVAL_BLOCKS)
    parser.add_argument("--codebooks", default="ball", help="comma-separated registry names")
    parser.add_argument("--device", default="cpu", help="device for the encoder (cpu, cuda)")
    parser.add_argument("--extra-blocks", type=int, default=0,
                        help="eval blocks for the extra --codebooks rows (0: all); slow encoders")
    args = parser.parse_args(argv)
    t_start = time.perf_counter()
    device = torch.device(args.device)

    train_np, eval_np = draw_blocks(args.eval_blocks)
    x = torch.from_numpy(eval_np)
    train_norms = torch.from_numpy(np.sqrt((train_np * train_np).sum(axis=1)))
    rows: list[Row] = []
    throughput: dict[str, float] = {}
    notes: list[str] = []

    for shell in (12, 13):
        codebook = BallCodebook(max_shell=shell)
        labels, rate = timed_encode(codebook, x.to(device))
        throughput[f"L24({shell}) exact, {device.type}"] = rate
        points = codebook.decode(labels.cpu())
        for gain_bits in ((0, 1, 2) if shell == 12 else (0,)):
            mse = shape_gain_mse(x, points, train_norms, gain_bits)
            rows.append(make_row(f"L24({shell})+{gain_bits}", codebook.label_bits + gain_bits, mse))
        if shell == 12:
            shells = torch.bincount((points.to(torch.int64) ** 2).sum(dim=1) // 16, minlength=14)
            share = {m: round(100.0 * int(shells[m]) / x.shape[0], 1) for m in range(8, 13)}
            cos = (x * points.to(torch.float64)).sum(dim=1) / exact_norms(points) / x.norm(dim=1)
            notes.append(
                f"L24(12) winners by shell (%): {share}; mean cos θ {float(cos.mean()):.4f}"
            )
        if device.type == "cuda":
            cpu_n = min(2000, x.shape[0])
            cpu_labels, cpu_rate = timed_encode(codebook, x[:cpu_n])
            throughput[f"L24({shell}) exact, cpu"] = cpu_rate
            if not torch.equal(cpu_labels, labels[:cpu_n].cpu()):
                raise RuntimeError(f"L24({shell}): CUDA labels differ from CPU labels")

    rows.append(make_row("scalar Lloyd-Max 2-bit", 48, scalar_lloyd_max_mse(train_np, eval_np)))
    rows.append(make_row("Shannon bound R=2", 48, 2.0**-4))

    for name in [n.strip() for n in args.codebooks.split(",") if n.strip()]:
        if name == "ball":
            notes.append("ball (registry): identical to the L24(12)+1 row (same codebook)")
            continue
        if name not in codebooks.names():
            notes.append(f"{name}: not registered, skipped")
            continue
        xe = x[: args.extra_blocks] if args.extra_blocks > 0 else x
        try:
            codebook = codebooks.get(name)
            labels, rate = timed_encode(codebook, xe.to(device))
            points = codebook.decode(labels).cpu()
            mse = shape_gain_mse(xe, points, train_norms, 1)
        except Exception as exc:  # a codebook still being written must not sink the table
            notes.append(f"{name}: skipped ({type(exc).__name__}: {exc})")
            continue
        throughput[f"{name}, {device.type}"] = rate
        note = f"first {xe.shape[0]} eval blocks" if xe.shape[0] < x.shape[0] else ""
        rows.append(make_row(f"{name}+1", codebook.label_bits + 1, mse, note))

    print(f"Gaussian source, {x.shape[0]} eval blocks (seed 0x{SEED:X}, {TRAIN_BLOCKS} train)")
    print(f"{'code':<24}{'bits':>6}{'MSE':>9}{'SQNR':>8}{'ret %':>8}{'spec MSE':>10}{'spec %':>8}")
    for r in rows:
        spec_m = f"{r.spec_mse:.4f}" if r.spec_mse is not None else "-"
        spec_r = f"{r.spec_retention:.2f}" if r.spec_retention is not None else "-"
        print(
            f"{r.code:<24}{r.bits_per_block:>6}{r.mse:>9.4f}{r.sqnr_bits:>8.4f}"
            f"{r.retention:>8.2f}{spec_m:>10}{spec_r:>8}  {r.note}"
        )
    for key, value in throughput.items():
        print(f"encoder throughput {key}: {value:,.0f} blocks/s")
    for note in notes:
        print(note)
    elapsed = time.perf_counter() - t_start
    print(f"wall time {elapsed:.1f} s (torch threads {torch.get_num_threads()})")
    print(json.dumps({
        "benchmark": "gaussian_mse",
        "eval_blocks": x.shape[0],
        "rows": [asdict(r) for r in rows],
        "throughput_blocks_per_s": throughput,
        "notes": notes,
        "wall_s": round(elapsed, 1),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
