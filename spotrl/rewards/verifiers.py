"""Exact-answer verifiers, in a registry keyed by task name."""

from __future__ import annotations

from typing import Callable

Verifier = Callable[[str, bool, str], float]
VERIFIERS: dict[str, Verifier] = {}


def register_verifier(name: str):
    def wrap(fn: Verifier) -> Verifier:
        VERIFIERS[name] = fn
        return fn

    return wrap


@register_verifier("arithmetic")
def reversed_digits_exact(completion: str, stopped: bool, answer: str) -> float:
    """1.0 when the completion, read right to left, is exactly the answer and ended with the stop token.

    A completion cut off by the token limit is wrong even if its prefix matches: the stop token is
    part of the answer, so padding an answer with extra text never scores.
    """
    return float(stopped and completion[::-1] == answer)


def get_verifier(task: str) -> Verifier:
    try:
        return VERIFIERS[task]
    except KeyError:
        raise ValueError(f"no verifier for task {task!r}; known: {sorted(VERIFIERS)}") from None
