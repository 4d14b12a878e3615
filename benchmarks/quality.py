"""Quality report: each model × arm on two held-out sets, with paired bootstrap intervals.

Arms (each a model that maps ids to logits, with its whole-model bits per parameter, rule 2):

* ``bare``       every block projection on the lattice (the encoder's defaults);
* ``full``       the full recipe at ``--target-bpp`` without its tuning step (int4 by sensitivity,
                 4/8-bit tables, row scales; :mod:`leechq.quant.recipe`; ``--tune-steps 0``);
                 several budgets (``--target-bpp 2.7,3.5``) share the bare encode and the
                 sensitivity pass and name the arms ``full @2.7`` …, each compared to the
                 ``--compare-to`` arm of its budget;
* ``full+tune``  the full recipe as ``leechq quantize --recipe full`` runs it: the above plus
                 ``--tune-steps`` steps of end-to-end tuning (:mod:`leechq.quant.tune`);
                 ``--tune-topk 128,0`` adds ``full+tune topk=0``: the same full result tuned
                 against another teacher cache (0: the full teacher every step);
                 ``--tune-steps 300,100`` adds ``full+tune steps=100``: the same full result
                 tuned for 100 steps on the same training text;
                 ``--table-group 64,32`` adds ``full tables-g32`` (and ``full+tune
                 tables-g32``): the same bare encode, the 4/8-bit tables in groups of 32
                 columns instead of the recipe's 64 (the budget pays for the scales);
                 ``--tune-batch 4`` adds ``full+tune batch=4``: the same full result tuned for
                 the same steps with 4 windows a step (the recipe's: 2), on as many training
                 windows as those steps read (``--train-tokens auto``) or on the first count's;
                 ``--tune-lr 4e-3`` adds ``full+tune lr=0.004``: the same full result tuned for
                 the same steps on the same windows at that peak learning rate (the recipe's:
                 2e-3);
                 ``--tune-temperature 2`` adds ``full+tune tau=2.0``: the same full result
                 tuned for the same steps on the same windows with the KL at temperature 2 (the
                 recipe's: 1);
                 ``--tune-without norms`` adds ``full+tune without=norms``: the same full result
                 tuned for the same steps on the same windows with the norm weights frozen
                 (any group of :data:`leechq.quant.composed.GROUPS`);
                 ``--tune-text generated`` adds ``full+tune text=generated``: the same full
                 result tuned for the same steps on as many windows of text the reference
                 samples itself (``mix``: every other training window replaced by one);
                 ``--int4-post-hoc`` adds ``full int4=post-hoc`` (and ``full+tune
                 int4=post-hoc``): the same encode and sensitivity pass, the chosen int4
                 matrices swapped in without the re-encode after the choice;
                 ``--damping 0.01,0.1`` adds ``bare damp=0.1``, ``full damp=0.1`` … (each
                 arm asked for): another bare encode whose GPTQ Hessians are damped by 0.1 of
                 their mean diagonal instead of the encoder's 0.01, and the recipe from it;
                 ``--train-tokens auto,32768`` adds ``full+tune train=32768``: the same encode
                 and sensitivity pass, the row scales and tuning trained on the first 32 768
                 tokens of the training windows (``auto``: as many windows as the steps read,
                 as ``leechq quantize`` takes by default);
  with ``--codebook`` other than ``tetra`` these are named after it (``ball full``);
* ``rtn-b``, ``gptq-b``, ``hqq-b`` the scalar baselines of :mod:`leechq.eval.baselines` at
  ``b`` ∈ ``--bits`` (group ``--group``; HQQ only where the ``hqq`` package imports);
* ``llamacpp``   llama.cpp's own types ``--llama-types`` (:mod:`leechq.eval.llamacpp`), made by the
  user's llama.cpp build in ``--llama-cpp DIR`` from the same source GGUF, each type with an
  importance matrix from the same calibration windows (arms ``llama.cpp TYPE+imatrix``).

Held-out sets (never used by any choice or training step): ``in-domain`` is the evaluation split of
the calibration corpus (``--in-domain``, default ``pydoc``: the Python documentation, whose
calibration split every arm calibrates and trains on); ``unseen`` is a corpus calibration never
saw (``--unseen-domain``, default ``fortunes``: quotations, verse and jokes from Debian's
``fortunes`` package, offline, :mod:`leechq.data.prose_corpus`; ``wikitext2``: English Wikipedia
prose, needs ``datasets`` and its data; ``c4`` is the other choice).

Measures per set: perplexity ratio to the reference, KL(reference ‖ arm) per predicted token,
greedy top-1 agreement; for each arm, the difference to ``--compare-to`` (default ``full``) with a
95 % paired bootstrap interval over windows (``--boot`` resamples; the same windows for both arms).
With ``--tasks mmlu[,gsm8k]`` (``--mmlu DIR|offline``, ``--gsm8k DIR``, ``--task-limit N``, as
``leechq eval`` takes them, :mod:`leechq.eval.tasks`) each arm and the reference are also scored
on the tasks, the same prompts for all (each result carries their token fingerprint); a row
carries its arm's scores under ``tasks`` and the JSON the reference's under ``reference_tasks``.
Every model is evaluated in float32 on ``--device``; each arm's measures are logged as soon as
they are known, so a run cut off by a time limit keeps what it measured. With ``--checkpoint-dir``
the quantization steps are resumable: a run longer than one sitting (a model too large for one
10-minute GPU call) is the same command repeated until it finishes.

The options and their checks are ``quality_args.py``; the arms' names ``quality_arms.py``.

Output: a table on stdout, one JSON line (the last line) and, with ``--plot PATH``, a plot
(``quality_plot.py``: perplexity ratio and KL vs bits per parameter; skipped with a message when
matplotlib is not installed). ``--plot-from a.json,b.json=LABEL`` plots the rows of earlier runs
together to ``--plot`` (default ``docs/quality.png``) and measures nothing (``=LABEL``: that
file's arms are named ``arm [LABEL]``, e.g. the same arms under another calibration text).

``--tiny``: a random 2-layer Llama (hidden 192, vocab 512; its head tied unless a table is
lattice-coded) and two synthetic token streams as the two "domains", quantized with the test
suite's stand-in direction codebook
(``tests/quant/standin_codebook.py``) so that the whole report runs in about a minute on a CPU: it
checks the pipeline, not the quality of the lattice.

Usage: ``python benchmarks/quality.py --tiny`` or ``python benchmarks/quality.py --models
smollm2-135m --device cuda``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import math
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quality_args import RECIPE_ARMS, checked, parser
from quality_arms import (
    arm_prefix,
    batch_arm,
    budget_suffix,
    compared_arm,
    damping_suffix,
    lr_arm,
    post_hoc_arm,
    steps_arm,
    tau_arm,
    text_arm,
    topk_arm,
    train_arm,
    without_arm,
)
from quality_plot import plot, rows_of

ROOT = Path(__file__).resolve().parents[1]
_T0 = time.perf_counter()


def log(msg: str) -> None:
    """One progress line on stderr, flushed, with the seconds since start (a run cut off by a time
    limit still shows how far it got)."""
    print(f"[quality +{time.perf_counter() - _T0:7.1f} s] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------------
# measures


@torch.no_grad()
def per_window(model: Any, reference_logits: list[torch.Tensor], ids: torch.Tensor
               ) -> dict[str, list[float]]:
    """Per window: summed NLL, summed KL(ref ‖ model), agreeing positions, positions.

    ``reference_logits``: one [1, T, V] tensor per window (CPU, f32).
    """
    from leechq.eval.agreement import agreement_counts
    from leechq.eval.kl import kl_of_logits
    from leechq.eval.ppl import window_nll
    from leechq.quant.row_scales import model_logits

    out: dict[str, list[float]] = {"nll": [], "kl": [], "agree": [], "n": []}
    for i in range(ids.shape[0]):
        w = ids[i : i + 1]
        logits = model_logits(model, w).float().cpu()
        kl, _ = kl_of_logits(reference_logits[i], logits)
        a, n = agreement_counts(reference_logits[i], logits)
        out["nll"].append(float(window_nll(logits, w)[0]))
        out["kl"].append(float(kl.sum()))
        out["agree"].append(float(a))
        out["n"].append(float(n))
    return out


@contextlib.contextmanager
def on_device(model: Any, device: str) -> Iterator[None]:
    """``model`` evaluated on ``device`` in float32 (moved there for the block, then back to the
    CPU, so that one arm at a time holds device memory)."""
    if device == "cpu":
        yield
        return
    model.to(device)
    try:
        yield
    finally:
        model.to("cpu")
        torch.cuda.empty_cache()


def task_scores(model: Any, tokenizer: Any, args: argparse.Namespace, label: str
                ) -> dict[str, dict[str, Any]]:
    """``args.tasks`` on ``model``: per task its headline ``metric`` and ``value``, the items
    scored ``n``, the standard error where the task has one (MMLU's micro ``stderr``), MMLU's
    ``picked_letters`` (how often the model chose each letter) and the prompts' token
    ``fingerprint``; a progress bar on stderr named ``TASK (label)``."""
    from leechq.eval.runner import SuiteConfig, run_tasks

    config = SuiteConfig(tasks=args.tasks, mmlu_path=args.mmlu, gsm8k_path=args.gsm8k,
                         task_limit=args.task_limit)
    with on_device(model, args.device):
        done = run_tasks(model, tokenizer, config, progress=label)
    return {name: {"metric": r["metric"], "value": r["value"], "n": r["n"],
                   "stderr": r["details"].get("micro_stderr"),
                   **({"picked_letters": r["details"]["picked_letters"]}
                      if "picked_letters" in r["details"] else {}),
                   "fingerprint": r["prompts_fingerprint"]} for name, r in done.items()}


def task_line(scores: dict[str, dict[str, Any]]) -> str:
    """One line of task scores: ``mmlu 0.312 ± 0.041 (n 285)``."""
    return ", ".join(f"{name} {s['value']:.3f}"
                     + (f" ± {s['stderr']:.3f}" if s["stderr"] is not None else "")
                     + f" (n {s['n']})" for name, s in scores.items())


def summarize(arm: dict[str, list[float]], ref_nll: list[float]) -> dict[str, float]:
    """Perplexity ratio, mean KL per token and agreement of per-window sums."""
    n = sum(arm["n"])
    return {
        "ppl_ratio": math.exp((sum(arm["nll"]) - sum(ref_nll)) / n),
        "kl": sum(arm["kl"]) / n,
        "agreement": sum(arm["agree"]) / n,
    }


def paired_bootstrap(a: dict[str, list[float]], b: dict[str, list[float]], ref_nll: list[float],
                     boot: int, seed: int = 0) -> dict[str, list[float]]:
    """95 % intervals of ``summarize(a) − summarize(b)`` over windows resampled with replacement
    (the same resample for both arms: paired)."""
    g = torch.Generator().manual_seed(seed)
    m = len(ref_nll)
    diffs: dict[str, list[float]] = {"ppl_ratio": [], "kl": [], "agreement": []}
    for _ in range(boot):
        idx = torch.randint(0, m, (m,), generator=g).tolist()

        def take(d: dict[str, list[float]], idx: list[int] = idx) -> dict[str, list[float]]:
            return {k: [v[i] for i in idx] for k, v in d.items()}

        ref = [ref_nll[i] for i in idx]
        sa, sb = summarize(take(a), ref), summarize(take(b), ref)
        for k in diffs:
            diffs[k].append(sa[k] - sb[k])
    out = {}
    for k, v in diffs.items():
        v.sort()
        out[k] = [v[int(0.025 * (len(v) - 1))], v[int(0.975 * (len(v) - 1))]]
    return out


# --------------------------------------------------------------------------------------------------
# models, data and arms


def tiny_setup(args: argparse.Namespace) -> tuple[Any, dict[str, torch.Tensor], dict[str, Any]]:
    """The ``--tiny`` reference, its two synthetic domains and the calibration roles."""
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(ROOT / "tests" / "quant"))
    from standin_codebook import register

    args.codebook = register()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=512, hidden_size=192, intermediate_size=384,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256,
                      # a lattice-coded table needs its own head: untied then
                      tie_word_embeddings=not (args.lattice_head or args.lattice_embedding))
    model = LlamaForCausalLM(cfg).eval()

    def stream(seed: int, n: int, t: int) -> torch.Tensor:  # a different bigram walk per domain
        g = torch.Generator().manual_seed(seed)
        step = torch.randint(1, 9, (512,), generator=g)
        ids = torch.empty(n, t, dtype=torch.int64)
        ids[:, 0] = torch.randint(0, 512, (n,), generator=g)
        for j in range(1, t):
            jump = torch.randint(0, 4, (n,), generator=g) == 0
            ids[:, j] = torch.where(jump, torch.randint(0, 512, (n,), generator=g),
                                    (ids[:, j - 1] + step[ids[:, j - 1]]) % 512)
        return ids

    w = args.window
    calib = stream(1, 64, w)
    train = calib[10:26]
    roles = {"calib": calib[:8], "sens": calib[8:10], "monitor": calib[26:28],
             "train": [train[:n] for n in args.train_windows],
             "train_batch": [train[:n] for n in args.batch_windows]}
    sets = {"in-domain": stream(2, args.windows, w), "unseen": stream(3, args.windows, w)}
    return model, sets, roles


def real_setup(name: str, args: argparse.Namespace) -> tuple[Any, dict[str, torch.Tensor],
                                                              dict[str, Any]]:
    """A zoo/HF model, its two held-out sets and the calibration roles (calibration split)."""
    from leechq.cli.quantize import calibration_source
    from leechq.data import consecutive_windows, token_windows
    from leechq.data.corpus import load_text
    from leechq.models.hf_load import load_model

    loaded = load_model(name, device="cpu", dtype="float32")
    tok = loaded.tokenizer
    w = args.window
    n_calib = -(-args.calib_tokens // w)
    text, args.calibration = calibration_source(args.calib_data)  # what `leechq quantize` uses
    log(f"calibration text: {args.calibration}")
    # the training role holds the most windows an arm trains on, each arm the first of them
    # (``leechq quantize``'s layout; the text may end first, as there)
    batch_windows = getattr(args, "batch_windows", [])  # set by main(), not by other callers
    most = max(args.train_windows + batch_windows)
    (calib, sens, train, monitor), _ = consecutive_windows(
        tok, text, [(n_calib, w), (4, 256), (most, w), (2, w)],
        source=args.calibration, shrink=2)
    if train.shape[0] < most:
        log(f"the calibration text holds {train.shape[0]} training windows of the {most} "
            "asked for")
    in_split = "evaluation"
    unseen_split = "test" if args.unseen_domain == "wikitext2" else "evaluation"
    sets = {
        "in-domain": token_windows(tok, load_text(args.in_domain, in_split), args.windows, w).ids,
        "unseen": token_windows(tok, load_text(args.unseen_domain, unseen_split), args.windows,
                                w).ids,
    }
    roles = {"calib": calib, "sens": sens, "monitor": monitor,
             "train": [train[:n] for n in args.train_windows],
             "train_batch": [train[:n] for n in batch_windows],
             "source": loaded.source, "tokenizer": tok}
    loaded.model.eval()
    return loaded.model, sets, roles


def leechq_arms(reference: Any, roles: dict[str, Any], args: argparse.Namespace,
                wanted: list[str], damping: float | None = None
                ) -> dict[str, tuple[Any, float, dict[str, Any]]]:
    """The bare / full / full+tune arms: name → (model, bits per parameter, details), encoded
    with Hessian damping ``damping`` (None: the encoder's; another value names the arms with
    :func:`damping_suffix` and keeps their checkpoints apart)."""
    from leechq.config import BASE_ROTATION_SEED, QuantConfig
    from leechq.formats.accounting import whole_model_bits
    from leechq.models.arch import arch_of
    from leechq.models.quantize import quantize_model_in_place
    from leechq.quant.recipe import run_recipe, tune_result
    from leechq.quant.recipe_spec import resolve_recipe
    from leechq.quant.row_scales import RowScaleConfig
    from leechq.quant.tune import tune_settings

    calib = roles["calib"]
    # --seed: another draw of the quantizer's own randomness (the rotations, the training windows'
    # order); the calibration text and the held-out windows stay the same
    damping = QuantConfig.damping if damping is None else damping
    cfg = QuantConfig(codebook=args.codebook, calib_windows=calib.shape[0],
                      calib_window_len=calib.shape[1], device=args.device,
                      rotation_seed=BASE_ROTATION_SEED ^ args.seed, damping=damping,
                      lattice_head=args.lattice_head)
    damped = damping_suffix(damping)  # "" for the encoder's damping

    ckpt = Path(args.checkpoint_dir) if args.checkpoint_dir else None
    if ckpt is not None and args.seed:
        ckpt = ckpt / f"seed{args.seed}"  # another encode, sensitivity pass and training
    if ckpt is not None and damped:
        ckpt = ckpt / f"damping{damping!r}"  # the same, from another encode

    def encode(model: Any, windows: torch.Tensor, config: Any) -> Any:
        where = None if ckpt is None else ckpt / "encode" / config.digest()[:16]
        return quantize_model_in_place(model, windows, config, progress=not args.tiny,
                                       checkpoint_dir=where)

    def kept(target: float, group: int | None) -> dict[str, Any]:
        """``run_recipe``'s resumable checkpoints of one budget and table group (None: the
        recipe's) under ``--checkpoint-dir``."""
        if ckpt is None:
            return {}
        lat = ("-lattice-embedding" if args.lattice_embedding else "") + (  # another student
            "-lattice-head" if args.lattice_head else "")
        tg = "" if group is None else f"-tables-g{group}"  # other tables
        return {"checkpoint_dir": ckpt / f"rows-{target:g}{lat}{tg}",
                "tune_checkpoint_dir": ckpt / f"tune-{target:g}{lat}{tg}",
                "sensitivity_checkpoint_dir": ckpt / f"sensitivity{tg}"}

    out: dict[str, tuple[Any, float, dict[str, Any]]] = {}
    if not {"bare", *RECIPE_ARMS} & set(wanted):
        return out  # baselines only: no lattice encode
    t0 = time.perf_counter()
    student = copy.deepcopy(reference)
    enc = encode(student, calib, cfg)
    bare_bits = whole_model_bits(enc.records, enc.raw).bits_per_param
    log(f"bare encode{damped}: {time.perf_counter() - t0:.1f} s")
    if "bare" in wanted:
        coded = " lattice-head" if args.lattice_head else ""
        out["bare" + coded + damped] = (student, bare_bits, {
            "seconds": time.perf_counter() - t0, "damping": damping})
    prefix = arm_prefix(args)
    if not set(RECIPE_ARMS) & set(wanted):
        return {f"{prefix}{k}": v for k, v in out.items()}
    arch = arch_of(reference)
    head = f"{arch.head_path}.weight" if getattr(arch, "head_path", None) else None
    rows = RowScaleConfig(steps=args.train_steps, warmup_steps=max(1, args.train_steps // 10),
                          lr=2e-3, seed=args.seed)

    def tune_for(steps: int) -> Any:
        """The settings `leechq quantize --recipe full` tunes ``steps`` steps with (None for 0),
        the windows' order seeded with ``--seed``."""
        settings = tune_settings(steps)
        return None if settings is None else dataclasses.replace(settings, seed=args.seed)

    tune = tune_for(args.tune_steps[0])
    topks = args.tune_topk or [None]  # None: the recipe's teacher
    if tune is not None and topks[0] is not None:
        tune = dataclasses.replace(tune, teacher_topk=topks[0])
    head_bits = {} if args.head_bits is None else {"head_bits": args.head_bits}
    if args.lattice_embedding:
        head_bits.update(lattice_embedding=True, embedding_bits=None)
    if args.lattice_head:
        head_bits["head_bits"] = None

    def full_result(target: float, group: int | None, settings: Any, train: torch.Tensor,
                    sensitivity: Any, *, requantize: bool = True, **checkpoints: Any) -> Any:
        """The full recipe at ``target`` b/param with its tables in groups of ``group`` columns
        (None: the recipe's) from the bare encode, tuned with ``settings`` (None: not tuned),
        trained on ``train``; the int4 choice re-encoded or swapped in post hoc
        (``requantize``)."""
        tables = {} if group is None else {"table_group": group}
        recipe = resolve_recipe("full", target, row_scales=rows, **head_bits, **tables,
                                tune=settings,
                                requantize=requantize,
                                sensitivity_windows=roles["sens"].shape[0],
                                sensitivity_window_len=roles["sens"].shape[1],
                                device=args.device)
        return run_recipe(reference, calib, cfg, recipe, quantize_fn=encode,
                          embed_name=f"{arch.embed_path}.weight", head_name=head,
                          train_windows=train, sensitivity_windows=roles["sens"],
                          monitor_windows=roles["monitor"], student=copy.deepcopy(student),
                          encoded=enc, sensitivity=sensitivity, progress=not args.tiny,
                          **checkpoints)

    def tuned(res: Any, settings: Any, checkpoint_dir: Path | None,
              windows: torch.Tensor | None = None) -> Any:
        """``res`` (a full result) tuned with ``settings`` on ``windows`` (default: the first
        training windows)."""
        train = roles["train"][0] if windows is None else windows
        return tune_result(res, reference, settings, train,
                           monitor_windows=roles["monitor"], progress=not args.tiny,
                           checkpoint_dir=checkpoint_dir)

    t0 = time.perf_counter()
    measured = None  # the sensitivity pass: measured at a table group's first budget, reused at
    # its others (the tables are in place when it measures)
    plans = [(group, target) for group in args.table_group for target in args.target_bpp]
    for i, (group, target) in enumerate(plans):
        if i and group != plans[i - 1][0]:
            measured = None
        suffix = budget_suffix(args, target, group) + damped
        # full+tune continues the full arm's result when both are wanted (one encode and one
        # sensitivity pass for the two)
        first = None if "full" in wanted else tune
        kept_here = kept(target, group)
        res = full_result(target, group, first, roles["train"][0], measured, **kept_here)
        measured = res.sensitivity
        results = {"full" if "full" in wanted else "full+tune": res}
        where = kept_here.get("tune_checkpoint_dir")
        if "full" in wanted and "full+tune" in wanted:
            # the same full result tuned once per teacher (--tune-topk), step count
            # (--tune-steps), batch (--tune-batch), learning rate (--tune-lr), KL temperature
            # (--tune-temperature), frozen group (--tune-without) and training text
            # (--tune-text), each with its own resumable checkpoint
            variants = [("full+tune", tune, "", None)]
            variants += [(topk_arm(k), dataclasses.replace(tune, teacher_topk=k), f"-topk{k}",
                          None) for k in topks[1:]]
            variants += [(steps_arm(n), dataclasses.replace(tune_for(n),
                                                             teacher_topk=tune.teacher_topk),
                          f"-steps{n}", None) for n in args.tune_steps[1:]]
            variants += [(batch_arm(b), dataclasses.replace(tune, batch=b), f"-batch{b}", w)
                         for b, w in zip(args.tune_batch, roles["train_batch"], strict=True)]
            variants += [(lr_arm(x), dataclasses.replace(tune, lr=x), f"-lr{x!r}", None)
                         for x in args.tune_lr]
            variants += [(tau_arm(t), dataclasses.replace(tune, temperature=t), f"-tau{t!r}",
                          None) for t in args.tune_temperature]
            variants += [(without_arm(g), dataclasses.replace(
                tune, groups=tuple(x for x in tune.groups if x != g)), f"-without-{g}", None)
                for g in args.tune_without]
            variants += [(text_arm(k), tune, f"-text-{k}", text_windows(reference, roles, args, k))
                         for k in args.tune_text]
            for name, settings, tail, windows in variants:
                results[name] = tuned(res, settings,
                                      None if where is None else Path(f"{where}{tail}"), windows)
        if args.int4_post_hoc:
            # the same encode and sensitivity pass, the chosen int4 matrices swapped in as their
            # round-to-nearest records with no re-encode of the lattice ones after them
            here = {k: Path(f"{v}-post-hoc") for k, v in kept_here.items()
                    if k != "sensitivity_checkpoint_dir"}
            swapped = full_result(target, group, first, roles["train"][0], measured,
                                  requantize=False, **here)
            if "full" in wanted:
                results[post_hoc_arm("full")] = swapped
            if "full+tune" in wanted:
                results[post_hoc_arm("full+tune")] = swapped if "full" not in wanted else \
                    tuned(swapped, tune, here.get("tune_checkpoint_dir"))
        for windows in roles["train"][1:]:  # the same encode and sensitivity, other text
            results[train_arm(windows.numel())] = full_result(target, group, tune, windows,
                                                              measured)
        for name, r in results.items():
            sel = r.metadata.get("selection", {})
            detail = {"seconds": r.metadata["seconds"], "target_bpp": target, "damping": damping,
                      "int4": len(sel.get("int4", [])),
                      "int4_matrices": list(sel.get("int4", [])),  # which, by module name
                      "int4_gain_nonpositive": len(sel.get("skipped_nonpositive", [])),
                      "int4_over_budget": len(sel.get("rejected_over_budget", [])),
                      "tables_upgraded": sel.get("tables_upgraded", []),
                      "table_group": r.recipe.table_group,
                      "steps": [st["step"] for st in r.metadata["steps"]],
                      # this run's seconds per step (a step resumed from a checkpoint: its load)
                      "step_seconds": {st["step"]: round(st["seconds"], 1)
                                       for st in r.metadata["steps"]}}
            if "tune" in r.metadata:
                detail["tune_best_step"] = r.metadata["tune"]["best_step"]
                detail["tune_steps"] = r.recipe.tune.steps
                detail["tune_batch"] = r.recipe.tune.batch
                detail["tune_lr"] = r.recipe.tune.lr
                detail["tune_temperature"] = r.recipe.tune.temperature
                detail["tune_teacher_topk"] = getattr(r.recipe.tune, "teacher_topk", None)
                detail["tune_teacher_rest_mass"] = r.metadata["tune"].get("teacher_rest_mass")
            out[name + suffix] = (r.model, r.metadata["whole_model_bits_per_param"], detail)
            log(f"{name}{suffix}: recipe {detail['seconds']:.1f} s; int4 {detail['int4']}, "
                f"gain <= 0 {detail['int4_gain_nonpositive']}, over the budget "
                f"{detail['int4_over_budget']}, tables upgraded "
                f"{detail['tables_upgraded'] or 'none'}; steps (s) {detail['step_seconds']}")
    log(f"full / full+tune: {time.perf_counter() - t0:.1f} s")
    return {f"{prefix}{k}": v for k, v in out.items()}


def text_windows(reference: Any, roles: dict[str, Any], args: argparse.Namespace,
                 kind: str) -> torch.Tensor:
    """The training windows of a ``--tune-text`` arm: ``generated``, as many windows as the first
    training role's, of its length, sampled from ``reference`` (once per model, seeded with
    ``--seed``); ``mix``, the training windows with every other one replaced by a generated one."""
    from quality_text import mixed_windows, special_ids, teacher_windows

    base = roles["train"][0]
    if "generated" not in roles:
        tok = roles.get("tokenizer")  # none for --tiny: every id of the model's vocabulary
        vocab = int(reference.config.vocab_size)
        vocab, banned = (vocab, []) if tok is None else (min(vocab, len(tok)), special_ids(tok))
        t0 = time.perf_counter()
        roles["generated"] = teacher_windows(
            reference, base.shape[0], base.shape[1], banned, vocab, seed=args.seed,
            batch=256 if str(args.device).startswith("cuda") else 64, device=args.device)
        log(f"teacher-sampled text: {base.shape[0]} x {base.shape[1]} tokens in "
            f"{time.perf_counter() - t0:.1f} s")
    return roles["generated"] if kind == "generated" else mixed_windows(base, roles["generated"])


def baseline_arms(reference: Any, roles: dict[str, Any], args: argparse.Namespace,
                  wanted: list[str]) -> dict[str, tuple[Any, float, dict[str, Any]]]:
    """RTN / GPTQ / HQQ at each of ``--bits`` (group ``--group``)."""
    from leechq.eval.baselines import gptq_model, hqq_available, hqq_model, rtn_model

    out: dict[str, tuple[Any, float, dict[str, Any]]] = {}
    for kind in ("rtn", "gptq", "hqq"):
        if kind not in wanted:
            continue
        if kind == "hqq" and not hqq_available():
            print("note: hqq is not installed; the HQQ arms are skipped", file=sys.stderr)
            continue
        for bits in args.bits:
            if kind == "rtn":
                res = rtn_model(reference, bits=bits, group=args.group)
            elif kind == "gptq":
                res = gptq_model(reference, roles["calib"], bits=bits, group=args.group)
            else:
                res = hqq_model(reference, bits=bits, group=args.group)
            out[f"{kind}-{bits}"] = (res.model, res.accounting.bits_per_param,
                                     {"seconds": res.seconds})
            log(f"{kind}-{bits}: {res.seconds:.1f} s")
    if "llamacpp" in wanted:
        out.update(llamacpp_arms(roles, args))
    return out


def llamacpp_arms(roles: dict[str, Any],
                  args: argparse.Namespace) -> dict[str, tuple[Any, float, dict[str, Any]]]:
    """llama.cpp's ``--llama-types`` from the model's source GGUF, each with an importance matrix
    computed on the calibration windows every other arm calibrates on. The quantized files stay in
    ``roles["workdir"]``; each arm is a loader, called when the arm is evaluated (one such model
    in memory at a time)."""
    from leechq.eval.llamacpp import compute_imatrix, find_tools, llamacpp_quantize

    source = roles.get("source")
    if source is None or source.kind != "gguf":
        raise SystemExit("the llamacpp arms requantize a GGUF source model; this model is not one")
    tools = find_tools(args.llama_cpp)
    calib = roles["calib"]
    out: dict[str, tuple[Any, float, dict[str, Any]]] = {}
    t0 = time.perf_counter()
    text = roles["tokenizer"].decode(calib.flatten().tolist())
    workdir = roles["workdir"]
    imatrix = compute_imatrix(tools, source.path, text, workdir / "imatrix.gguf",
                              context=calib.shape[1], chunks=calib.shape[0])
    log(f"llama.cpp importance matrix: {time.perf_counter() - t0:.1f} s")
    for qtype in args.llama_types:
        res = llamacpp_quantize(source.path, qtype, tools, workdir, imatrix=imatrix)
        out[res.method] = (res.load, res.bits.bits_per_param,
                           {"seconds": res.seconds, "types": res.bits.types})
        log(f"{res.method}: {res.bits.bits_per_param:.3f} b/param, {res.seconds:.1f} s")
    return out


# --------------------------------------------------------------------------------------------------
# report


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__.split("\n\n")[0])
    args = ap.parse_args(argv)
    if args.plot_from:
        rows_from = rows_of(args.plot_from)
        note = plot(rows_from, Path(args.plot or ROOT / "docs" / "quality.png"))
        print(json.dumps({"plot": note, "rows": len(rows_from)}))
        return 0
    wanted, models = checked(ap, args)
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    intervals: list[dict[str, Any]] = []
    reference_tasks: dict[str, dict[str, Any]] = {}
    scratch = tempfile.TemporaryDirectory(prefix="leechq-quality-")  # llama.cpp's files
    try:
        for mname in models:
            reference, sets, roles = tiny_setup(args) if args.tiny else real_setup(mname, args)
            roles["workdir"] = Path(scratch.name) / mname
            roles["workdir"].mkdir()
            log(f"{mname}: model and windows ready")
            tokenizer = roles.get("tokenizer")
            if args.tasks and tokenizer is None:
                raise SystemExit(f"--tasks needs {mname}'s tokenizer; this setup has none")
            if args.tasks:
                reference_tasks[mname] = task_scores(reference, tokenizer, args, "reference")
                log(f"{mname}: reference {task_line(reference_tasks[mname])}")
            arms = {}
            for damping in args.damping:  # one encode each
                arms.update(leechq_arms(reference, roles, args, wanted, damping))
            arms.update(baseline_arms(reference, roles, args, wanted))
            compare_to = (args.compare_to if args.compare_to in arms
                          else f"{arm_prefix(args)}{args.compare_to}")
            from leechq.eval.ppl import window_nll
            from leechq.quant.row_scales import model_logits

            ref: dict[str, tuple[list[torch.Tensor], list[float]]] = {}
            for dset, ids in sets.items():
                with torch.no_grad(), on_device(reference, args.device):
                    ref_logits = [model_logits(reference, ids[i : i + 1]).float().cpu()
                                  for i in range(ids.shape[0])]
                nll = [float(window_nll(r, ids[i : i + 1])[0]) for i, r in enumerate(ref_logits)]
                ref[dset] = (ref_logits, nll)
                log(f"{mname} {dset}: reference logits of {ids.shape[0]} windows")
            measured: dict[str, dict[str, dict[str, list[float]]]] = {d: {} for d in sets}
            for a in list(arms):
                m, bpp, detail = arms[a]
                # an arm is a model, or a loader (llama.cpp's files) called now: one at a time
                model = m if isinstance(m, torch.nn.Module) else m()
                for dset, ids in sets.items():
                    with on_device(model, args.device):
                        measured[dset][a] = per_window(model, ref[dset][0], ids)
                    s = summarize(measured[dset][a], ref[dset][1])
                    log(f"{mname} {dset}: {a} ppl x {s['ppl_ratio']:.4f}, KL {s['kl']:.4f}, "
                        f"agreement {s['agreement']:.4f}")
                if args.tasks:
                    detail = {**detail, "tasks": task_scores(model, tokenizer, args, a)}
                    log(f"{mname}: {a} {task_line(detail['tasks'])}")
                del model
                arms[a] = (None, bpp, detail)  # the model is no longer needed
            for dset in sets:
                ref_nll = ref[dset][1]
                for arm, (_, bpp, detail) in arms.items():
                    rows.append({"model": mname, "arm": arm, "set": dset, "bpp": bpp,
                                 **summarize(measured[dset][arm], ref_nll), **detail})
                    vs = compared_arm(arm, compare_to, measured[dset])
                    if arm != vs and vs in measured[dset]:
                        intervals.append({
                            "model": mname, "set": dset, "arm": arm, "vs": vs,
                            "ci95": paired_bootstrap(measured[dset][arm], measured[dset][vs],
                                                     ref_nll, args.boot),
                        })
            del reference, arms, ref
    finally:
        scratch.cleanup()
    head = (f"{'model':<14} {'arm':<10} {'set':<10} {'b/param':>7} {'ppl x':>8} {'KL':>8} "
            f"{'agree':>6}" + "".join(f" {t:>7}" for t in args.tasks))
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['model']:<14} {r['arm']:<10} {r['set']:<10} {r['bpp']:>7.3f} "
              f"{r['ppl_ratio']:>8.3f} {r['kl']:>8.4f} {r['agreement']:>6.3f}"
              + "".join(f" {r['tasks'][t]['value']:>7.3f}" for t in args.tasks))
    for mname, scores in reference_tasks.items():
        print(f"{mname} reference: {task_line(scores)}")
    print("\npaired bootstrap 95 % intervals of (arm − compared arm) over windows:")
    for iv in intervals:
        ci = iv["ci95"]
        print(f"  {iv['model']} {iv['set']:<10} {iv['arm']:<10} − {iv['vs']:<10} "
              f"ppl x [{ci['ppl_ratio'][0]:+.3f}, "
              f"{ci['ppl_ratio'][1]:+.3f}]  KL [{ci['kl'][0]:+.4f}, {ci['kl'][1]:+.4f}]")
    # the committed docs/quality.png is drawn with --plot-from, never by a measuring run
    note = "no plot (pass --plot PATH)" if args.plot is None else plot(rows, Path(args.plot))
    print(note, file=sys.stderr)
    print(json.dumps({"rows": rows, "intervals": intervals, "plot": note,
                      "reference_tasks": reference_tasks,
                      "calibration": getattr(args, "calibration", "synthetic-a"),
                      "sets": {"in-domain": "synthetic-a" if args.tiny else args.in_domain,
                               "unseen": "synthetic-b" if args.tiny else args.unseen_domain},
                      "seed": args.seed,
                      "seconds": time.perf_counter() - started, "tiny": args.tiny}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
