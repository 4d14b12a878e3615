"""One shape of a many-row Tetra product, for Nsight Compute: the float16 tensor-core GEMM
(``ops.matmul_gemm``, ``--product gemm``) or the float16 copy and cuBLAS
(``ops.tetra48_matmul_dense``, ``--product dense``: the dequantization kernel, then the GEMM).

Draws a random Tetra matrix on the GPU (every 48-bit word is legal, so time does not depend on
the values), checks the product once against the f64 reference on its first and last 128 output
rows, then
calls the product ``--calls`` times and prints the median time of one call (CUDA events). Wrap it
in ``ncu`` to see where a launch's time goes, e.g. for Qwen3-8B's gate|up projection at 8 rows, or
the dequantization behind a 512-token prompt::

    ncu --kernel-name regex:gemm_kernel --launch-skip 2 --launch-count 1 --set full \\
        python benchmarks/ncu_gemm.py --d-out 24576 --d-in 4096 --rows 8
    ncu --kernel-name regex:dequant --launch-skip 2 --launch-count 1 --set full \\
        python benchmarks/ncu_gemm.py --product dense --rows 512

Run from the repository root with ``PYTHONPATH=src`` on a CUDA machine.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from bench_gemm import record_rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--d-out", type=int, default=24576)
    p.add_argument("--d-in", type=int, default=4096)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--layout", choices=("tetra48", "tetra64"), default="tetra64")
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--product", choices=("gemm", "dense"), default="gemm")
    a = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("ncu_gemm.py needs a CUDA device")

    from leechq.formats.layouts.tetra48 import random_tetra48
    from leechq.formats.layouts.tetra64 import to_tetra64
    from leechq.kernels import reference as ref
    from leechq.kernels.triton import ops

    w48 = random_tetra48(a.d_out, a.d_in, seed=1, device="cuda")
    w = to_tetra64(w48) if a.layout == "tetra64" else w48
    x = torch.randn(a.rows, a.d_in, device="cuda")
    product = ops.matmul_gemm if a.product == "gemm" else ops.tetra48_matmul_dense
    y = product(x, w)
    for sl in (slice(0, 128), slice(a.d_out - 128, a.d_out)):  # both ends of the grid
        part = record_rows(w48, sl)
        err = ref.row_bound_error(y[:, sl].cpu(), x.cpu(), ref.tetra48_dequantize_rotated(part))
        print(f"output rows {sl.start}..{sl.stop - 1}: largest error {err:.2e} of sum |w x|")
        if not err <= 4e-3:
            raise SystemExit(f"the {a.product} product disagrees with the f64 product: "
                             "not timing it")
    times = []
    for _ in range(a.calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        product(x, w)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    print(f"{a.product} {a.layout} {a.d_out}x{a.d_in}, {a.rows} rows: median "
          f"{statistics.median(times):.4f} ms per call over {a.calls} (all its launches)")


if __name__ == "__main__":
    main()
