"""Time and memory of one tuning step's composed-weight work per matrix at real shapes.

For each lattice shape (``--shapes``): a random lattice record (Tetra, one gain bit, rotated), its
composed module in the tuning's compute dtype, and ``--tokens`` activation rows; the median wall
time of a forward plus backward through the composed op (compose, matmul, recompose and the
factor gradients), the frozen buffers' bytes and the peak device memory of that step. For each
table shape (``--tables``, vocabulary x width): a random 4-bit group-64 table as a composed head
(a linear over ``--tokens`` rows) and as a composed embedding (a lookup of ``--tokens`` random
ids), the same measures. JSON last line.

    python benchmarks/bench_tune_compose.py --device cuda --shapes 4096x4096,12288x4096,4096x12288
    python benchmarks/bench_tune_compose.py --device cuda --shapes "" --tables 151936x4096
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shapes", default="4096x4096,12288x4096,4096x12288",
                    help="comma list of d_outxd_in")
    ap.add_argument("--tables", default="", help="comma list of vocabxwidth (4-bit tables)")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()

    from leechq.formats.group_affine import GroupAffine
    from leechq.formats.rotation import generate_rotation
    from leechq.quant.composed import ComposedEmbedding, ComposedLinear
    from leechq.serve.random_codes import random_tetra

    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    rows = []

    def measure(spec: str, step: Any, m: torch.nn.Module, weights: int, err: float,
                built: float) -> None:
        for _ in range(3):
            step()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        times = []
        for _ in range(args.reps):
            t = time.perf_counter()
            step()
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        frozen = sum(b.numel() * b.element_size() for b in m.buffers())
        row = {"shape": spec, "ms": sorted(times)[len(times) // 2] * 1e3,
               "frozen_bytes_per_weight": frozen / weights, "max_abs_err": err,
               "build_s": built}
        if cuda:
            row["step_peak_extra_mb"] = (torch.cuda.max_memory_allocated() - base) / 2**20
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)

    for spec in filter(None, args.shapes.split(",")):
        d_out, d_in = (int(v) for v in spec.split("x"))
        t0 = time.perf_counter()
        rec = random_tetra(d_out, d_in, torch.Generator().manual_seed(1),
                           rotation=generate_rotation(d_in, 1))
        m = ComposedLinear(rec, None, ("row_scales", "centroids"), dev, dtype)
        built = time.perf_counter() - t0
        err = float((m.compose()[0].detach().cpu() - rec.dequantize(torch.float32)).abs().max())
        x = torch.randn(args.tokens, d_in, device=dev, dtype=dtype, requires_grad=True)

        def step(m: ComposedLinear = m, x: torch.Tensor = x) -> None:
            m(x).float().square().mean().backward()

        measure(spec, step, m, d_out * d_in, err, built)
        del m, x, rec
    for spec in filter(None, args.tables.split(",")):
        vocab, width = (int(v) for v in spec.split("x"))
        gen = torch.Generator().manual_seed(2)
        t0 = time.perf_counter()
        table = GroupAffine((vocab, width), 4, 64,
                            torch.randint(0, 256, (vocab, width // 2), generator=gen,
                                          dtype=torch.uint8),
                            torch.full((vocab, -(-width // 64)), 0.01, dtype=torch.float16),
                            torch.full((vocab, -(-width // 64)), -0.08, dtype=torch.float16))
        head = ComposedLinear(table, None, ("tables",), dev, dtype)
        built = time.perf_counter() - t0
        err = float((head.compose()[0].detach().cpu() - table.dequantize()).abs().max())
        x = torch.randn(args.tokens, width, device=dev, dtype=dtype, requires_grad=True)

        def head_step(m: ComposedLinear = head, x: torch.Tensor = x) -> None:
            m(x).float().square().mean().backward()

        measure(f"head {spec}", head_step, head, vocab * width, err, built)
        del head, x
        emb = ComposedEmbedding(table, ("tables",), dev, dtype)
        ids = torch.randint(0, vocab, (args.tokens,), generator=gen).to(dev)
        h = torch.randn(args.tokens, width, device=dev)

        def emb_step(m: ComposedEmbedding = emb, ids: torch.Tensor = ids,
                     h: torch.Tensor = h) -> None:
            (m(ids).float() * h).sum().backward()

        measure(f"embedding {spec}", emb_step, emb, vocab * width, 0.0, 0.0)
        del emb, ids, h, table
    print(json.dumps({"bench": "tune_compose", "device": str(dev), "tokens": args.tokens,
                      "rows": rows}))


if __name__ == "__main__":
    main()
