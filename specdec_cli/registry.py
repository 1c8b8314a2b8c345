"""A tiny name -> object registry (drafters, backends, ...); names live only here.

    DRAFTERS: Registry[type[Drafter]] = Registry("drafter")

    @DRAFTERS.register("ngram")
    class NgramDrafter: ...

    DRAFTERS.get("ngram")  # -> NgramDrafter; an unknown name raises with the known ones
"""
from __future__ import annotations

from typing import Callable, Generic, TypeVar

from specdec_cli.errors import SpecdecError

T = TypeVar("T")


class Registry(Generic[T]):
    """Objects of one kind, registered under unique names."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator that registers its target under ``name`` (duplicates are a bug)."""

        def add(item: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} '{name}' is already registered")
            self._items[name] = item
            return item

        return add

    def get(self, name: str) -> T:
        """The object registered as ``name``; unknown names raise listing the known ones."""
        if name not in self._items:
            known = ", ".join(self.names()) or "none"
            raise SpecdecError(f"unknown {self.kind} '{name}' (known: {known})")
        return self._items[name]

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._items)
