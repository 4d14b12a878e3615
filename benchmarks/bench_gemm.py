"""The many-row lattice product: fp16 cuBLAS, the served path, and the float16 tensor-core GEMM
(``ops_gemm``: each block decoded once per launch) over its candidate geometries, for Tetra or the
ball codebook (``--codebook ball``: ``planes14`` records).

Run on a CUDA machine from the repository root::

    PYTHONPATH=src python benchmarks/bench_gemm.py                  # Qwen3-8B, rows 2..128
    PYTHONPATH=src python benchmarks/bench_gemm.py --configs 0,4x2x2  # a part of the sweep
    PYTHONPATH=src python benchmarks/bench_gemm.py --dry-run        # tiny shapes, CPU interpreter

Protocol (as ``bench_matvec.py``): one process; every projection group of every layer a distinct
random matrix (q|k|v 4096→6144, o 4096→4096, gate|up 4096→24576, down 12288→4096, ×36 layers for
Qwen3-8B; Tetra words or ``planes14`` records drawn on the device, served as
:class:`leechq.nn.group.LeechqGroup` in the layout the server uses). Arms per row count:
``fp16`` (one cuBLAS GEMM per group), ``served`` (the group's forward: rotation, then what the
dispatch table picks — ``m1`` at 1–2 rows, this GEMM in its default geometry at 3–64, the float16
copy and cuBLAS above), ``int4`` (torch's int4 weight-only GEMM, tinygemm, group 128, bfloat16
activations: ``int4_tinygemm.py``, coded from the fp16 arm's matrices) and ``gemm[WxRxP]`` for
each candidate geometry (warps, row groups per step, programs per SM; default
``tuning.GEMM_SWEEP``: the same rotation into the copy's column order, then
``ops_gemm.matmul_gemm_ordered`` per part into one output). Every arm is first checked against
the f64 product of its own matrix (the first 256 output rows of each group kind,
``reference.row_bound_error``), then its whole pass is one CUDA graph, replayed; arms alternate
in rounds, medians of the rounds.

The last stdout line is one JSON object ``{"bench": "gemm", ...}`` (also written to ``--out``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_matvec import (  # noqa: E402
    add_common_args,
    build_fp16,
    build_tetra,
    emit,
    graph_of,
    setup,
    time_ms,
)
from int4_tinygemm import Int4Linear, dequantize, fits, quantize  # noqa: E402
from shapes import Model  # noqa: E402

CHECK_ROWS = 256
"""Output rows of each group kind checked against the f64 product."""

MAX_ERR = {"fp16": 4e-3, "served": 4e-3, "gemm": 4e-3, "int4": 8e-3}
"""The largest ``row_bound_error`` an arm may show (float16 values and activations: a few 2^-11;
the int4 arm's bfloat16 activations and outputs: a few 2^-8)."""


def gemm_forward(grp: Any, x: torch.Tensor, cfg: Any) -> torch.Tensor:
    """A served group's product through the float16 tensor-core GEMM: the group's rotation into
    the dequantized copy's column order (as its dense path does), then one GEMM per part, each
    writing its columns of the output."""
    from leechq.kernels.triton import ops, ops_gemm, ops_rotate

    part0 = grp.parts[0]
    x16 = ops_rotate.rotate(x, grp.rot, dense_order=ops.dense_input_order(part0, x.device))
    y = torch.empty(x.shape[0], grp.offsets[-1], dtype=torch.float32, device=x.device)
    for part, off in zip(grp.parts, grp.offsets, strict=False):
        ops_gemm.matmul_gemm_ordered(x16, part, cfg, out=y[:, off : off + part.d_out])
    return y


def record_rows(part: Any, sl: slice) -> Any:
    """Output rows ``sl`` (a step-1 slice within ``d_out``) of a ``tetra48`` or ``planes14``
    record, on the CPU."""
    codes = "records" if part.layout == "planes14" else "words"
    return replace(part, d_out=sl.stop - sl.start, **{k: getattr(part, k)[sl].cpu() for k in (
        codes, "row_scales", "row_centroids", "tail", "row_scales_f64", "row_centroids_f64")})


def references(tetra: list[Any], fp16: list[torch.Tensor], kinds: int) -> list[dict[str, Any]]:
    """Per group kind (the first layer's groups): the f64 matrices of the first
    :data:`CHECK_ROWS` rows of the Tetra group (rotated basis) and of the fp16 weight."""
    from leechq.kernels import reference as ref

    out = []
    for grp, w16 in zip(tetra[:kinds], fp16[:kinds], strict=True):
        head = record_rows(grp.parts[0], slice(0, min(CHECK_ROWS, grp.parts[0].d_out)))
        w4 = dequantize(*quantize(w16[:CHECK_ROWS].cpu())) if fits(*w16.shape) else w16[:0]
        dense = (ref.planes14_dequantize_rotated(head) if head.layout == "planes14"
                 else ref.tetra48_dequantize_rotated(head))
        out.append({"grp": grp, "dense": dense,
                    "w16": w16[:CHECK_ROWS].double().cpu(), "w4": w4.double(),
                    "rows": head.d_out})
    return out


def check_arm(arm: str, fn: Any, refs: list[dict[str, Any]], rows: int, device: str) -> float:
    """The worst ``row_bound_error`` of ``fn(group index, grp, x)`` over the group kinds."""
    from leechq.kernels import reference as ref

    worst = 0.0
    for i, r in enumerate(refs):
        grp = r["grp"]
        x = torch.randn(rows, grp.d_in, device=device, dtype=torch.float16)
        y = fn(i, grp, x)[:, : r["rows"]].float().cpu()
        if arm == "fp16":
            worst = max(worst, ref.row_bound_error(y, x.float().cpu(), r["w16"]))
        elif arm == "int4":
            worst = max(worst, ref.row_bound_error(y, x.bfloat16().float().cpu(), r["w4"]))
        else:
            xr = ref.rotate(x.float().cpu(), grp.rotation)
            worst = max(worst, ref.row_bound_error(y, xr, r["dense"]))
    return worst


def parse_configs(text: str) -> list[tuple[int, int, int]]:
    """``all`` (every geometry of ``tuning.GEMM_SWEEP``) or a comma list of indices into it
    and/or explicit geometries ``WARPSxROWS_PER_STEPxPROGRAMS_PER_SM`` (e.g. ``4x2x3``)."""
    from leechq.kernels.tuning import GEMM_SWEEP

    if text == "all":
        return list(GEMM_SWEEP)
    if text == "none":
        return []
    out = []
    for item in text.split(","):
        out.append(tuple(int(v) for v in item.split("x")) if "x" in item
                   else GEMM_SWEEP[int(item)])
    return out


def bench(model: Model, rows_list: list[int], configs: list[tuple[int, int, int]], device: str,
          rounds: int, reps: int, codebook: str = "tetra") -> list[dict[str, Any]]:
    from leechq.kernels.triton import ops_gemm

    tetra = build_tetra(model, device, codebook=codebook)
    fp16 = build_fp16(model, device)
    int4 = [Int4Linear(w) for w in fp16] if all(fits(*w.shape) for w in fp16) else []
    if not int4:
        print("int4 arm skipped: these shapes are not tinygemm's (n % 16, k % 128)", flush=True)
    kinds = len(model.groups())
    refs = references(tetra, fp16, kinds)
    out = []
    for rows in rows_list:
        xs = {d: torch.randn(rows, d, device=device, dtype=torch.float16)
              for d in {g.d_in for g in tetra}}
        arms: dict[str, Any] = {
            "fp16": (lambda i, g, x: x @ fp16[i].T,
                     lambda xs=xs: [xs[w.shape[1]] @ w.T for w in fp16]),
            "served": (lambda i, g, x: g(x), lambda xs=xs: [g(xs[g.d_in]) for g in tetra]),
        }
        if int4:
            xb = {d: x.to(int4[0].dtype) for d, x in xs.items()}
            arms["int4"] = (lambda i, g, x: int4[i](x.to(int4[i].dtype)),
                            lambda xb=xb: [m(xb[m.in_features]) for m in int4])
        for c in configs:
            cfg = ops_gemm.GemmConfig(*c).check()
            arms["gemm[{}x{}x{}]".format(*c)] = (
                lambda i, g, x, cfg=cfg: gemm_forward(g, x, cfg),
                lambda cfg=cfg, xs=xs: [gemm_forward(g, xs[g.d_in], cfg) for g in tetra])
        errs = {}
        for arm, (one, _) in arms.items():
            errs[arm] = check_arm(arm, one, refs, rows, device)
            limit = MAX_ERR[arm.split("[")[0]]
            if not errs[arm] <= limit:
                raise SystemExit(f"{arm} at {rows} rows: error {errs[arm]:.3e} > {limit:.0e}")
        runs = {arm: graph_of(whole, device) for arm, (_, whole) in arms.items()}
        per_round: dict[str, list[float]] = {arm: [] for arm in runs}
        for _ in range(rounds):
            for arm, run in runs.items():
                per_round[arm].append(time_ms(run, device, reps))
        ms = {arm: statistics.median(v) for arm, v in per_round.items()}
        gemm_arms = [a for a in ms if a.startswith("gemm")]
        best = min(gemm_arms, key=lambda a: ms[a]) if gemm_arms else None
        row = {"model": model.name, "codebook": codebook, "rows": rows, "ms": ms,
               "max_err": errs, "best_gemm": best}
        if device.startswith("cuda"):  # speed ratios against fp16, whatever arms ran
            row["served_x_fp16"] = ms["fp16"] / ms["served"]
            if best is not None:
                row["best_gemm_x_fp16"] = ms["fp16"] / ms[best]
            if "int4" in ms:
                row["int4_x_fp16"] = ms["fp16"] / ms["int4"]
        print(f"{model.name} {codebook} rows={rows}: "
              + ", ".join(f"{a} {v:.3f} ms" for a, v in ms.items()) + f"; best {best}",
              flush=True)
        out.append(row)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(p, "2,4,8,16,32,64,128", 3, 10)
    p.add_argument("--configs", default="all",
                   help="'all' (tuning.GEMM_SWEEP), 'none', or a comma list of indices into it "
                        "and/or geometries WARPSxROWS_PER_STEPxPROGRAMS_PER_SM, e.g. 0,4x2x4")
    p.add_argument("--codebook", default="tetra", choices=("tetra", "ball"),
                   help="the lattice codes: Tetra words or the ball codebook's planes14 records")
    a = p.parse_args()
    model, device, rows = setup(a, [2, 17])
    configs = parse_configs(a.configs)
    if a.dry_run:
        configs = configs[:2]
    emit("gemm", bench(model, rows, configs, device, a.rounds, a.reps, a.codebook), device,
         a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
