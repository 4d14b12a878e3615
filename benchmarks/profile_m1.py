"""One Tetra matvec launch at a chosen shape for a profiler: the batch-1 ``m1`` kernel
(``ops.m1_config`` geometry) or, with ``--rows 2..8``, the int8 tensor-core kernel
(``ops.tetra48_matvec_imma_prepared``, its default geometry). E.g. on the GPU host

    ncu -k regex:tetra48_m1 --launch-skip 4 --launch-count 1 --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis_Tables --section SchedulerStats \\
        python benchmarks/profile_m1.py 24576 4096
    ncu -k regex:imma_kernel --launch-skip 2 --launch-count 1 --section WarpStateStats \\
        python benchmarks/profile_m1.py 24576 4096 --rows 8

(the first-use check launches the ``m1`` kernel twice and the loop five times; skip the first
four). Prints the geometry and a checksum; random codes (kernel time does not depend on the
weight values).
"""

from __future__ import annotations

import argparse

import torch

from leechq.formats.layouts.tetra48 import random_tetra48
from leechq.kernels.triton import ops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("d_out", type=int)
    ap.add_argument("d_in", type=int)
    ap.add_argument("--launches", type=int, default=5)
    ap.add_argument("--rows", type=int, default=1,
                    help="activation rows: 1 the m1 kernel, 2..8 the int8 tensor-core kernel")
    ap.add_argument("--layout", choices=("standard", "korder", "t64"), default="standard",
                    help="the Tetra words' layout (formats.layouts.tetra48_korder / tetra64)")
    args = ap.parse_args()
    w = random_tetra48(args.d_out, args.d_in, seed=1, device="cuda")
    if args.layout == "korder":
        from leechq.formats.layouts.tetra48_korder import to_kernel_order

        w = to_kernel_order(w)
    elif args.layout == "t64":
        from leechq.formats.layouts.tetra64 import to_tetra64

        w = to_tetra64(w)
    x = torch.randn(args.rows, args.d_in, device="cuda")
    xp = ops.prepare_activation(x, w.n_blocks, ops.tetra_kernel_tables("cuda").order)
    if args.rows == 1:
        cfg = ops.m1_config(w.d_out, w.n_blocks, torch.device("cuda"), w.tail_cols)
        print(cfg, flush=True)
        run = lambda: ops.tetra48_matvec_prepared(xp, w, 1, cfg)  # noqa: E731
    else:
        print("int8 tensor-core kernel, k_per", ops.imma_slices(w.d_out, w.n_blocks, xp.device),
              flush=True)
        run = lambda: ops.tetra48_matvec_imma_prepared(xp, w, args.rows)  # noqa: E731
    for _ in range(args.launches):
        y = run()
    torch.cuda.synchronize()
    print("checksum", float(y.abs().sum()))


if __name__ == "__main__":
    main()
