"""``leechq quantize MODEL OUT``: quantize a model into an artifact directory.

A thin shell (docs/architecture.md §1 ``cli/quantize.py``) over
:func:`leechq.models.hf_load.load_model` (zoo alias, GGUF, HF directory or hub id), the
calibration text (the offline default of :mod:`leechq.data`: the calibration splits of the Python
docs and of the standard library's code, interleaved; or the user's own text with
``--calib-data``: :mod:`leechq.data.user_text`) and
:func:`leechq.models.quantize.quantize_model`. The
"bare" recipe is the configuration's defaults: every block projection on the lattice with one gain
bit and the input rotation, embeddings kept. The "full" recipe (docs/quantizer.md §7) runs
:func:`leechq.quant.recipe.run_recipe` on top: int4 for the most KL-sensitive matrices under a
whole-model bits-per-parameter budget, 4-bit embedding tables, row scales trained by KL to the
reference. Its calibration text is cut into disjoint roles (encoding | sensitivity | row-scale
training | monitor), all from the calibration text; the evaluation split is never read.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any


def calibration_source(calib_data: str | None) -> tuple[str, str]:
    """``(text, source)`` of the calibration text: the offline default (five domains interleaved,
    :func:`leechq.data.code_corpus.mixed_calibration_text`), or
    the user's text named by ``--calib-data`` (:func:`leechq.data.user_text.load_user_text`)."""
    if calib_data is None:
        from leechq.data.code_corpus import MIXED_SOURCE, mixed_calibration_text

        return mixed_calibration_text(), MIXED_SOURCE
    from leechq.data.user_text import load_user_text

    user = load_user_text(calib_data)
    return user.text, user.source


