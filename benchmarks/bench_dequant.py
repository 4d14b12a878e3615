"""The dequantization kernels of the many-row path on one GPU: Tetra and Planes14 records decoded
to float16 copies (``ops.tetra48_dequantize_f16``, ``ops.planes14_dequantize_f16``) under several
store forms and geometries (``ops.DequantConfig``), against the GPU's write bandwidth.

Per projection group of a model (q|k|v, o, gate|up, down; random codes, which every 48-bit word
and every Planes14 record index allow) and per form: median ms of one dequantization
(``triton.testing.do_bench``, L2 flushed between runs), the output's GB/s, and the whole step (the
groups times the layers). Controls: ``fill`` (``Tensor.fill_`` of the same float16 buffer: the
write floor) and ``fp16-gemm`` (cuBLAS on a float16 weight of the same shape). Then the dense path
itself (``ops.*_matmul_dense``: dequantization, activation gather, GEMM, σ_row) at a few row
counts under the default form, beside cuBLAS fp16 alone — these replayed from CUDA graphs (median
of replays of 10 calls). Every form is first checked bit for bit
against its reference twin on a 96-row record of each width.

Prints a table; the last line is one JSON object (also written to ``--out``)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import asdict
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from shapes import MODELS  # noqa: E402

FORMS = {
    "blocks-4B-w4x8": dict(grouped=False, vector_stores=False, num_warps=4, programs_per_sm=8),
    "blocks-16B-w4x8": dict(grouped=False, vector_stores=True, num_warps=4, programs_per_sm=8),
    "grouped-4B-w4x8": dict(grouped=True, vector_stores=False, num_warps=4, programs_per_sm=8),
    "grouped-16B-w4x8": dict(grouped=True, vector_stores=True, num_warps=4, programs_per_sm=8),
    "grouped-16B-w8x4": dict(grouped=True, vector_stores=True, num_warps=8, programs_per_sm=4),
    "grouped-16B-w8x2": dict(grouped=True, vector_stores=True, num_warps=8, programs_per_sm=2),
    "grouped-16B-w16x2": dict(grouped=True, vector_stores=True, num_warps=16, programs_per_sm=2),
    "grouped-16B-w16x1": dict(grouped=True, vector_stores=True, num_warps=16, programs_per_sm=1),
}


def _git() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=HERE, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _bench(fn, reps: int) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=reps, return_mode="median"))


def _bench_graph(fn, reps: int, calls: int = 10) -> float:
    """Median ms of one ``fn()`` replayed from a CUDA graph of ``calls`` calls (no launch
    overhead; a chunked product launches tens of kernels)."""
    import torch

    fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(calls):
                fn()
    torch.cuda.synchronize()
    times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(max(5, reps // 4)):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return float(sorted(times)[len(times) // 2])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--layouts", default="tetra48,planes14")
    ap.add_argument("--forms", default=",".join(FORMS))
    ap.add_argument("--rows", default="32,64,256", help="activation rows of the dense-path arms")
    ap.add_argument("--reps", type=int, default=60, help="milliseconds of timed runs per arm")
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    import torch

    from leechq.formats.layouts.planes14 import random_planes14
    from leechq.formats.layouts.tetra48 import random_tetra48
    from leechq.kernels import reference as ref
    from leechq.kernels.triton import ops

    dev = "cuda"
    model = MODELS[args.model]
    shapes = {n: (o, i) for n, o, i in model.linears()}
    groups = [("+".join(g), sum(shapes[n][0] for n in g), shapes[g[0]][1]) for g in model.groups()]
    forms = {name: ops.DequantConfig(**FORMS[name]) for name in args.forms.split(",") if name}
    layouts = args.layouts.split(",")
    make = {"tetra48": random_tetra48, "planes14": random_planes14}
    dequant = {"tetra48": ops.tetra48_dequantize_f16, "planes14": ops.planes14_dequantize_f16}
    twin = {"tetra48": ref.tetra48_dequantize_f16, "planes14": ref.planes14_dequantize_f16}
    matmul = {"tetra48": ops.tetra48_matmul_dense, "planes14": ops.planes14_matmul_dense}

    for layout in layouts:  # correctness before speed: each form against its twin, each width
        for d_in in sorted({d for _, _, d in groups}):
            w = make[layout](96, d_in + 5, seed=d_in, device=dev)
            for name, cfg in forms.items():
                got = torch.full((96, 24 * w.n_blocks), float("nan"), dtype=torch.float16,
                                 device=dev)
                dequant[layout](w, out=got, config=cfg)
                if not torch.equal(got, twin[layout](w, grouped=cfg.grouped)):
                    raise SystemExit(f"{layout} {name} d_in={d_in}: differs from its twin")
    print(f"checked {len(forms)} forms x {len(layouts)} layouts bit-exact against the twins",
          flush=True)

    results = []
    print(f"{'layout':9} {'group':10} {'arm':20} {'ms':>8} {'GB/s':>8} {'step ms':>8}")
    step: dict[tuple[str, str], float] = {}
    for gname, d_out, d_in in groups:
        out = torch.empty(d_out, d_in, dtype=torch.float16, device=dev)
        nbytes = out.numel() * 2
        arms = [("-", "fill", lambda out=out: out.fill_(1.0))]
        for layout in layouts:
            w = make[layout](d_out, d_in, seed=d_out + d_in, device=dev)
            o16 = torch.empty(d_out, 24 * w.n_blocks, dtype=torch.float16, device=dev)
            for name, cfg in forms.items():
                arms.append((layout, name, lambda w=w, o16=o16, cfg=cfg, lay=layout:
                             dequant[lay](w, out=o16, config=cfg)))
        for layout, name, fn in arms:
            ms = _bench(fn, args.reps)
            gbps = nbytes / ms / 1e6
            step[(layout, name)] = step.get((layout, name), 0.0) + ms * model.layers
            print(f"{layout:9} {gname:10} {name:20} {ms:8.4f} {gbps:8.0f} {ms * model.layers:8.2f}",
                  flush=True)
            results.append(dict(kind="dequant", layout=layout, group=gname, d_out=d_out, d_in=d_in,
                                arm=name, ms=round(ms, 5), gbps=round(gbps, 1)))
        del out
        torch.cuda.empty_cache()
    print("\nwhole step (all groups x layers):")
    for (layout, name), ms in step.items():
        print(f"  {layout:9} {name:20} {ms:8.2f} ms")
        results.append(dict(kind="dequant-step", layout=layout, arm=name, ms=round(ms, 3)))

    default = ops.dequant_config()
    print(f"\ndense path under the default form {default}:")
    for m in [int(r) for r in args.rows.split(",")]:
        tot = dict.fromkeys(["fp16-gemm", *layouts], 0.0)
        for _, d_out, d_in in groups:
            x = torch.randn(m, d_in, device=dev)
            w16 = torch.randn(d_out, d_in, device=dev, dtype=torch.float16)
            x16 = x.half()
            tot["fp16-gemm"] += _bench_graph(lambda x16=x16, w16=w16: x16 @ w16.T, args.reps)
            for layout in layouts:
                w = make[layout](d_out, d_in, seed=d_out + d_in, device=dev)
                tot[layout] += _bench_graph(lambda x=x, w=w, lay=layout: matmul[lay](x, w),
                                            args.reps)
            del w16
        for arm, ms in tot.items():
            step_ms = ms * model.layers
            print(f"  rows {m:4} {arm:10} {step_ms:8.2f} ms per step "
                  f"({step_ms / (tot['fp16-gemm'] * model.layers):.2f}x fp16)")
            results.append(dict(kind="dense-step", rows=m, arm=arm, ms=round(step_ms, 3)))

    record = dict(bench="dequant", gpu=torch.cuda.get_device_name(), git=_git(),
                  date=str(date.today()), model=args.model, torch=torch.__version__,
                  default=asdict(default), forms={k: FORMS[k] for k in forms}, results=results)
    line = json.dumps(record)
    if args.out:
        Path(args.out).write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
