"""A tiny stand-in direction codebook for pipeline tests (not a lattice codebook).

Label = 24-bit sign pattern (bit i set ⇔ coordinate i negative); point = 2·sign. Its angular
encoder is exact (the best ±1 direction for x is sign(x)), batched and cheap, so the GPTQ loop, the
artifact and the driver can be tested end to end without the Λ24 search. Registered under
``standin-cube`` only while a test runs (:func:`registered`, from an autouse fixture), never at
collection time, so tests that enumerate the registry (codebook conformance) never see it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from leechq.codebooks import REGISTRY, names

NAME = "standin-cube"


class StandinCube:
    name = NAME
    dim = 24
    label_bits = 24

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        neg = (x < 0).to(torch.int64)
        weights = 2 ** torch.arange(24, dtype=torch.int64, device=x.device)
        return (neg * weights).sum(dim=-1)

    def decode(self, labels: torch.Tensor) -> torch.Tensor:
        bits = (labels[..., None] >> torch.arange(24, device=labels.device)) & 1
        return (2 - 4 * bits).to(torch.int32)

    def fingerprint(self) -> str:
        return "00005ea1d0c0be00"


def register() -> str:
    """Register the stand-in (idempotent); returns its name."""
    names()  # make the registry register its built-ins first
    if NAME not in REGISTRY:
        REGISTRY.register(NAME, StandinCube)
    return NAME


def unregister() -> None:
    """Remove the stand-in again, so that tests which enumerate the registry never see it.

    (The registry has no public removal: this test helper reaches into it on purpose.)
    """
    REGISTRY._factories.pop(NAME, None)
    REGISTRY._instances.pop(NAME, None)


@contextmanager
def registered() -> Iterator[str]:
    """The stand-in's name, registered inside the ``with`` block (for an autouse fixture)."""
    register()
    try:
        yield NAME
    finally:
        unregister()
