"""Named registries of interchangeable parts (problems, advantage estimators, verifiers, losses, ...).

A registry owns the names of its parts: the config validates a name by asking the registry
(`names`), so there is no second list of names to keep in step. The config is the bottom layer,
though, and the registries live with their code, above it (`spotrl.rl.advantages`,
`spotrl.rewards.verifiers`, ...): the config cannot import them. `PROVIDERS` below says, entry-points
style, which module defines the registry of each kind and registers its built-in entries;
`registry(kind)` imports that module on first use (importlib) and returns the registry it made. A
registry of a kind without a provider (a test's, a plugin's) is an ordinary local object.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

# kind -> the module that defines that registry and registers its built-in entries on import
PROVIDERS: dict[str, str] = {
    "problem": "spotrl.problems",
    "advantage estimator": "spotrl.rl.advantages",
    "per-token advantage estimator": "spotrl.rl.advantages",
    "KL estimator": "spotrl.rl.losses",
    "loss aggregation": "spotrl.rl.losses",
    "verifier": "spotrl.rewards.verifiers",
}

_PROVIDED: dict[str, Registry] = {}  # kind -> the registry its provider module made


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}
        if kind in PROVIDERS:
            if kind in _PROVIDED:  # two registries of one kind would split its names
                raise ValueError(f"a {kind} registry already exists (in {PROVIDERS[kind]})")
            _PROVIDED[kind] = self

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


def registry(kind: str) -> Registry:
    """The registry of `kind`, its provider module imported first if it was not yet."""
    if kind not in _PROVIDED:
        if kind not in PROVIDERS:
            raise KeyError(f"no provider for {kind!r} registries; known kinds: {sorted(PROVIDERS)}")
        importlib.import_module(PROVIDERS[kind])
    return _PROVIDED[kind]
