"""Exact-answer verifiers, in a registry keyed by task name."""

from __future__ import annotations

from typing import Callable

from spotrl.registry import Registry

# (completion text, ended with the stop token, reference answer) -> reward
Verifier = Callable[[str, bool, str], float]
VERIFIERS: Registry[Verifier] = Registry("verifier for task")


@VERIFIERS.register("arithmetic")
def reversed_digits_exact(completion: str, stopped: bool, answer: str) -> float:
    """1.0 when the completion, read right to left, is exactly the answer and ended with the stop token.

    A completion cut off by the token limit is wrong even if its prefix matches: the stop token is
    part of the answer, so padding an answer with extra text never scores.
    """
    return float(stopped and completion[::-1] == answer)


def get_verifier(task: str) -> Verifier:
    return VERIFIERS[task]
