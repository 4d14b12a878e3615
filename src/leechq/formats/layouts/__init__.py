"""Served layouts: repackings of a canonical :class:`QuantizedWeight` for the kernels.

A layout is a pure bit reordering of the canonical codes (plus padding and f32 copies of the scales
for the device). Each module owns one layout: its record type (whose class attribute ``layout`` is
the layout's name, what consumers dispatch on) and ``pack(qw)``, ``unpack(record)`` and
``concat_rows(records)``; this package keeps them in a :class:`leechq.registry.Registry` by name:

* ``tetra48``  — Tetra words, 6 little-endian bytes per block, rows padded to 8 bytes
  (docs/kernels.md);
* ``tetra64``  — the same Tetra matrix as its decoder's table addresses and shells, 16 bytes per
  block pair: the form the batch-1 kernel serves (:mod:`.tetra64`);
* ``planes14`` — the ball codebook unfolded into 14-byte bit-plane records with a 512-entry class
  table (docs/kernels.md).

A new layout is a new module plus one registration here. :func:`for_codebook` gives the layout a
codebook packs into first (``derived_from`` None); a derived layout is a served form of another
(``tetra64`` of ``tetra48``). Nothing is computed at import. See docs/kernels.md for the byte
layouts and the kernel contracts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from leechq.errors import InvalidInput
from leechq.registry import Registry


@dataclass(frozen=True)
class Layout:
    """One served layout: its name, codebook, record type, the name of the record's packed code
    tensor (``data``), the layout it is a served form of (``derived_from``, or None) and the three
    host-side functions."""

    name: str
    codebook: str
    record: type
    data: str
    pack: Callable[[Any], Any]
    unpack: Callable[[Any], Any]
    concat_rows: Callable[[Sequence[Any]], Any]
    derived_from: str | None = None


REGISTRY: Registry[Layout] = Registry("layout")


def _tetra48() -> Layout:
    from leechq.formats.layouts import tetra48

    return Layout("tetra48", "tetra", tetra48.Tetra48Weight, "words", tetra48.pack,
                  tetra48.unpack, tetra48.concat_rows)


def _tetra64() -> Layout:
    from leechq.formats.layouts import tetra64

    return Layout("tetra64", "tetra", tetra64.Tetra64Weight, "words", tetra64.pack,
                  tetra64.unpack, tetra64.concat_rows, derived_from="tetra48")


def _planes14() -> Layout:
    from leechq.formats.layouts import planes14

    return Layout("planes14", "ball", planes14.Planes14Weight, "records", planes14.pack,
                  planes14.unpack, planes14.concat_rows)


REGISTRY.register("tetra48", _tetra48)
REGISTRY.register("tetra64", _tetra64)
REGISTRY.register("planes14", _planes14)


def get(name: str) -> Layout:
    """The layout registered under ``name`` (see :func:`names`)."""
    return REGISTRY.get(name)


def names() -> list[str]:
    """Registered layout names."""
    return REGISTRY.names()


def of(record: Any) -> Layout:
    """The registered layout of a packed record (by its type's ``layout`` name).

    Raises:
        InvalidInput: ``record`` is not a record of a registered layout.
    """
    name = getattr(type(record), "layout", None)
    if not isinstance(name, str) or name not in names() or type(record) is not get(name).record:
        raise InvalidInput(f"not a packed record of a registered layout: {type(record).__name__}")
    return get(name)


def for_codebook(codebook: str) -> Layout | None:
    """The layout records of ``codebook`` are packed into (the one not derived from another), or
    None when no layout holds that codebook."""
    for name in names():
        lay = get(name)
        if lay.codebook == codebook and lay.derived_from is None:
            return lay
    return None


__all__ = ["REGISTRY", "Layout", "for_codebook", "get", "names", "of"]
