"""Does a discrete pass over the codes pay? An artifact before and after
:mod:`leechq.quant.revisit`.

Loads a leechq artifact (served on the CPU's reference path, as ``leechq.load`` gives it) and its
reference model, collects the KL gradient of every lattice matrix over calibration windows (the
same text and window layout as ``quality.py``: ``--train-tokens`` of the training role), tries
each ``--steps`` size, keeps the one the monitor windows (the calibration text's held-out role)
like best, then measures both models on the two held-out sets of ``quality.py`` (in-domain
``--in-domain``, unseen ``--unseen-domain``) with paired bootstrap intervals of the difference::

    PYTHONPATH=src python benchmarks/code_revisit.py --artifact ART --model smollm2-135m \\
        --train-tokens 8192 --steps 0.1,0.2,0.4

The last stdout line is one JSON object ``{"bench": "code_revisit", ...}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quality import log, paired_bootstrap, per_window, real_setup, summarize


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--artifact", required=True)
    ap.add_argument("--model", default="smollm2-135m", help="the artifact's reference model")
    ap.add_argument("--steps", default="0.1,0.2,0.4")
    ap.add_argument("--train-tokens", type=int, default=8192,
                    help="gradient tokens (windows of --window)")
    ap.add_argument("--calib-tokens", type=int, default=8192,
                    help="as the artifact's run: places the training windows after it")
    ap.add_argument("--calib-data", default=None)
    ap.add_argument("--in-domain", default="pydoc")
    ap.add_argument("--unseen-domain", default="fortunes")
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--boot", type=int, default=1000)
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args()
    steps = [float(s) for s in args.steps.split(",") if s]

    import leechq
    from leechq.eval.ppl import window_nll
    from leechq.quant.revisit import revisit_codes
    from leechq.quant.row_scales import model_logits

    t0 = time.perf_counter()
    reference, sets, roles = real_setup(args.model, args)
    student, _ = leechq.load(args.artifact, device="cpu", prefer="reference", tokenizer=False)
    records = {n: m.record for n, m in student.named_modules()
               if getattr(m, "record", None) is not None and hasattr(m, "set_record")}
    train, monitor = roles["train"], roles["monitor"]
    with torch.no_grad():
        t_train = [model_logits(reference, train[i : i + 1]).float() for i in range(len(train))]
        t_mon = [model_logits(reference, monitor[i : i + 1]).float()
                 for i in range(len(monitor))]
        ref = {}
        for dset, ids in sets.items():
            logits = [model_logits(reference, ids[i : i + 1]).float() for i in range(len(ids))]
            ref[dset] = (logits, [float(window_nll(r, ids[i : i + 1])[0])
                                  for i, r in enumerate(logits)])
    log(f"setup {time.perf_counter() - t0:.1f} s: {len(records)} records, "
        f"{len(train)} gradient windows, {len(monitor)} monitor windows")
    before = {d: per_window(student, ref[d][0], ids) for d, ids in sets.items()}
    t1 = time.perf_counter()
    res = revisit_codes(student, records, t_train, train, t_mon, monitor, steps=steps,
                        progress=lambda m: log(f"revisit: {m}"))
    seconds = time.perf_counter() - t1
    after = {d: per_window(student, ref[d][0], ids) for d, ids in sets.items()}
    rows = []
    for dset in sets:
        b, a = summarize(before[dset], ref[dset][1]), summarize(after[dset], ref[dset][1])
        ci = paired_bootstrap(after[dset], before[dset], ref[dset][1], args.boot)
        rows.append({"set": dset, "before": b, "after": a, "after_minus_before_95": ci})
        log(f"{dset}: ppl x {b['ppl_ratio']:.4f} -> {a['ppl_ratio']:.4f} "
            f"[{ci['ppl_ratio'][0]:+.4f}, {ci['ppl_ratio'][1]:+.4f}], KL {b['kl']:.4f} -> "
            f"{a['kl']:.4f}")
    out = {"bench": "code_revisit", "artifact": args.artifact, "model": args.model,
           "chosen_step": res.step, "monitor_kl": res.monitor_kl, "changed": res.changed,
           "revisit_s": round(seconds, 1), "rows": rows,
           "protocol": {k: getattr(args, k) for k in ("train_tokens", "calib_tokens", "windows",
                                                      "window", "in_domain", "unseen_domain")}}
    line = json.dumps(out)
    if args.out:
        Path(args.out).write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
