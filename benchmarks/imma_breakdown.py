"""Where the int8 tensor-core kernel's time goes (``ops.tetra48_matvec_imma_prepared``), per
Qwen3-8B projection shape: the activation-record launch, the MMA kernel in several geometries
(blocks per K-slice, row sets per program, row groups per step) and the slice sum, each timed
alone with ``triton.testing.do_bench_cudagraph`` (µs per launch), beside cuBLAS fp16 and the
batch-1 ``m1`` kernel on the same matrix. Random codes (kernel time does not depend on values);
every geometry is checked against the f64 product first. Prints a table; the last line is JSON."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

SHAPES = {"q|k|v": (6144, 4096), "o": (4096, 4096), "gate|up": (24576, 4096),
          "down": (4096, 12288)}


def _us(fn) -> float:
    """µs per call of ``fn`` (``do_bench_cudagraph``, 60 ms of replays)."""
    from triton.testing import do_bench_cudagraph

    return 1e3 * do_bench_cudagraph(fn, rep=60)


def _operands(d_out: int, d_in: int, m: int) -> tuple:
    """A random ``tetra48`` matrix and ``m`` activation rows on the GPU: (device, weight, x, the
    prepared x, its int8 records, the f64 matrix)."""
    import torch

    from leechq.formats.layouts.tetra48 import random_tetra48
    from leechq.kernels import reference as ref
    from leechq.kernels.triton import ops

    dev = torch.device("cuda")
    w = random_tetra48(d_out, d_in, seed=d_out, device=dev)
    x = torch.randn(m, d_in, device=dev)
    xp = ops.prepare_activation(x, w.n_blocks, ops.tetra_kernel_tables(dev).order)
    return dev, w, x, xp, ops.imma_activation(xp, m, w.n_blocks), ref.tetra48_dequantize_rotated(w)


def _measure(name: str, d_out: int, d_in: int, m: int) -> dict:
    """One projection shape's row of the table (see the module docstring)."""
    import torch
    import triton

    from leechq.kernels import reference as ref
    from leechq.kernels.triton import ops
    from leechq.kernels.triton.tetra48_imma import imma_kernel

    dev, w, x, xp, acts, dense = _operands(d_out, d_in, m)
    xh = x.half()
    wh = torch.randn(d_out, d_in, device=dev, dtype=torch.float16)
    row = {"shape": name, "d_out": d_out, "d_in": d_in, "rows": m,
           "fp16_us": _us(lambda: xh @ wh.T),
           "records_us": _us(lambda: ops.imma_activation(xp, m, w.n_blocks))}
    y1 = torch.empty(1, d_out, device=dev)
    xp1 = ops.prepare_activation(x[:1], w.n_blocks, ops.tetra_kernel_tables(dev).order)
    row["m1_one_row_us"] = _us(lambda: ops.tetra48_matvec_prepared(xp1, w, 1, out=y1))
    y8 = torch.empty(m, d_out, device=dev)
    os.environ["LEECHQ_IMMA"] = "0"  # the many-row m1 (captured with it; replays keep it)
    row["m1_rows_us"] = _us(lambda: ops.tetra48_matvec_prepared(xp, w, m, out=y8))
    del os.environ["LEECHQ_IMMA"]
    geoms = {}
    nb = w.n_blocks
    npp = ref.prepared_pairs(nb)
    for mr in (0, 168, 232):
        for rg, k_per in ((1, None), (4, None), (1, 64), (4, 32), (8, 16)):
            rps = 2
            kp = k_per or ops.imma_slices(d_out, nb, dev, 4, rg, rps)
            slices = triton.cdiv(nb, kp)
            tiles = triton.cdiv(d_out, 8 * rps * 4 * rg)
            key = f"maxnreg {mr} rg{rg} k{kp} ({tiles}x{slices} programs)"
            if key in geoms:
                continue
            y = ops.tetra48_matvec_imma_prepared(xp, w, m, acts=acts, k_per=kp,
                                                 row_groups=rg, rows_per_step=rps,
                                                 maxnreg=mr)
            err = ref.row_bound_error(y, x, dense)
            if not err <= 1e-5:
                raise AssertionError(f"{name} {key}: error {err:.2e}")
            part = torch.empty(slices, 8 * ops.imma_chunks(m), d_out, device=dev)
            tab = ops.tetra_m1_table(dev)
            extra = {"maxnreg": mr} if mr else {}

            def main_kernel(kp=kp, rg=rg, rps=rps, tiles=tiles, slices=slices, part=part,
                            tab=tab, extra=extra):
                imma_kernel[(tiles, slices)](
                    acts[0], acts[1], w.words, w.row_centroids, tab, part, d_out, kp,
                    N_BLOCKS=nb, NPP=npp, NW=4, RG=rg, RPS=rps, CH=ops.imma_chunks(m), CODE=0,
                    USE_ASM=True, num_warps=4, num_stages=1, **extra)

            full = _us(lambda kp=kp, rg=rg, rps=rps, mr=mr: ops.tetra48_matvec_imma_prepared(
                xp, w, m, out=y8, acts=acts, k_per=kp, row_groups=rg, rows_per_step=rps,
                maxnreg=mr))
            geoms[key] = {"kernel_us": _us(main_kernel), "with_sum_us": full}
    row["geometries"] = geoms
    best = min(geoms.items(), key=lambda kv: kv[1]["with_sum_us"])
    row["best"] = best[0]
    print(f"{name:8s} {d_out}x{d_in} M={m}: fp16 {row['fp16_us']:.1f} µs, m1 one row "
          f"{row['m1_one_row_us']:.1f}, m1 {m} rows {row['m1_rows_us']:.1f}, records "
          f"{row['records_us']:.1f}", flush=True)
    for k, v in sorted(geoms.items(), key=lambda kv: kv[1]["with_sum_us"]):
        print(f"    {k:40s} kernel {v['kernel_us']:7.1f} µs  with slice sum "
              f"{v['with_sum_us']:7.1f} µs", flush=True)
    return row


