"""``leechq quantize MODEL OUT``: quantize a model into an artifact directory.

A thin shell (architecture.md §6.1 ``cli/quantize.py``) over
:func:`leechq.models.hf_load.load_model` (zoo alias, GGUF, HF directory or hub id), the offline
calibration split of :mod:`leechq.data` and :func:`leechq.models.quantize.quantize_model`. The
"bare" recipe is the configuration's defaults: every block projection on the lattice with one gain
bit and the input rotation, embeddings kept.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any


def calibration_windows(tokenizer: Any, calib_tokens: int, window: int) -> Any:
    """``ceil(calib_tokens / window)`` windows of the offline calibration split (TokenWindows)."""
    from leechq.data import calibration_text, token_windows
    from leechq.errors import InvalidInput

    if calib_tokens < window or window < 2:
        raise InvalidInput(
            f"--calib-tokens ({calib_tokens}) must be at least one --window ({window})"
        )
    n = -(-calib_tokens // window)
    return token_windows(tokenizer, calibration_text(), n, window, source="pydoc:calibration")


def quant_config(
    codebook: str,
    windows: Any,
    device: str,
    seed: int | None,
    calibration: str,
    propagation: str = "auto",
) -> Any:
    """The resolved :class:`~leechq.config.QuantConfig` of the bare recipe."""
    from leechq.config import QuantConfig

    extra = {} if seed is None else {"rotation_seed": seed}
    return QuantConfig(
        codebook=codebook,
        calib_windows=windows.n_windows,
        calib_window_len=windows.window,
        device=device if device in ("cpu", "cuda") else "auto",
        calibration=calibration,
        propagation=propagation,
        **extra,
    )


def run(args: argparse.Namespace) -> int:
    """Quantize ``args.model`` into ``args.out``; prints the artifact's rates at the end."""
    import torch

    from leechq.cli.inspect import format_report
    from leechq.formats.artifact import artifact_report
    from leechq.models.hf_load import load_model
    from leechq.models.quantize import quantize_model

    t0 = time.perf_counter()
    print(f"[quantize] loading {args.model}", file=sys.stderr)
    loaded = load_model(args.model, device="cpu", dtype="float32")
    windows = calibration_windows(loaded.tokenizer, args.calib_tokens, args.window)
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = quant_config(
        args.codebook,
        windows,
        device,
        args.seed,
        f"{windows.source} {windows.n_windows}x{windows.window} tokens, "
        f"fingerprint {windows.fingerprint}",
        propagation=getattr(args, "propagation", "auto"),
    )
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