def calibration_windows(
    tokenizer: Any, calib_tokens: int, window: int, calib_data: str | None = None
) -> Any:
    """``ceil(calib_tokens / window)`` windows of the calibration text (TokenWindows).

    The offline corpus always holds enough tokens; the user's text (``calib_data``) may not, and
    then gives as many whole windows as it holds (a note on stderr), at least one.
    """
    from leechq.data import token_windows
    from leechq.data.corpus import encode
    from leechq.errors import InvalidInput

    if calib_tokens < window or window < 2:
        raise InvalidInput(
            f"--calib-tokens ({calib_tokens}) must be at least one --window ({window})"
        )
    n = -(-calib_tokens // window)
    text, source = calibration_source(calib_data)
    if calib_data is not None:
        have = len(encode(tokenizer, text))
        if have < window:
            raise InvalidInput(
                f"--calib-data {calib_data!r} holds {have} tokens, fewer than one --window "
                f"({window})"
            )
        if have < n * window:
            print(
                f"[quantize] --calib-data holds {have} tokens: {have // window} windows of "
                f"{window} instead of {n}",
                file=sys.stderr,
            )
            n = have // window
    return token_windows(tokenizer, text, n, window, source=source)


def quant_config(
    codebook: str,
    windows: Any,
    device: str,
    seed: int | None,
    calibration: str,
    propagation: str = "auto",
    damping: float | None = None,
    lattice_head: bool = False,
) -> Any:
    """The resolved :class:`~leechq.config.QuantConfig` of the bare recipe (``damping`` None:
    the config's default; ``lattice_head``: the head coded on the lattice)."""
    from leechq.config import QuantConfig

    extra: dict[str, Any] = {} if seed is None else {"rotation_seed": seed}
    if damping is not None:
        extra["damping"] = damping
    return QuantConfig(
        codebook=codebook,
        calib_windows=windows.n_windows,
        calib_window_len=windows.window,
        device=device if device in ("cpu", "cuda") else "auto",
        calibration=calibration,
        propagation=propagation,
        lattice_head=lattice_head,
        **extra,
    )


def check_out(out: str, force: bool) -> None:
    """Refuse an OUT that cannot be written, or that exists and may not be replaced, before the
    model is loaded: a new OUT must be creatable; an existing one needs ``--force`` and must be a
    complete leechq artifact (never a folder of other files,
    :func:`leechq.formats.output_paths.check_replaceable`)."""
    from pathlib import Path

    from leechq.errors import InvalidInput
    from leechq.formats.output_paths import check_output_path, check_replaceable

    check_output_path(out)
    path = Path(out)
    if path.exists() or path.is_symlink():
        if not force:
            raise InvalidInput(f"{out} already exists (pass --force to replace an artifact)")
        check_replaceable(path)


def training_windows(row_scales: Any, tune: Any) -> int:
    """Training windows the full recipe takes unless ``--train-tokens`` names a count: as many as
    its row-scale and tuning stages read without reading one twice, the larger stage's
    ``steps × batch`` (a stage on a time budget, ``steps`` 0, counts
    :data:`leechq.quant.tune.DEFAULT_TUNE_STEPS` steps), at least 1.

    Args:
        row_scales: the row-scale stage's :class:`~leechq.quant.row_scales.RowScaleConfig`, or
            None where it does not run.
        tune: the tuning stage's :class:`~leechq.quant.tune.TuneConfig`, or None.
    """
    from leechq.quant.tune import DEFAULT_TUNE_STEPS

    stages = [c for c in (row_scales, tune) if c is not None]
    return max([1, *((c.steps or DEFAULT_TUNE_STEPS) * c.batch for c in stages)])


def run_full_recipe(args: argparse.Namespace, loaded: Any, device: str) -> Any:
    """The ``full`` recipe: encode, int4 by sensitivity, tables, row scales, end-to-end tuning
    (``--tune-steps``/``--tune-seconds``; skipped with a warning on a GPU without the memory for
    it); writes ``args.out``.

    Returns:
        The artifact path.
    """
    from pathlib import Path
    from types import SimpleNamespace

    from leechq.data import consecutive_windows
    from leechq.errors import InvalidInput
    from leechq.models.quantize import quantize_model_in_place
    from leechq.quant.recipe import run_recipe
    from leechq.quant.recipe_spec import resolve_recipe
    from leechq.quant.row_scales import RowScaleConfig

    out = Path(args.out)
    if out.exists() and not args.force:
        raise InvalidInput(f"{out} already exists (pass --force to replace it)")
    if (args.train_tokens is not None and args.train_tokens < args.window) or args.train_steps < 0:
        raise InvalidInput("--train-tokens must hold one --window and --train-steps be >= 0")
    steps = args.train_steps
    rows = RowScaleConfig(
        steps=steps,
        time_budget_s=args.train_seconds,
        lr=args.train_lr,
        warmup_steps=max(1, steps // 10) if steps else 10,
    )
    from leechq.quant.tune import DEFAULT_TUNE_STEPS, tune_settings

    try:
        tune_steps = getattr(args, "tune_steps", None)
        tune = tune_settings(DEFAULT_TUNE_STEPS if tune_steps is None else tune_steps,
                             getattr(args, "tune_seconds", 0.0))
    except InvalidInput as exc:  # its message has both values
        raise InvalidInput(f"--tune-steps / --tune-seconds: {exc}") from None
    head = {} if getattr(args, "head_bits", None) is None else {"head_bits": args.head_bits}
    if getattr(args, "lattice_embedding", False):
        head.update(lattice_embedding=True, embedding_bits=None)
    if getattr(args, "lattice_head", False):
        head["head_bits"] = None
    recipe = resolve_recipe(
        "full", args.target_bpp, row_scales=rows, tune=tune,
        device="cuda" if device == "cuda" else "cpu", **head,
    )
    n_calib = -(-args.calib_tokens // args.window)
    named = args.train_tokens is not None
    n_train = (args.train_tokens // args.window if named
               else training_windows(recipe.row_scales, recipe.tune))
    sizes = [
        (n_calib, args.window),
        (recipe.sensitivity_windows, recipe.sensitivity_window_len),
        (n_train, args.window),
        (2, args.window),
    ]
    text, source = calibration_source(getattr(args, "calib_data", None))
    # unnamed, the training role takes what the text holds up to what the steps read
    (calib, sens, train, monitor), fingerprint = consecutive_windows(
        loaded.tokenizer, text, sizes, source=source, shrink=None if named else 2
    )
    if train.shape[0] < n_train:
        print(f"[quantize] note: the calibration text holds {train.shape[0]} training windows "
              f"of the {n_train} that the steps read; the steps see some of them again",
              file=sys.stderr)
    n_train = train.shape[0]
    cfg = quant_config(
        args.codebook,
        SimpleNamespace(n_windows=n_calib, window=args.window),
        device,
        args.seed,
        f"{source} {n_calib}x{args.window} tokens (+ sensitivity "
        f"{recipe.sensitivity_windows}x{recipe.sensitivity_window_len}, training "
        f"{n_train}x{args.window}, monitor 2x{args.window}), stream fingerprint {fingerprint}",
        propagation=getattr(args, "propagation", "auto"),
        damping=getattr(args, "damping", None),
        lattice_head=getattr(args, "lattice_head", False),
    )
    print(f"[quantize] {cfg.describe()}", file=sys.stderr)
    print(f"[quantize] {recipe.describe()}", file=sys.stderr)
    arch = loaded.arch
    head = f"{arch.head_path}.weight" if getattr(arch, "head_path", None) else None
    encode_ckpt = out.with_name(out.name + ".ckpt")

    def encode(model: Any, windows: Any, config: Any) -> Any:
        # one resumable checkpoint per encoder configuration (the int4 re-encode differs)
        return quantize_model_in_place(
            model,
            windows,
            config,
            progress=True,
            checkpoint_dir=encode_ckpt / config.digest()[:16],
            model_id=str(args.model),
        )

    result = run_recipe(
        loaded.model,
        calib,
        cfg,
        recipe,
        quantize_fn=encode,
        embed_name=f"{arch.embed_path}.weight",
        head_name=head,
        train_windows=train,
        sensitivity_windows=sens,
        monitor_windows=monitor,
        checkpoint_dir=out.with_name(out.name + ".rows-ckpt"),
        tune_checkpoint_dir=out.with_name(out.name + ".tune-ckpt"),
        sensitivity_checkpoint_dir=out.with_name(out.name + ".sens-ckpt"),
        progress=True,
    )
    for step in result.metadata["steps"]:
        print(f"[quantize] step {step['step']}: {step['seconds']:.1f} s", file=sys.stderr)
    if "selection" in result.metadata:
        sel = result.metadata["selection"]
        print(
            f"[quantize] int4 ({len(sel['int4'])}): {', '.join(sel['int4']) or 'none'}; "
            f"tables upgraded to 8 bits: {sel['tables_upgraded'] or 'none'}",
            file=sys.stderr,
        )
    if "over_target" in result.metadata:
        print(f"[quantize] note: {result.metadata['over_target']}", file=sys.stderr)
    if "row_scales" in result.metadata:
        rs = result.metadata["row_scales"]
        keys = ["steps", "seconds", "monitor_kl_before", "monitor_kl_after"]
        print(
            "[quantize] row scales: " + ", ".join(f"{k} {rs.get(k)}" for k in keys), file=sys.stderr
        )
    if "skipped" in result.metadata.get("tune", {}):
        print(f"[quantize] warning: {result.metadata['tune']['skipped']}", file=sys.stderr)
    elif "tune" in result.metadata:
        tn = result.metadata["tune"]
        keys = ["steps", "best_step", "seconds", "monitor_kl_before", "monitor_kl_after"]
        print("[quantize] tune: " + ", ".join(f"{k} {tn.get(k)}" for k in keys), file=sys.stderr)
    base = loaded.model.config.to_dict()
    base.pop("quantization_config", None)
    path = result.write(out, base_config=base, tokenizer=loaded.tokenizer, overwrite=args.force)
    import shutil

    shutil.rmtree(encode_ckpt, ignore_errors=True)
    shutil.rmtree(out.with_name(out.name + ".rows-ckpt"), ignore_errors=True)
    shutil.rmtree(out.with_name(out.name + ".tune-ckpt"), ignore_errors=True)
    shutil.rmtree(out.with_name(out.name + ".sens-ckpt"), ignore_errors=True)
    return path


def run(args: argparse.Namespace) -> int:
    """Quantize ``args.model`` into ``args.out``; prints the artifact's rates at the end."""
    from leechq.cli.inspect import format_report
    from leechq.errors import InvalidInput
    from leechq.formats.accounting import artifact_report
    from leechq.models.hf_load import load_model
    from leechq.models.load import resolve_device
    from leechq.models.quantize import quantize_model

    if getattr(args, "recipe", "bare") != "full":
        for flag in ("target_bpp", "head_bits"):
            if getattr(args, flag, None) is not None:
                raise InvalidInput(f"--{flag.replace('_', '-')} applies to --recipe full only")
    if getattr(args, "lattice_head", False) and getattr(args, "head_bits", None) is not None:
        raise InvalidInput("--lattice-head codes the head on the lattice; --head-bits sets the "
                           "width of a head table: give one of them")
    if getattr(args, "damping", None) is not None:
        from leechq.config import QuantConfig

        try:  # the config's own check, before the model is read
            QuantConfig(damping=args.damping)
        except InvalidInput as exc:
            raise InvalidInput(f"--damping: {exc}") from None
    check_out(args.out, args.force)
    device = resolve_device(args.device).type
    t0 = time.perf_counter()
    print(f"[quantize] loading {args.model}", file=sys.stderr)
    loaded = load_model(args.model, device="cpu", dtype="float32")
    if getattr(args, "recipe", "bare") == "full":
        path = run_full_recipe(args, loaded, device)
        print(f"[quantize] wrote {path} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        print(format_report(artifact_report(path), str(path)))
        return 0
    windows = calibration_windows(
        loaded.tokenizer, args.calib_tokens, args.window, getattr(args, "calib_data", None)
    )
    cfg = quant_config(
        args.codebook,
        windows,
        device,
        args.seed,
        f"{windows.source} {windows.n_windows}x{windows.window} tokens, "
        f"fingerprint {windows.fingerprint}",
        propagation=getattr(args, "propagation", "auto"),
        damping=getattr(args, "damping", None),
        lattice_head=getattr(args, "lattice_head", False),
    )
    if getattr(args, "lattice_embedding", False):
        cfg = cfg.replace(embedding_encoding="lattice")
    print(f"[quantize] {cfg.describe()}", file=sys.stderr)
    path = quantize_model(
        loaded.model,
        loaded.tokenizer,
        windows.ids,
        cfg,
        args.out,
        model_id=str(args.model),
        overwrite=args.force,
    )
    print(f"[quantize] wrote {path} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    print(format_report(artifact_report(path), str(path)))
    return 0
