"""Verifiers, in a registry keyed by name: exact reversed digits, math answers, code in a sandbox,
reasoning-gym's scoring functions.

A problem (`spotrl.problems.Problem.verifier`) names the one that checks its completions."""

from __future__ import annotations

from collections.abc import Callable

from spotrl.registry import Registry

# (completion text, ended with the stop token, reference answer) -> reward
Verifier = Callable[[str, bool, str], float]
VERIFIERS: Registry[Verifier] = Registry("verifier")


@VERIFIERS.register("arithmetic")
def reversed_digits_exact(completion: str, stopped: bool, answer: str) -> float:
    """1.0 when the completion, read right to left, is exactly the answer and ended with the stop token.

    A completion cut off by the token limit is wrong even if its prefix matches: the stop token is
    part of the answer, so padding an answer with extra text never scores.
    """
    return float(stopped and completion[::-1] == answer)


@VERIFIERS.register("math")
def math_answer(completion: str, stopped: bool, answer: str) -> float:
    """1.0 when the final answer (\\boxed, "answer:", last number) is equivalent to the reference."""
    from spotrl.rewards.math import math_reward

    return math_reward(completion, stopped, answer)


@VERIFIERS.register("code")
def code_tests(completion: str, stopped: bool, tests: str) -> float:
    """1.0 when the completion's code passes the row's tests in the sandbox (`SandboxError` if the
    sandbox itself fails: never 0 for that)."""
    from spotrl.rewards.code import code_reward

    return code_reward(completion, stopped, tests)


@VERIFIERS.register("reasoning_gym")
def reasoning_gym_score(completion: str, stopped: bool, reference: str) -> float:
    """1.0 when the dataset's own score_answer gives the answer full marks; the reference is the JSON
    {dataset, options, entry} (`ScorerError` if the scorer times out or fails: never 0 for that)."""
    from spotrl.rewards.rgym import rgym_reward

    return rgym_reward(completion, stopped, reference)


def get_verifier(name: str) -> Verifier:
    return VERIFIERS[name]
