"""A tiny name → factory registry shared by codebooks, layouts, kernels and eval tasks.

Unknown names and duplicate registrations raise errors that list the valid choices, so a typo on the
command line tells the user what exists instead of failing deep inside a call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from leechq.errors import InvalidInput

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to zero-argument factories; instances are built on first ``get`` and cached."""

    def __init__(self, kind: str) -> None:
        self._kind = kind
        self._factories: dict[str, Callable[[], T]] = {}
        self._instances: dict[str, T] = {}

    def register(self, name: str, factory: Callable[[], T]) -> None:
        """Register ``factory`` under ``name``; a second registration of a name is an error."""
        if name in self._factories:
            raise ValueError(f"{self._kind} {name!r} is already registered")
        self._factories[name] = factory

    def get(self, name: str) -> T:
        """Return the (cached) instance registered under ``name``."""
        if name not in self._factories:
            choices = ", ".join(sorted(self._factories)) or "(none)"
            raise InvalidInput(f"unknown {self._kind} {name!r}; choices: {choices}")
        if name not in self._instances:
            self._instances[name] = self._factories[name]()
        return self._instances[name]

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._factories)

    def __contains__(self, name: object) -> bool:
        return name in self._factories

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
