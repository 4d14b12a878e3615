"""Served layouts: repackings of a canonical :class:`QuantizedWeight` for the kernels.

A layout is a pure bit reordering of the canonical codes (plus padding and f32 copies of the scales
for the device). Each module owns one layout and exposes ``pack(qw)``, ``unpack(record)`` and
``concat_rows(records)``; this package keeps them in a :class:`leechq.registry.Registry` by name:

* ``tetra48``  — Tetra words, 6 little-endian bytes per block, rows padded to 8 bytes
  (docs/kernels.md);
* ``planes14`` — the ball codebook unfolded into 14-byte bit-plane records with a 512-entry class
  table (docs/kernels.md).

Nothing is computed at import. See docs/kernels.md for the byte layouts and the kernel contracts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from leechq.registry import Registry


@dataclass(frozen=True)
class Layout:
    """One served layout: its name, codebook and the three host-side functions."""

    name: str
    codebook: str
    pack: Callable[[Any], Any]
    unpack: Callable[[Any], Any]
    concat_rows: Callable[[Sequence[Any]], Any]


REGISTRY: Registry[Layout] = Registry("layout")


def _tetra48() -> Layout:
    from leechq.formats.layouts import tetra48

    return Layout("tetra48", "tetra", tetra48.pack, tetra48.unpack, tetra48.concat_rows)


def _planes14() -> Layout:
    from leechq.formats.layouts import planes14

    return Layout("planes14", "ball", planes14.pack, planes14.unpack, planes14.concat_rows)


REGISTRY.register("tetra48", _tetra48)
REGISTRY.register("planes14", _planes14)


def get(name: str) -> Layout:
    """The layout registered under ``name`` ("tetra48" or "planes14")."""
    return REGISTRY.get(name)


def names() -> list[str]:
    """Registered layout names."""
    return REGISTRY.names()


__all__ = ["REGISTRY", "Layout", "get", "names"]
