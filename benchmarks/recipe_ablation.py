"""Ablation of the full-model recipe (layouts-kernels-recipe.md §5) on a zoo model, on the CPU.

Arms, all from ONE lattice encoding (same codes), evaluated on the same held-out windows of the
evaluation split (never used for any choice):

* ``bare``         every encoded projection on the lattice, tables as in the checkpoint;
* ``+rows``        bare + row scales trained by KL to the reference (§5.3);
* ``+int4``        bare + int4 g128 for the matrices the full recipe chooses (§5.2/§5.4), swapped
                   post hoc (not re-encoded — the recipe's default re-encodes; here the codes are
                   shared by every arm);
* ``+int4+rows``   +int4, then row scales trained on top;
* ``+tables8``     bare + 8-bit g64 embedding (tied head: the same table) / 8-bit head;
* ``+tables4``     bare + 4-bit g64 embedding (a tied head follows), 8-bit untied head;
* ``+int4+tables4`` the two together;
* ``full``         +int4 + tables4 + row scales (the full recipe without its tuning step:
                   sensitivity measured with the final tables, then training on top), written as
                   an artifact, re-loaded, checked;
* ``+tune``        bare + end-to-end tuning of every continuous parameter (lattice row scales and
                   centroids, norms, biases; :mod:`leechq.quant.tune`), the held-out calibration
                   monitor keeping the best state;
* ``full+tune``    the full recipe with the tuning step (tables and int4 scales tuned too; this
                   arm's ``--tune-steps``);
* ``dense+tables8``, ``dense+tables4`` the table step alone on the dense reference: exact at full
                   depth (no encoding involved).

Every choice (the int4 set) is made on calibration windows; training reads calibration windows.

Partial depth (``--blocks K``): on a shared 2-core CPU the Tetra encoder runs at a few hundred to a
few thousand blocks per second, so only the first K decoder blocks are encoded (the rest stay dense,
f32). Quality numbers are those of that partially quantized model. Two b/param columns are given:
``bpp_est`` — whole-model bits per parameter ESTIMATED at full depth (the dense blocks' projections
counted at the encoded blocks' mean served rate, same per-weight int4 mix; rule 2 of §4.9), and
``bpp_file`` — the rule-2 rate of the partial-depth model as it is (dense blocks at 16 bits). With
``--blocks`` = all blocks they are equal. The int4 budget is ``--target-bpp`` on ``bpp_est``.
Caveat of partial depth: the table arms change the whole model while the lattice error covers only
K of the blocks, so table-vs-projection trade-offs must be read from the ``dense+tables*`` rows and
the per-step KL deltas, not from the partial-depth ``full`` row alone.

Threads: ``--threads 1`` by default — on the shared, loaded 2-core box two intra-op threads made
forward passes 2× slower than one (and the Tetra encoder forces one thread itself).

Usage: ``python benchmarks/recipe_ablation.py --model smollm2-135m --blocks 2 [--train-steps 40]``.
Prints a table, then one JSON line (the last line).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import math
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from leechq.config import QuantConfig
from leechq.formats.accounting import artifact_report
from leechq.formats.artifact import read_artifact
from leechq.quant.recipe import run_recipe
from leechq.quant.recipe_spec import Recipe, resolve_recipe
from leechq.quant.row_scales import RowScaleConfig, set_module_weights
from leechq.quant.tune import TuneConfig

ARMS = ("bare", "+rows", "+int4", "+int4+rows", "+tables8", "+tables4", "+int4+tables4", "full",
        "+tune", "full+tune", "dense+tables8", "dense+tables4")
DEPENDS = {
    "+int4": {"full", "bare"},
    "+int4+rows": {"full", "bare", "+int4"},
    "+int4+tables4": {"full", "+tables4"},
}
MODEL_USERS = {"bare": {"+int4"}, "+tables4": {"+int4+tables4"}, "+int4": {"+int4+rows"}}
"""Arms whose *model* another arm copies; every other arm's model (but ``full``'s, which the file
check reads) is dropped as soon as it is evaluated, so memory holds a few models, not all."""


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _load() -> float:
    return os.getloadavg()[0]


def partial_quantize_fn(
    arch: Any, n_blocks: int, progress: bool, checkpoint: str | None = None
) -> Any:
    """``quantize_fn`` for :func:`run_recipe` that encodes only the first ``n_blocks`` blocks.

    The model's block list is truncated while the encoder runs (so calibration stops at block K)
    and restored after; the raw tensors are rebuilt from the whole model (dense blocks included).
    ``checkpoint``: the encoder's resumable directory, kept (a rerun with the same model,
    configuration and calibration reuses the encoded blocks).
    """
    from leechq.models.quantize import _raw_tensors, quantize_model_in_place

    def fn(model: Any, calib: torch.Tensor, cfg: QuantConfig) -> Any:
        parent_path, _, leaf = arch.layers_path.rpartition(".")
        parent = model.get_submodule(parent_path)
        full = getattr(parent, leaf)
        setattr(parent, leaf, torch.nn.ModuleList(list(full)[:n_blocks]))
        try:
            ckpt = None
            if checkpoint is not None:
                ckpt = Path(checkpoint) / f"{cfg.digest()[:16]}-{n_blocks}"
            mq = quantize_model_in_place(model, calib, cfg, progress=progress,
                                         checkpoint_dir=ckpt)
        finally:
            setattr(parent, leaf, full)
        raw, tied = _raw_tensors(model, arch, mq.records, cfg)
        return SimpleNamespace(records=mq.records, raw=raw, tied=tied, seconds=mq.seconds,
                               capture_seconds=mq.capture_seconds, provenance=mq.provenance)

    return fn


def evaluate(reference: Any, model: Any, windows: Any) -> dict[str, Any]:
    """Held-out KL / perplexity / agreement of ``model`` against ``reference``."""
    from leechq.eval.kl import kl_to_reference

    r = kl_to_reference(reference, model, windows, batch_size=2)
    return {"kl": r.kl, "ppl": r.model_ppl, "ref_ppl": r.ref_ppl,
            "ppl_ratio": r.model_ppl / r.ref_ppl, "agreement": r.agreement,
            "window_kl": r.window_kl, "seconds": r.seconds}


def paired(a: list[float], b: list[float]) -> tuple[float, float]:
    """Mean of b − a over windows and the half-width of its normal 95 % interval."""
    d = [y - x for x, y in zip(a, b, strict=True)]
    m = sum(d) / len(d)
    if len(d) < 2:
        return m, float("nan")
    var = sum((x - m) ** 2 for x in d) / (len(d) - 1)
    return m, 1.96 * math.sqrt(var / len(d))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--codebook", default="tetra")
    p.add_argument("--blocks", type=int, default=2, help="decoder blocks to encode (0 = all)")
    p.add_argument("--calib-windows", type=int, default=12)
    p.add_argument("--calib-window", type=int, default=256)
    p.add_argument("--train-windows", type=int, default=64)
    p.add_argument("--train-window", type=int, default=256)
    p.add_argument("--train-steps", type=int, default=30)
    p.add_argument("--train-lr", type=float, default=2e-3)
    p.add_argument("--train-warmup", type=int, default=4)
    p.add_argument("--train-batch", type=int, default=2)
    p.add_argument("--tune-steps", type=int, default=30, help="steps of the +tune arms")
    p.add_argument("--tune-lr", type=float, default=2e-3)
    p.add_argument("--sens-windows", type=int, default=2)
    p.add_argument("--sens-window", type=int, default=256)
    p.add_argument("--eval-windows", type=int, default=8)
    p.add_argument("--eval-window", type=int, default=256)
    p.add_argument("--target-bpp", type=float, default=2.7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="where encoding, sensitivity and row-scale training run (evaluation: CPU)")
    p.add_argument("--out", default=None, help="also write the JSON to this file")
    p.add_argument("--keep-artifact", default=None, help="write the full artifact here")
    p.add_argument("--arms", default=",".join(ARMS), help=f"arms to run (of {', '.join(ARMS)})")
    p.add_argument("--encode-checkpoint", default=None,
                   help="keep the encoder's resumable checkpoint here (reruns reuse it)")
    args = p.parse_args(argv)
    want = set(args.arms.split(","))
    if want - set(ARMS):
        p.error(f"unknown arms {sorted(want - set(ARMS))}")

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    from leechq.data import (
        calibration_text,
        consecutive_windows,
        evaluation_text,
        token_windows,
    )
    from leechq.models.hf_load import load_model

    load_start = _load()
    t_all, cpu_all = time.perf_counter(), _cpu_seconds()
    loaded = load_model(args.model, device="cpu", dtype="float32")
    reference, tok, arch = loaded.model, loaded.tokenizer, loaded.arch
    n_layers = len(arch.layers(reference))
    k = n_layers if args.blocks <= 0 else min(args.blocks, n_layers)

    # Calibration text, cut into disjoint roles (encode | sensitivity | training | monitor).
    need = [(args.calib_windows, args.calib_window), (args.sens_windows, args.sens_window),
            (args.train_windows, args.train_window), (2, args.train_window)]
    (calib, sens, train, monitor), _ = consecutive_windows(
        tok, calibration_text(), need, source="pydoc:calibration")
    eval_w = token_windows(tok, evaluation_text(), args.eval_windows, args.eval_window,
                           source="pydoc:evaluation")

    embed_name = f"{arch.embed_path}.weight"
    head_name = f"{arch.head_path}.weight"
    proj = [f"{arch.layers_path}.{i}.{pr.name}.weight" for i in range(k, n_layers)
            for pr in arch.projections]
    base_cfg = QuantConfig(codebook=args.codebook, calib_windows=args.calib_windows,
                           calib_window_len=args.calib_window, calib_batch=4, device=args.device,
                           calibration=f"pydoc:calibration {args.calib_windows}x"
                                       f"{args.calib_window}")
    qfn = partial_quantize_fn(arch, k, progress=sys.stderr.isatty(),
                              checkpoint=args.encode_checkpoint)
    rows_cfg = RowScaleConfig(steps=args.train_steps, lr=args.train_lr,
                              warmup_steps=args.train_warmup, batch=args.train_batch,
                              checkpoint_every=0)
    tune_cfg = TuneConfig(steps=args.tune_steps, lr=args.tune_lr, warmup_steps=args.train_warmup,
                          batch=args.train_batch, monitor_every=max(1, args.tune_steps // 10),
                          checkpoint_every=0)
    common = dict(quantize_fn=qfn, embed_name=embed_name, head_name=head_name,
                  train_windows=train, sensitivity_windows=sens, monitor_windows=monitor,
                  dense_projections=proj)

    print(f"[ablation] {args.model}: encoding {k}/{n_layers} blocks with {args.codebook} "
          f"(load {load_start:.1f})", file=sys.stderr)
    t0, c0 = time.perf_counter(), _cpu_seconds()
    student = copy.deepcopy(reference)
    enc = qfn(student, calib, base_cfg)
    encode = {"seconds": time.perf_counter() - t0, "cpu_seconds": _cpu_seconds() - c0,
              "encoder_seconds": enc.seconds,
              "blocks": sum(r.d_out * (r.d_in // 24) for r in enc.records.values())}
    print(f"[ablation] encoded in {encode['seconds']:.0f} s", file=sys.stderr)

    def arm(recipe: Recipe) -> Any:
        t, c = time.perf_counter(), _cpu_seconds()
        res = run_recipe(reference, calib, base_cfg, recipe, student=copy.deepcopy(student),
                         encoded=enc, **common)
        res.metadata["arm_seconds"] = time.perf_counter() - t
        res.metadata["arm_cpu_seconds"] = _cpu_seconds() - c
        return res

    # "full" is steps 1-4 here (the recipe's tuning step is the separate "full+tune" arm)
    full_recipe = resolve_recipe("full", args.target_bpp, requantize=False, row_scales=rows_cfg,
                                 tune=None, sensitivity_windows=args.sens_windows,
                                 sensitivity_window_len=args.sens_window, device=args.device)
    order = [a for a in ARMS if a in want]
    need = set(order)
    for a in order:
        need |= DEPENDS.get(a, set())
    results: dict[str, Any] = {}
    rows: dict[str, dict[str, Any]] = {}

    def finish(name: str) -> None:
        """Evaluate a finished arm (wanted ones, and ``bare``: the ΔKL base), then drop every
        model no arm still to be built will copy."""
        res = results[name]
        if name in want or name == "bare":
            ev = evaluate(reference, res.model, eval_w)
            rows[name] = {
                "bpp_est": (float("nan") if name.startswith("dense")
                            else res.bits(proj).bits_per_param),
                "bpp_file": res.bits(()).bits_per_param,
                **{k2: ev[k2] for k2 in ("kl", "ppl", "ref_ppl", "ppl_ratio", "agreement")},
                "window_kl": ev["window_kl"],
                "int4": sum(type(r).__name__ == "Int4Weight" for r in res.records.values()),
            }
            print(f"[ablation] {name}: KL {ev['kl']:.5f}", file=sys.stderr)
        pending = need - results.keys()
        for done, r in results.items():
            if done != "full" and not (MODEL_USERS.get(done, set()) & pending):
                r.model = None
        gc.collect()

    chosen: list[str] = []
    if "full" in need:
        print("[ablation] full recipe", file=sys.stderr)
        results["full"] = arm(full_recipe)
        chosen = results["full"].metadata["selection"]["int4"]
        finish("full")
    if "full+tune" in need:
        print("[ablation] full+tune", file=sys.stderr)
        results["full+tune"] = arm(full_recipe.replace(name="full+tune", tune=tune_cfg))
        finish("full+tune")
    if "bare" in need:
        results["bare"] = arm(Recipe(name="bare", device=args.device))
        finish("bare")
    if "+tune" in need:
        print("[ablation] +tune", file=sys.stderr)
        results["+tune"] = arm(Recipe(name="tune", tune=tune_cfg, device=args.device))
        finish("+tune")
    if "+rows" in need:
        print("[ablation] +rows", file=sys.stderr)
        results["+rows"] = arm(Recipe(name="rows", row_scales=rows_cfg, device=args.device))
        finish("+rows")
    for bits in (8, 4):
        if f"+tables{bits}" in need:
            results[f"+tables{bits}"] = arm(Recipe(name=f"tables{bits}", embedding_bits=bits,
                                                   head_bits=8))
            finish(f"+tables{bits}")
    # +int4 and +int4+tables4 reuse the full recipe's choice (same records, post hoc)
    for name, base in (("+int4", "bare"), ("+int4+tables4", "+tables4")):
        if name not in need:
            continue
        src = results[base]
        model = copy.deepcopy(src.model)
        recs = dict(src.records)
        recs.update({n: results["full"].records[n] for n in chosen})
        set_module_weights(model, {n: recs[n] for n in chosen})
        results[name] = SimpleNamespace(model=model, records=recs, raw=src.raw, tied=src.tied,
                                        metadata={"int4": chosen},
                                        bits=lambda d=(), r=recs, w=src.raw: _bits(r, w, d))
        finish(name)
    if "+int4+rows" in need:
        print("[ablation] +int4+rows", file=sys.stderr)
        src = results["+int4"]
        t, c = time.perf_counter(), _cpu_seconds()
        res = run_recipe(reference, calib, base_cfg,
                         Recipe(name="int4+rows", row_scales=rows_cfg, device=args.device),
                         student=copy.deepcopy(src.model),
                         encoded=SimpleNamespace(records=src.records, raw=src.raw,
                                                 tied=src.tied, seconds=0.0, provenance={}),
                         **common)
        res.metadata["arm_seconds"] = time.perf_counter() - t
        res.metadata["arm_cpu_seconds"] = _cpu_seconds() - c
        results["+int4+rows"] = res
        finish("+int4+rows")
    # The table step alone on the dense reference (full depth, exact).
    from leechq.models.quantize import _raw_tensors
    from leechq.quant.recipe import apply_tables, table_records

    dense_raw, dense_tied = _raw_tensors(reference, arch, {}, base_cfg)
    for bits in (8, 4):
        if f"dense+tables{bits}" not in need:
            continue
        model = copy.deepcopy(reference)
        tables = table_records(dense_raw, dense_tied, Recipe(embedding_bits=bits, head_bits=8),
                               embed_name, head_name)
        apply_tables(model, tables)
        raw = {**dense_raw, **tables}
        results[f"dense+tables{bits}"] = SimpleNamespace(
            model=model, records={}, raw=raw, tied=dense_tied, metadata={},
            bits=lambda d=(), w=raw: _bits({}, w, ()))
        finish(f"dense+tables{bits}")

    order = [a for a in ARMS if a in rows]
    for name in order:
        base = "bare" if not name.startswith("dense") and "bare" in rows else None
        if base is None:
            rows[name]["kl_minus_bare"] = rows[name]["kl_minus_bare_ci95"] = float("nan")
            continue
        m, hw = paired(rows[base]["window_kl"], rows[name]["window_kl"])
        rows[name]["kl_minus_bare"] = m
        rows[name]["kl_minus_bare_ci95"] = hw

    file_check: dict[str, Any] = {}
    if "full" in results:
        file_check = check_file(results["full"], reference, tok, eval_w, args, k)
    meta = results["full"].metadata if "full" in results else {}
    summary = {
        "model": args.model,
        "codebook": args.codebook,
        "device": args.device,
        "blocks_encoded": k,
        "blocks_total": n_layers,
        "threads": args.threads,
        "loadavg_start": load_start,
        "loadavg_end": _load(),
        "windows": {"calib": list(calib.shape), "sensitivity": list(sens.shape),
                    "train": list(train.shape), "eval": [eval_w.n_windows, eval_w.window],
                    "eval_fingerprint": eval_w.fingerprint},
        "encode": encode,
        "row_scales_settings": rows_cfg.to_dict(),
        "full_steps": meta.get("steps"),
        "full_recipe": meta.get("describe"),
        "selection": {k2: meta["selection"][k2] for k2 in (
            "chosen", "int4", "tables_upgraded", "budget_bits", "spent_bits", "predicted_gain",
            "cost_scale")} if meta else None,
        "sensitivity_top": sorted(
            ((n, v["gain"], v["extra_bits"]) for n, v in meta["sensitivity"]["matrices"].items()),
            key=lambda x: -x[1])[:12] if meta else None,
        "row_scales": {n: results[n].metadata.get("row_scales") for n in
                       ("full", "+rows", "+int4+rows") if n in results},
        "arms": {n: {k2: v for k2, v in r.items() if k2 != "window_kl"} for n, r in rows.items()},
        "file": file_check,
        "seconds": time.perf_counter() - t_all,
        "cpu_seconds": _cpu_seconds() - cpu_all,
    }

    print(f"\n{args.model}: {k}/{n_layers} blocks encoded ({args.codebook}), eval "
          f"{eval_w.n_windows}x{eval_w.window} held-out tokens, "
          f"ref ppl {rows[order[0]]['ref_ppl']:.3f}")
    print(f"{'arm':<15} {'bpp_est':>8} {'bpp_file':>8} {'int4':>5} {'KL':>9} {'ΔKL vs bare':>20} "
          f"{'ppl ratio':>9} {'agree':>7}")
    for name in order:
        r = rows[name]
        print(f"{name:<15} {r['bpp_est']:8.4f} {r['bpp_file']:8.4f} {r['int4']:5d} {r['kl']:9.5f} "
              f"{r['kl_minus_bare']:+10.5f}±{r['kl_minus_bare_ci95']:.5f} {r['ppl_ratio']:9.4f} "
              f"{r['agreement']:7.4f}")
    print(f"encode {encode['seconds']:.0f} s wall / {encode['cpu_seconds']:.0f} s CPU")
    for n in ("full", "+rows", "+int4+rows"):
        if n in results:
            steps = ", ".join(f"{s['step']} {s['seconds']:.0f} s" for s in
                              results[n].metadata["steps"])
            print(f"  {n}: {steps}")
    if file_check:
        print(f"artifact: {file_check['rates']} (partial depth), logits max diff "
              f"{file_check['max_logit_diff_vs_evaluated']:.2e}")
    line = json.dumps(summary, default=str)
    if args.out:
        Path(args.out).write_text(line + "\n", encoding="utf-8")
    print(line)
    return 0


def check_file(full: Any, reference: Any, tok: Any, eval_w: Any, args: Any, k: int) -> Any:
    """Write the full arm as an artifact, read it back, load it, compare its logits."""
    from leechq.models.load import load

    out_dir = Path(args.keep_artifact) if args.keep_artifact else \
        Path(tempfile.mkdtemp(prefix="leechq-ablation-")) / "full"
    full.write(out_dir, base_config=reference.config.to_dict(), tokenizer=tok,
               provenance={"model_id": args.model, "partial_depth_blocks": k}, overwrite=True)
    art = read_artifact(out_dir)
    report = artifact_report(out_dir)
    loaded_model, _ = load(out_dir, device="cpu", dtype="float32", tokenizer=False)
    ids = eval_w.ids[:1, :64]
    with torch.no_grad():
        diff = (loaded_model(input_ids=ids).logits - full.model(input_ids=ids).logits).abs().max()
    file_check = {
        "path": str(out_dir),
        "loads": True,
        "max_logit_diff_vs_evaluated": float(diff),
        "int4_records": report["counts"]["int4_records"],
        "tables": {n: g.bits for n, g in art.raw_quant.items()},
        "rates": {k2: report["rates"][k2] for k2 in ("kernel_bits_per_weight",
                                                     "whole_model_bits_per_param",
                                                     "on_disk_bits_per_param")},
    }
    return file_check


def _bits(records: Any, raw: Any, dense: Any) -> Any:
    from leechq.quant.recipe import projected_bits

    return projected_bits(records, raw, dense)


if __name__ == "__main__":
    raise SystemExit(main())
