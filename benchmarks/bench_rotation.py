"""Time the activation rotation kernel per input width (issue 4: rotation ≤ 10 % of its projection).

Both forms of the transform (butterflies, the default; tensor cores for 256 ≤ m ≤ 4096). Per width:
36 rotations in one CUDA graph, written in the prepared layout as a served model does (one launch,
and the earlier rotation + preparation launches) and in natural order, each checked against the
f64 reference first. Prints a table and one JSON line. Needs CUDA.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_matvec import Graphed, Pass, git_rev  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", default="4096,12288,2560,9728,5120,17408")
    ap.add_argument("--launches", type=int, default=36)
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    import torch

    from leechq.formats.rotation import generate_rotation
    from leechq.kernels import reference as ref
    from leechq.kernels.tables import tetra_kernel_tables
    from leechq.kernels.triton import ops_rotate

    dev = "cuda"
    order = tetra_kernel_tables(dev).order
    rows = []
    for n in (int(w) for w in args.widths.split(",")):
        tables = generate_rotation(n, 5 + n)
        rot = ops_rotate.DeviceRotation.from_tables(tables, dev)
        xs = [torch.randn(1, n, device=dev) for _ in range(2)]
        want = ref.rotate(xs[0].cpu(), tables).to(dev)
        err = max(float((ops_rotate.rotate(xs[0], rot, tensor_cores=tc) - want).abs().max()
                        / want.abs().max()) for tc in (False, True))
        assert err <= 1e-5, (n, err)
        prep_want = ref.prepare_activation(want, n // 24, order)
        for tc, prepared, one in ((False, True, True), (False, True, False), (False, False, True),
                                  (True, False, True)):
            out = (torch.full((ref.prepared_rows(1), ref.prepared_width(n // 24)), float("nan"),
                              device=dev)
                   if prepared else torch.empty(1, n, device=dev))
            if prepared:
                got = ops_rotate.rotate(xs[0], rot, prepared_order=order, out=out, one_launch=one)
                assert torch.allclose(got, prep_want, rtol=1e-5, atol=1e-6), (n, one)

            def run(b: int, out=out, prepared=prepared, rot=rot, xs=xs, tc=tc, one=one) -> None:
                for _ in range(args.launches):
                    ops_rotate.rotate(xs[b], rot, prepared_order=order if prepared else None,
                                      out=out, tensor_cores=tc, one_launch=one)

            gr = Graphed(Pass("rotation", 1, run, 0, args.launches), 2)
            ms = statistics.median(gr.time(7) for _ in range(3))
            r = {"n": n, "odd": rot.odd, "m": rot.pow2, "prepared": prepared,
                 "launches": 1 if one or not prepared else 2,
                 "form": "tensor cores" if tc else "butterflies",
                 "us_per_launch": round(1000 * ms / args.launches, 2), "err": f"{err:.1e}"}
            rows.append(r)
            how = ("prepared, one launch" if one else "prepared (+ prep launch)") if prepared \
                else "natural"
            print(f"{n:6d} = {rot.odd:2d} x {rot.pow2:5d}  {r['form']:12s} {how:24s}"
                  f"  {r['us_per_launch']:7.2f} us/launch  (err {err:.1e})", flush=True)
    doc = {"bench": "rotation", "gpu": torch.cuda.get_device_name(), "git": git_rev(),
           "results": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(doc) + "\n")
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
