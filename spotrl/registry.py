"""Named registries of interchangeable parts (advantage estimators, verifiers, losses, ...)."""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def wrap(item: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = item
            return item

        return wrap

    def __getitem__(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise ValueError(f"no {self.kind} {name!r}; known: {sorted(self._items)}") from None

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def names(self) -> list[str]:
        return sorted(self._items)
