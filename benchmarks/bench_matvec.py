"""One decode step's projections, Tetra (served) against cuBLAS fp16, at 1, 8 and 16 rows.

Run on a CUDA machine from the repository root::

    PYTHONPATH=src python benchmarks/bench_matvec.py                 # Qwen3-8B, rows 1, 8, 16
    PYTHONPATH=src python benchmarks/bench_matvec.py --dry-run       # tiny shapes, CPU interpreter

Protocol: one process; every projection of every layer is a distinct random matrix (the pass
streams gigabytes, far beyond the L2), grouped as the serving model groups them (q|k|v, o,
gate|up, down: one rotation and one launch group per group). Arms: ``fp16`` (one cuBLAS GEMM per
group through torch) and ``tetra48`` (random Tetra words drawn on the device, served as
:class:`leechq.nn.group.LeechqGroup` in the layout and with the kernels the dispatcher picks:
the rotation, then the batch-1 kernel at one row, the int8 tensor-core kernel at 8 and 16). Each
arm's whole pass is one CUDA graph, replayed; arms alternate in rounds and the ratio to fp16 is the
median of the per-round ratios. Before timing, one group of each kind is checked against the f64
product of its own bytes.

The last stdout line is one JSON object ``{"bench": "matvec", ...}`` (also written to ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from shapes import MODELS, Model  # noqa: E402


def git_sha() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, text=True,
                              capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def shapes_of(model: Model) -> list[tuple[list[int], int]]:
    """One layer's groups as ``([d_out of each member], d_in)``."""
    dims = {n: (o, i) for n, o, i in model.linears()}
    return [([dims[n][0] for n in names], dims[names[0]][1]) for names in model.groups()]


def build_tetra(model: Model, device: str, seed: int = 0, codebook: str = "tetra") -> list[Any]:
    """The served groups of every layer, codes drawn on the device: Tetra words (``codebook``
    "tetra") or ball-codebook ``planes14`` records ("ball")."""
    from leechq.formats.rotation import generate_rotation
    from leechq.serve.random_codes import _direct_group, _DirectLattice

    groups = []
    for layer in range(model.layers):
        for g, (outs, d_in) in enumerate(shapes_of(model)):
            rot = generate_rotation(d_in, 1000 * layer + g + 1)
            lat = [_DirectLattice(o, d_in, rot, codebook) for o in outs]
            groups.append(_direct_group(lat, device, torch.float16, seed=seed + 16 * layer + g))
    return groups


def build_fp16(model: Model, device: str) -> list[torch.Tensor]:
    """One fp16 weight per group (members concatenated by rows), variance about ``1/d_in``."""
    g = torch.Generator(device=device).manual_seed(0)
    return [torch.randn(sum(outs), d_in, generator=g, device=device, dtype=torch.float16)
            * d_in ** -0.5 for _ in range(model.layers) for outs, d_in in shapes_of(model)]


def check_tetra(groups: list[Any], rows: int, n_kinds: int) -> float:
    """The worst error, relative to Σ|w·x| per output, of the first layer's groups against the
    f64 product of their own bytes (the kernels' 16-bit activation rounding applied to the
    reference's input)."""
    from leechq.kernels import reference as ref
    from leechq.kernels.triton import ops

    worst = 0.0
    for grp in groups[:n_kinds]:
        part = grp.parts[0]
        x = torch.randn(rows, grp.d_in, device=part.row_scales.device, dtype=torch.float16)
        y = grp(x)
        xr = ref.rotate(x.float().cpu(), grp.rotation)
        dense = ref.tetra48_dequantize_rotated(replace(part, **{k: getattr(part, k).cpu() for k in (
            "words", "row_scales", "row_centroids", "tail", "row_scales_f64",
            "row_centroids_f64")}))
        worst = max(worst, ref.row_bound_error(y.cpu(), ops.kernel_activation(xr, part.n_blocks),
                                               dense))
    return worst


def graph_of(fn: Any, device: str) -> Any:
    """``fn`` captured once as a CUDA graph (after two eager warm-up calls), or ``fn`` itself off
    CUDA."""
    fn()
    fn()
    if not device.startswith("cuda"):
        return fn
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def time_ms(run: Any, device: str, reps: int) -> float:
    """Median milliseconds of one ``run()`` over ``reps`` timed calls (CUDA events)."""
    if not device.startswith("cuda"):
        return float("nan")
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def bench(model: Model, rows_list: list[int], device: str, rounds: int, reps: int
          ) -> list[dict[str, Any]]:
    tetra = build_tetra(model, device)
    fp16 = build_fp16(model, device)
    kinds = len(model.groups())
    out = []
    for rows in rows_list:
        err = check_tetra(tetra, rows, kinds)
        xs = {d: torch.randn(rows, d, device=device, dtype=torch.float16)
              for d in {g.d_in for g in tetra}}
        runs = {
            "tetra48": graph_of(lambda: [g(xs[g.d_in]) for g in tetra], device),
            "fp16": graph_of(lambda: [xs[w.shape[1]] @ w.T for w in fp16], device),
        }
        per_round = {arm: [] for arm in runs}
        for _ in range(rounds):
            for arm, run in runs.items():
                per_round[arm].append(time_ms(run, device, reps))
        ratios = [f / t for f, t in zip(per_round["fp16"], per_round["tetra48"], strict=True)]
        row = {"model": model.name, "rows": rows, "max_err": err,
               "fp16_ms": statistics.median(per_round["fp16"]),
               "tetra48_ms": statistics.median(per_round["tetra48"]),
               "speedup_vs_fp16": statistics.median(ratios) if device.startswith("cuda")
               else None}
        print(f"{model.name} rows={rows}: fp16 {row['fp16_ms']:.3f} ms, tetra48 "
              f"{row['tetra48_ms']:.3f} ms, x{row['speedup_vs_fp16']}, max err {err:.2e}",
              flush=True)
        out.append(row)
    return out


def add_common_args(p: argparse.ArgumentParser, rows: str, rounds: int, reps: int) -> None:
    """The options every projection benchmark takes (``bench_gemm.py`` too)."""
    p.add_argument("--model", default="qwen3-8b", choices=sorted(MODELS))
    p.add_argument("--rows", default=rows, help="comma list of activation row counts")
    p.add_argument("--rounds", type=int, default=rounds)
    p.add_argument("--reps", type=int, default=reps)
    p.add_argument("--dry-run", action="store_true",
                   help="two tiny layers under the Triton interpreter on the CPU (no timing)")
    p.add_argument("--out", default=None, help="also write the JSON line here")


def setup(a: argparse.Namespace, dry_rows: list[int]) -> tuple[Model, str, list[int]]:
    """``(model, device, rows)`` from the common options; ``--dry-run``: the tiny model on the CPU
    interpreter at ``dry_rows``, one round of one replay."""
    if a.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"
        a.rounds, a.reps = 1, 1
        return Model("tiny", 2, 128, 256, 2, 1, 64), "cpu", dry_rows
    return MODELS[a.model], "cuda", [int(r) for r in a.rows.split(",")]


def emit(bench_name: str, results: list[dict[str, Any]], device: str, out: str | None) -> None:
    """Print the result JSON line (and write it to ``out``)."""
    line = json.dumps({"bench": bench_name, "git": git_sha(), "device": (
        torch.cuda.get_device_name() if device == "cuda" else "cpu"), "results": results})
    if out:
        Path(out).write_text(line + "\n")
    print(line)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(p, "1,8,16", 5, 20)
    a = p.parse_args()
    model, device, rows = setup(a, [1, 3])
    emit("matvec", bench(model, rows, device, a.rounds, a.reps), device, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
