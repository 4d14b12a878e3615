"""Swap the ``nn.Linear`` modules of a model for :class:`~leechq.nn.linear.LeechqLinear`.

Implements docs/kernels.md (``nn/replace.py``) 
(``_process_model_before_weight_loading``):
the replacement is driven by the artifact's records — one record per module name — so the artifact,
not a naming heuristic, says what is quantized. It works on a skeleton on the meta device (no weight
is touched) and on a materialized model alike.

Two entry points:

* :func:`replace_with_records` — the records are in memory (``leechq.load``);
* :func:`replace_with_placeholders` — only the descriptors are known (transformers' loader fills the
  buffers afterwards, then :func:`materialize_all` builds the records).

:func:`share_groups` then ties together the modules that read one activation — q/k/v, gate/up: the
siblings of one parent whose lattice records carry the same rotation — so the fused path rotates
that activation once per forward (docs/kernels.md). Grouping is an
optimization only: the shared slot serves a rotated activation back only to a call with the very
same input tensor.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from leechq.errors import InvalidInput, UnsupportedArchitecture
from leechq.formats.quantized_weight import QuantizedWeight
from leechq.formats.rotation import RotationTables
from leechq.nn.linear import LeechqLinear, Record


def _parent_and_leaf(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    parent_name, _, leaf = name.rpartition(".")
    try:
        parent = model.get_submodule(parent_name) if parent_name else model
    except AttributeError as exc:
        raise UnsupportedArchitecture(
            f"the artifact quantizes {name!r}, but the model has no module {parent_name!r}: the "
            "artifact was made for a different architecture"
        ) from exc
    if not hasattr(parent, leaf):
        raise UnsupportedArchitecture(
            f"the artifact quantizes {name!r}, but {type(parent).__name__} {parent_name!r} has no "
            f"child {leaf!r}: the artifact was made for a different architecture"
        )
    return parent, leaf


def _target_linear(
    model: nn.Module, name: str, d_out: int, d_in: int
) -> tuple[nn.Module, str, nn.Linear]:
    parent, leaf = _parent_and_leaf(model, name)
    old = getattr(parent, leaf)
    if not isinstance(old, nn.Linear):
        raise UnsupportedArchitecture(
            f"{name} is a {type(old).__name__}, not an nn.Linear; "
            "leechq replaces linear layers only"
        )
    if (old.out_features, old.in_features) != (d_out, d_in):
        raise UnsupportedArchitecture(
            f"{name} is [{old.out_features}x{old.in_features}] in the model but "
            f"[{d_out}x{d_in}] in the artifact (different model size or config)"
        )
    return parent, leaf, old


def _skipped(name: str, skip: Iterable[str]) -> bool:
    return any(name == s or name.startswith(s + ".") for s in skip)


def replace_with_records(
    model: nn.Module,
    records: Mapping[str, Record],
    skip: Iterable[str] = (),
) -> dict[str, LeechqLinear]:
    """Replace every module named in ``records`` by a :class:`LeechqLinear` holding its record.

    Biases are carried over as ``nn.Parameter``s of the same name (still on meta when the model is
    a meta skeleton; the caller loads them with the other raw tensors).

    Args:
        model: the model (any device, meta included).
        records: module name → record.
        skip: module names (or prefixes) never to convert, e.g. ``lm_head``; a record under a
            skipped name is an error (the weights would silently be dropped).

    Returns:
        module name → the new module, in ``records`` order.

    Raises:
        UnsupportedArchitecture: a record names a module the model lacks, or a non-linear, or a
            linear of another shape.
    """
    skip = tuple(skip)
    out: dict[str, LeechqLinear] = {}
    for name, record in records.items():
        if _skipped(name, skip):
            raise InvalidInput(f"the artifact quantizes {name}, which is in modules_to_not_convert")
        parent, leaf, old = _target_linear(model, name, record.d_out, record.d_in)
        new = LeechqLinear.from_record(record, bias=None)
        if old.bias is not None:
            new.bias = nn.Parameter(old.bias.detach(), requires_grad=False)
        setattr(parent, leaf, new)
        out[name] = new
    return out


def replace_with_placeholders(
    model: nn.Module,
    descriptors: Mapping[str, Mapping[str, Any]],
    skip: Iterable[str] = (),
) -> dict[str, LeechqLinear]:
    """Replace every module named in ``descriptors`` by a placeholder :class:`LeechqLinear` whose
    buffers carry the artifact tensor names (created on the current default device; call under
    ``torch.device("meta")`` or on a meta skeleton).

    Args:
        model: the skeleton.
        descriptors: ``quantization_config.records`` (module name → descriptor).
        skip: module names or prefixes never to convert.

    Returns:
        module name → placeholder module.
    """
    skip = tuple(skip)
    out: dict[str, LeechqLinear] = {}
    for name, desc in descriptors.items():
        if _skipped(name, skip):
            raise InvalidInput(f"the artifact quantizes {name}, which is in modules_to_not_convert")
        try:
            d_out, d_in = int(desc["d_out"]), int(desc["d_in"])
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidInput(f"record descriptor of {name} has no valid d_out/d_in") from exc
        parent, leaf, old = _target_linear(model, name, d_out, d_in)
        device = old.weight.device
        with torch.device(device):
            new = LeechqLinear.placeholder(name, desc, bias=old.bias is not None)
        setattr(parent, leaf, new)
        out[name] = new
    return out


def materialize_all(
    modules: Mapping[str, LeechqLinear], rotations: Mapping[str, RotationTables]
) -> None:
    """Turn every loaded placeholder into its canonical record (``LeechqLinear.materialize``)."""
    for module in modules.values():
        module.materialize(rotations)


def finalize_all(
    modules: Mapping[str, LeechqLinear],
    device: torch.device | str | Mapping[str, torch.device],
    dtype: torch.dtype,
    prefer: str = "auto",
) -> dict[str, int]:
    """Finalize every module (see :meth:`LeechqLinear.finalize`), warning once per distinct reason.

    Args:
        modules: name → module.
        device: one device for all, or name → device.
        dtype: activation dtype.
        prefer: kernel preference.

    Returns:
        Count of modules per execution path (``{"dense": n, "fused": m}``).
    """
    import warnings

    from leechq.nn.linear import ReferencePathWarning

    counts: dict[str, int] = {}
    reasons: dict[str, int] = {}
    for name, module in modules.items():
        dev = device[name] if isinstance(device, Mapping) else device
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ReferencePathWarning)
            ex = module.finalize(dev, dtype, prefer=prefer)
        counts[ex.path] = counts.get(ex.path, 0) + 1
        if ex.reason is not None:
            reasons[ex.reason] = reasons.get(ex.reason, 0) + 1
    for reason, count in reasons.items():
        warnings.warn(
            f"{count} quantized module(s) run the dense reference path: {reason}",
            ReferencePathWarning,
            stacklevel=2,
        )
    return counts


def leechq_modules(model: nn.Module) -> dict[str, LeechqLinear]:
    """Every :class:`LeechqLinear` of ``model`` by name."""
    return {n: m for n, m in model.named_modules() if isinstance(m, LeechqLinear)}


def share_groups(modules: Mapping[str, LeechqLinear]) -> list[list[str]]:
    """Group the modules that read one activation so that the fused path rotates it once.

    A group is the siblings (same parent module) whose lattice records carry identical rotation
    tables; the quantizer derives one rotation seed per (block, activation), so q/k/v form one group
    and gate/up another. Every module of a group gets the same
    :class:`~leechq.nn.fused.SharedRotation` slot, used only by the fused path.

    Returns:
        The groups (lists of module names) of two or more members.
    """
    from leechq.nn.fused import SharedRotation

    by_key: dict[tuple[str, int, int], list[str]] = {}
    for name, module in modules.items():
        rec = module.record
        if not isinstance(rec, QuantizedWeight) or rec.rotation is None:
            continue
        parent = name.rpartition(".")[0]
        key = (parent, rec.rotation.n, rec.rotation.seed)
        by_key.setdefault(key, []).append(name)
    groups: list[list[str]] = []
    for names in by_key.values():
        first = modules[names[0]].record
        assert isinstance(first, QuantizedWeight) and first.rotation is not None
        same = [n for n in names if _same_tables(modules[n].record, first.rotation)]
        if len(same) < 2:
            continue
        slot = SharedRotation(first.rotation, members=len(same))
        for n in same:
            modules[n].share_rotation(slot)
        groups.append(same)
    return groups


def _same_tables(record: Record | None, rot: RotationTables) -> bool:
    import numpy as np

    if not isinstance(record, QuantizedWeight) or record.rotation is None:
        return False
    other = record.rotation
    return bool(
        other.n == rot.n
        and np.array_equal(other.signs, rot.signs)
        and np.array_equal(other.small, rot.small)
    )
