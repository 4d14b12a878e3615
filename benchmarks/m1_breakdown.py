"""Where the batch-1 Tetra time goes, per projection group (issue 4 diagnostics; H200).

For each projection group of a model (q|k|v, o, gate|up, down: one distinct random matrix per layer,
one CUDA graph of the group's launches, prepared input) this times, in one process:

* ``fp16``: cuBLAS through torch on the same shapes;
* ``empty``: a kernel that only writes one word per program, with the ``m1`` grid and warps of each
  geometry — the launch and drain floor of that geometry;
* ``null``: the ``m1`` no-weights control (table staging, activation conversion, centroid reads,
  reduction, tickets) of each geometry;
* ``m1``: the batch-1 Tetra kernel of each geometry, checked against the f64 reference first;
* ``rotation``: the activation rotation of the group's input width, written in the prepared layout.

Prints one line per (group, arm, geometry) with ms per group and µs per launch, then one JSON line
(also written to ``--out``). Not part of the test suite; needs CUDA.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_matvec import Graphed, Pass, git_rev, warm_compile  # noqa: E402
from shapes import MODELS  # noqa: E402

GEOMETRIES = [
    dict(rows=32, bp=32, num_warps=4, kernel="m1", ctas_per_sm=4),
    dict(rows=32, bp=32, num_warps=4, kernel="m1", ctas_per_sm=2),
    dict(rows=32, bp=32, num_warps=8, kernel="m1", ctas_per_sm=2),
    dict(rows=32, bp=32, num_warps=8, kernel="m1", ctas_per_sm=1),
    dict(rows=32, bp=32, num_warps=16, kernel="m1", ctas_per_sm=1),
    dict(rows=64, bp=32, num_warps=16, kernel="m1", ctas_per_sm=1),
    dict(rows=16, bp=16, num_warps=4, kernel="m1", ctas_per_sm=8),
    dict(rows=32, bp=32, num_warps=4, kernel="m1", ctas_per_sm=0),
]


def _empty_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def empty_kernel(y_ptr):
        tl.store(y_ptr + tl.program_id(0), 0.0)

    return empty_kernel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--layers", type=int, default=36, help="matrices per group")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--geometries", default="all", help="comma list of indices into GEOMETRIES")
    ap.add_argument("--out", default="")
    ap.add_argument("--warm-workers", type=int, default=14)
    args = ap.parse_args()

    import torch

    from leechq.formats.layouts.tetra48 import random_tetra48
    from leechq.formats.rotation import generate_rotation
    from leechq.kernels import reference as ref
    from leechq.kernels.tables import tetra_kernel_tables
    from leechq.kernels.triton import ops

    device = "cuda"
    model = MODELS[args.model]
    geoms = (GEOMETRIES if args.geometries == "all"
             else [GEOMETRIES[int(i)] for i in args.geometries.split(",")])
    cfgs = [ops.MatvecConfig(**g) for g in geoms]
    t_warm = warm_compile([args.model], (1,), {1: cfgs[0]}, cfgs, args.warm_workers,
                          "null-m1,rotation")
    print(f"# parallel compile: {t_warm:.1f} s", flush=True)
    order = tetra_kernel_tables(device).order
    empty = _empty_kernel()
    shapes = {n: (o, i) for n, o, i in model.linears()}
    rows: list[dict] = []

    def record(group: str, arm: str, cfg, ms: float, launches: int, extra=None) -> None:
        r = {"group": group, "arm": arm, "config": cfg, "ms": round(ms, 4),
             "us_per_launch": round(1000 * ms / launches, 2), **(extra or {})}
        rows.append(r)
        print(f"{group:10s} {arm:9s} {json.dumps(cfg) if cfg else '':80s} {ms:8.4f} ms "
              f"{r['us_per_launch']:7.2f} us/launch {json.dumps(extra) if extra else ''}",
              flush=True)

    def timed(run, launches: int) -> float:
        gr = Graphed(Pass("diag", 1, run, 0, launches), 2)
        ms = statistics.median(gr.time(args.reps) for _ in range(3))
        del gr
        return ms

    for gi, grp in enumerate(model.groups()):
        key = "+".join(grp)
        d_out, d_in = sum(shapes[n][0] for n in grp), shapes[grp[0]][1]
        nl = args.layers
        # fp16
        dense = [torch.randn(d_out, d_in, device=device, dtype=torch.float16) for _ in range(nl)]
        xh = [torch.randn(1, d_in, device=device, dtype=torch.float16) for _ in range(2)]
        yh = torch.empty(1, d_out, device=device, dtype=torch.float16)

        def run_fp16(b: int) -> None:
            for w in dense:
                torch.matmul(xh[b], w.T, out=yh)

        record(key, "fp16", None, timed(run_fp16, nl), nl)
        del dense
        torch.cuda.empty_cache()
        ws = [random_tetra48(d_out, d_in, seed=1000 * gi + i, device=device) for i in range(nl)]
        xs = [ops.prepare_activation(torch.randn(1, d_in, device=device), ws[0].n_blocks, order)
              for _ in range(2)]
        y = torch.empty(1, d_out, device=device)
        x0 = torch.randn(1, d_in, device=device)
        xp0 = ops.prepare_activation(x0, ws[0].n_blocks, order)
        deq = ref.tetra48_dequantize_rotated(ws[0])
        want = x0.double() @ deq.T
        bound = x0.double().abs() @ deq.abs().T
        del deq
        for cfg in cfgs:
            cd = dict(cfg.__dict__)
            try:
                if not ops.m1_enabled(torch.device(device), cfg):
                    raise AssertionError("m1 kernel disabled (first-use check failed)")
                grid, ns = ops.m1_grid(d_out, ws[0].n_blocks, cfg, torch.device(device))
                ybuf = torch.empty(grid, device=device)

                def run_empty(b: int, grid=grid, cfg=cfg, ybuf=ybuf) -> None:
                    for _ in ws:
                        empty[(grid,)](ybuf, num_warps=cfg.num_warps)

                record(key, "empty", cd, timed(run_empty, nl), nl, {"grid": grid, "slices": ns})

                def run_null(b: int, cfg=cfg) -> None:
                    for w in ws:
                        ops.null_matvec_prepared(xs[b], w, 1, cfg, out=y)

                record(key, "null", cd, timed(run_null, nl), nl)
                got = ops.tetra48_matvec_prepared(xp0, ws[0], 1, cfg)
                err = float(((got.double() - want).abs() / bound).max())
                if not err <= 1e-5:
                    raise AssertionError(f"m1 error {err:.2e}")

                def run_m1(b: int, cfg=cfg) -> None:
                    for w in ws:
                        ops.tetra48_matvec_prepared(xs[b], w, 1, cfg, out=y)

                record(key, "m1", cd, timed(run_m1, nl), nl, {"err": f"{err:.1e}"})
            except Exception as exc:  # one failing geometry must not hide the others
                print(f"!! {key} {cd}: {exc!r}"[:1500], flush=True)
        del ws
        torch.cuda.empty_cache()
        # rotation of this group's input into the prepared layout
        rot = ops.DeviceRotation.from_tables(generate_rotation(d_in, 7 + d_in), device)
        xr = [torch.randn(1, d_in, device=device) for _ in range(2)]
        outp = torch.zeros(ref.prepared_rows(1), ref.prepared_width(d_in // 24), device=device)

        def run_rot(b: int) -> None:
            for _ in range(nl):
                ops.rotate(xr[b], rot, prepared_order=order, out=outp)

        record(key, "rotation", None, timed(run_rot, nl), nl)

    doc = {"bench": "m1_breakdown", "gpu": torch.cuda.get_device_name(), "git": git_rev(),
           "model": args.model, "layers": args.layers, "results": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(doc) + "\n")
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