def _sweep_slices(name: str, d_out: int, d_in: int, m: int) -> dict:
    """One projection shape's K-slice sweep (``--slices``): for each count of K-slices from 1 to
    24 (the smallest ``k_per`` giving it, so the slices are as even as multiples of 4 allow), the
    MMA kernel alone, with the slice-sum launch, and with the slices added in the kernel
    (``fused_sum``), at one row set per program and two row groups per step; µs per launch,
    each checked against the f64 product first."""
    import torch
    import triton

    from leechq.kernels import reference as ref
    from leechq.kernels.triton import ops
    from leechq.kernels.triton.tetra48_imma import imma_kernel

    dev, w, x, xp, acts, dense = _operands(d_out, d_in, m)
    nb = w.n_blocks
    npp = ref.prepared_pairs(nb)
    y = torch.empty(m, d_out, device=dev)
    tab = ops.tetra_m1_table(dev)
    tiles = triton.cdiv(d_out, 64)
    default = ops.imma_slices(d_out, nb, dev)
    seen: dict[int, int] = {}  # slices -> the smallest k_per giving them (balanced slices)
    for kp in range(4, 4 * triton.cdiv(nb, 4) + 1, 4):
        seen.setdefault(triton.cdiv(nb, kp), kp)
    rows = []
    for slices, kp in sorted(seen.items()):
        if slices > 24:
            break
        for fused in (False, True):
            got = ops.tetra48_matvec_imma_prepared(xp, w, m, out=y, acts=acts, k_per=kp,
                                                   fused_sum=fused)
            err = ref.row_bound_error(got, x, dense)
            if not err <= 1e-5:
                raise AssertionError(f"{name} k_per {kp} fused {fused}: error {err:.2e}")
        part = torch.empty(slices, 8 * ops.imma_chunks(m), d_out, device=dev)

        def main_kernel(kp=kp, slices=slices, part=part):
            imma_kernel[(tiles, slices)](
                acts[0], acts[1], w.words, w.row_centroids, tab, part, d_out, kp,
                N_BLOCKS=nb, NPP=npp, NW=4, RG=1, RPS=2, CH=ops.imma_chunks(m), CODE=0,
                USE_ASM=True, num_warps=4, num_stages=1)

        r = {"slices": slices, "k_per": kp, "programs": tiles * slices,
             "default": kp == default, "kernel_us": _us(main_kernel),
             "with_sum_us": _us(lambda kp=kp: ops.tetra48_matvec_imma_prepared(
                 xp, w, m, out=y, acts=acts, k_per=kp, fused_sum=False)),
             "fused_us": _us(lambda kp=kp: ops.tetra48_matvec_imma_prepared(
                 xp, w, m, out=y, acts=acts, k_per=kp, fused_sum=True))}
        rows.append(r)
        print(f"{name:8s} slices {slices:2d} k_per {kp:3d} ({r['programs']:5d} programs)"
              f"{' default' if r['default'] else '        '}: kernel {r['kernel_us']:6.1f} µs, "
              f"+ sum {r['with_sum_us']:6.1f}, fused {r['fused_us']:6.1f}", flush=True)
    xh = x.half()
    wh = torch.randn(d_out, d_in, device=dev, dtype=torch.float16)
    return {"shape": name, "d_out": d_out, "d_in": d_in, "rows": m, "tiles": tiles,
            "fp16_us": _us(lambda: xh @ wh.T), "sweep": rows}


def main() -> None:
    import torch
    import triton

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--out", default="")
    ap.add_argument("--slices", action="store_true",
                    help="sweep the count of K-slices per shape instead of the geometries")
    args = ap.parse_args()
    res = []
    for name, (d_out, d_in) in SHAPES.items():
        measure = _sweep_slices if args.slices else _measure
        res.append(measure(name, d_out, d_in, args.rows))
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True).stdout.strip()
    except OSError:
        sha = ""
    out = {"bench": "imma_breakdown", "gpu": torch.cuda.get_device_name(), "git": sha,
           "torch": torch.__version__, "triton": triton.__version__, "results": res}
    if args.out:
        with open(args.out + ".tmp", "w") as f:
            json.dump(out, f, indent=1)
        os.replace(args.out + ".tmp", args.out)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
