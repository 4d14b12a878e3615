"""The lattice matvec's per-call path: the dispatch table's request for a packed record
(:func:`matvec_request`), and :func:`matvec_path` — the entry ``kernels.select.choose`` picks for
a call of some rows, with the ``m1`` launch groups, after their first-use checks (a failed one
marks ``m1`` unusable for the request and the table chooses again) — kept per request. The entry
points of :mod:`.ops` call it; nothing here decides by itself."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch

from leechq.kernels.triton import ops_common as _c
from leechq.kernels.triton.ops_common import interpreting

if TYPE_CHECKING:
    from leechq.formats.layouts.planes14 import Planes14Weight
    from leechq.formats.layouts.tetra48 import Tetra48Weight
    from leechq.kernels.triton.ops import MatvecConfig


def _ops() -> ModuleType:
    """:mod:`.ops` (imported when called: it imports this module)."""
    from leechq.kernels.triton import ops

    return ops


def matvec_request(w: Tetra48Weight | Planes14Weight, m_rows: int,
                   device: torch.device | None = None, dense_copy: bool = False) -> Any:
    """The dispatch table's :class:`~leechq.kernels.select.Request` for ``m_rows`` activation
    rows of the lattice record ``w`` (its registered layout, shape, device and :data:`.ops_common.A16`; ``dense_copy``: the caller holds a
    float16 dequantized copy)."""
    from leechq.kernels.select import Request

    if device is None:
        device = (w.records if hasattr(w, "records") else w.words).device
    return Request(w.layout, m_rows, device, n_blocks=w.n_blocks, dense_copy=dense_copy,
                   d_out=getattr(w, "d_out", 0), tail_cols=getattr(w, "tail_cols", 0),
                   a16=_c.A16)


def _m1_check(layout: str) -> Callable[[torch.device, MatvecConfig], bool]:
    """The first-use check of the ``m1`` kernel for ``layout``."""
    ops = _ops()
    if layout == "planes14":
        return ops._check_planes14_m1
    return ops._check_m1_t64 if layout == "tetra64" else ops._check_m1


def matvec_path(w: Tetra48Weight | Planes14Weight, m_rows: int,
                device: torch.device | None = None
                ) -> tuple[str, list[tuple[int, MatvecConfig]] | None]:
    """The path ``m_rows`` unconfigured activation rows of ``w`` take — the name of the dispatch
    table's entry (``"imma"``, ``"m1"`` or ``"tiled"``; ``kernels.select.choose``, memoized) —
    and, where the ``m1`` kernel serves (or, for Planes14, the int8 kernel, which reads the
    ``m1`` activation order), its ``(rows, configuration)`` launch groups (:func:`.ops.m1_plan`),
    else None.

    Each group's geometry passes the ``m1`` kernel's first-use check on the device
    (:func:`.ops.m1_enabled`); a failed check (which warns, naming the kernel) marks ``m1`` unusable
    for this request (``select.refuse``) and the table chooses again. Under a CUDA-graph capture
    with no verdict yet, ``m1`` is passed over for this call only. The answer is kept per
    request and ``select.generation()`` (not while ``torch.compile`` traces), so a layer's
    calls of one row count compute it once.

    Raises:
        KernelUnavailable: no entry can run the request (the message lists why)."""
    from leechq.kernels import select

    req = matvec_request(w, m_rows, device)
    traced = torch.compiler.is_compiling()
    key = None if traced else (req, select.generation())
    if key is not None and key in _PATHS:
        return _PATHS[key]
    check = _m1_check(req.layout)
    skip: frozenset[str] = frozenset()
    while True:
        k = select.choose(req, skip=skip)
        if k.name != "m1" and not (k.name == "imma" and req.layout == "planes14"):
            path = (k.name, None)
            break
        plan = _ops().m1_plan(w.d_out, w.n_blocks, req.device, w.tail_cols, m_rows,
                       req.layout == "tetra64")
        verdicts = [_m1_verdict(req.device, c, check) for _, c in plan]
        if all(v is True for v in verdicts):
            path = (k.name, plan)
            break
        if any(v is False for v in verdicts):
            select.refuse("m1", req, f"the kernel failed its first-use check on {req.device}")
            key = None if traced else (req, select.generation())
        else:  # under a capture with no verdict yet: this call only
            skip = skip | {"m1", "imma"} if req.layout == "planes14" else skip | {"m1"}
            key = None
    if key is not None:
        if len(_PATHS) > 4096:
            _PATHS.clear()
        _PATHS[key] = path
    return path


_PATHS: dict[tuple[Any, int], tuple[str, list[tuple[int, MatvecConfig]] | None]] = {}
""":func:`matvec_path`'s answers per (request, ``select.generation()``)."""


def _m1_verdict(device: torch.device, cfg: MatvecConfig, check: Callable) -> bool | None:
    """:func:`m1_enabled`'s verdict, or None under a CUDA-graph capture with none yet."""
    ops = _ops()
    if interpreting() or device.type != "cuda":
        return True
    key = (str(device), cfg, check.__name__, _c.A16)
    if key not in ops._M1_CHECKED and torch.cuda.is_current_stream_capturing():
        return None
    return ops.m1_enabled(device, cfg, check)


def _configured_m1(w: Tetra48Weight | Planes14Weight, m_rows: int, device: torch.device,
                   config: MatvecConfig) -> list[tuple[int, MatvecConfig]] | None:
    """The one launch group of an explicit ``m1`` ``config`` for ``m_rows`` rows of ``w`` (several
    need its ``mb`` > 1), or None where it is not an ``m1`` configuration, cannot take the shape,
    or failed its first-use check (the caller then runs the tiled kernel's defaults)."""
    ops = _ops()
    check = _m1_check(w.layout)
    if ops._m1_applies(config, w) and ops._m1_runs(config, m_rows, device, check):
        return [(m_rows, config)]
    return None
