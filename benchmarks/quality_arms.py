"""The quality report's arm names and list options (``benchmarks/quality.py``): the names of the
arms that vary one setting of the full arm's result (``full+tune steps=N``, ``batch=B``,
``lr=X``, ``tau=T``, ``without=G``, ``text=KIND``, ``topk=K``, ``train=N``, ``int4=post-hoc``),
the suffixes a budget, the lattice embedding or another Hessian damping add, which arm an arm is
compared with, and the parsing of the comma-separated options.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any


def topk_arm(k: int) -> str:
    """The name of a further ``--tune-topk`` arm: ``full+tune topk=K`` (``K`` = 0: the full
    teacher every step)."""
    return f"full+tune topk={k}"


def post_hoc_arm(arm: str) -> str:
    """The name of an ``--int4-post-hoc`` arm: ``full int4=post-hoc`` or ``full+tune
    int4=post-hoc``."""
    return f"{arm} int4=post-hoc"


def batch_arm(batch: int) -> str:
    """The name of a ``--tune-batch`` arm: ``full+tune batch=B``."""
    return f"full+tune batch={batch}"


def lr_arm(lr: float) -> str:
    """The name of a ``--tune-lr`` arm: ``full+tune lr=X`` (``X`` as Python's ``repr``, the
    shortest form that reads back as the same float: distinct rates, distinct names)."""
    return f"full+tune lr={lr!r}"


def tau_arm(tau: float) -> str:
    """The name of a ``--tune-temperature`` arm: ``full+tune tau=T`` (``T`` as ``repr``, as
    :func:`lr_arm`)."""
    return f"full+tune tau={tau!r}"


def without_arm(group: str) -> str:
    """The name of a ``--tune-without`` arm: ``full+tune without=G`` (every parameter group but
    ``G`` trained)."""
    return f"full+tune without={group}"


def text_arm(kind: str) -> str:
    """The name of a ``--tune-text`` arm: ``full+tune text=KIND`` (``generated`` or ``mix``)."""
    return f"full+tune text={kind}"


def steps_arm(steps: int) -> str:
    """The name of a further ``--tune-steps`` arm: ``full+tune steps=N``."""
    return f"full+tune steps={steps}"


def distinct_list(ap: argparse.ArgumentParser, flag: str, text: str, convert: Any, what: str,
                  valid: Any) -> list[Any]:
    """``text``, a comma-separated option value, as a list of ``convert`` (int, float, str) values;
    ``ap.error`` names ``flag`` when an item does not convert, the list is empty, a value fails
    ``valid`` (``what`` says what is wanted, e.g. ``"sizes >= 0"``) or repeats."""
    try:
        out = [convert(item) for item in text.split(",") if item.strip()]
    except ValueError:
        ap.error(f"{flag}: not a comma-separated list of numbers: {text!r}")
    if not out or not all(valid(v) for v in out):
        ap.error(f"{flag}: give one or more {what}, got {out}")
    if len(set(out)) != len(out):
        ap.error(f"{flag}: a value is repeated: {out}")
    return out


def train_arm(tokens: int) -> str:
    """The name of a further ``--train-tokens`` arm: ``full+tune train=N`` (``N`` training
    tokens)."""
    return f"full+tune train={tokens}"


def train_windows(spec: str, window: int, train_steps: int, tune_steps: int,
                  batch: int | None = None) -> list[int]:
    """``--train-tokens`` (``N|auto[,N...]``) as training windows per arm: ``N // window``, or
    for ``auto`` :func:`leechq.cli.quantize.training_windows` of these steps (tuning with
    ``batch`` windows a step; None: the recipe's).

    Raises:
        ValueError: an item that is neither ``auto`` nor a count of at least one window, or a
            repeated count.
    """
    from leechq.cli.quantize import training_windows
    from leechq.quant.row_scales import RowScaleConfig
    from leechq.quant.tune import tune_settings

    tune = tune_settings(tune_steps) if tune_steps else None
    if tune is not None and batch is not None:
        tune = dataclasses.replace(tune, batch=batch)
    auto = training_windows(RowScaleConfig(steps=train_steps) if train_steps else None, tune)
    out = []
    for item in (i.strip() for i in spec.split(",") if i.strip()):
        if item != "auto" and not (item.isdigit() and int(item) >= window):
            raise ValueError(f"{item!r} is neither 'auto' nor a token count >= --window")
        out.append(auto if item == "auto" else int(item) // window)
    if not out or len(set(out)) != len(out):
        raise ValueError(f"give one or more distinct window counts, got {out}")
    return out


def damping_suffix(damping: float) -> str:
    """What the name of an arm encoded with another Hessian damping ends with: nothing for the
    encoder's own (:class:`leechq.config.QuantConfig`'s), else `` damp=L`` (``L`` as ``repr``, as
    :func:`lr_arm`)."""
    from leechq.config import QuantConfig

    return "" if damping == QuantConfig.damping else f" damp={damping!r}"


def budget_suffix(args: argparse.Namespace, target: float, group: int | None = None) -> str:
    """What a recipe arm's name ends with: `` lattice-emb`` with ``--lattice-embedding``,
    `` lattice-head`` with ``--lattice-head``, `` tables-gG`` for tables in groups of ``group``
    columns (None: the recipe's), then nothing for a single ``--target-bpp``, else `` @B``."""
    lat = (" lattice-emb" if getattr(args, "lattice_embedding", False) else "") + (
        " lattice-head" if getattr(args, "lattice_head", False) else "")
    tg = "" if group is None else f" tables-g{group}"
    return lat + tg + ("" if len(args.target_bpp) == 1 else f" @{target:g}")


def compared_arm(arm: str, compare_to: str, arms: Any) -> str:
    """The arm that ``arm`` is compared with: ``compare_to`` with ``arm``'s own suffix (``full
    @3.5`` for ``full+tune @3.5``, ``full lattice-emb`` for ``full+tune lattice-emb``) where that
    arm exists, else ``compare_to``."""
    cuts = [i for i, ch in enumerate(arm) if ch == " "]
    for i in cuts:  # the longest suffix first: `` lattice-emb @3.5``, then `` @3.5``
        if f"{compare_to}{arm[i:]}" in arms and f"{compare_to}{arm[i:]}" != arm:
            return f"{compare_to}{arm[i:]}"
    return compare_to


def arm_prefix(args: argparse.Namespace) -> str:
    """What our arms' names start with: nothing for the Tetra codebook (and ``--tiny``'s stand-in),
    else the codebook's name and a space (``ball full``)."""
    return "" if args.tiny or args.codebook == "tetra" else f"{args.codebook} "
