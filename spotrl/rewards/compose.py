"""Weighted composition of reward functions, with format rewards that only count for correct answers.

    reward = compose(math_reward, [Term("boxed", boxed_format, 0.1)])
    reward(completion, stopped, reference)   # 1.1 correct and boxed, 1.0 correct, 0.0 wrong (boxed or not)

A positive term is *gated* by correctness: it is added only when the correctness reward is at
least `gate` (1.0 by default). An additive format reward that wrong answers also collect is what
policies learn to farm (long, well-formatted, wrong), so a positive ungated term is refused; an
ungated term may only be a penalty (weight <= 0, and its contribution is clipped at 0 from above).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

RewardFn = Callable[[str, bool, str], float]


@dataclass(frozen=True)
class Term:
    name: str
    fn: RewardFn
    weight: float
    gated: bool = True


class Composite:
    """correctness_weight * correctness + sum(weight * term) over the terms that apply."""

    def __init__(
        self,
        correctness: RewardFn,
        terms: list[Term] | tuple[Term, ...] = (),
        *,
        correctness_weight: float = 1.0,
        gate: float = 1.0,
    ):
        names = [t.name for t in terms]
        if len(set(names)) != len(names) or "correct" in names:
            raise ValueError(f"term names must be distinct and not 'correct': {names}")
        for term in terms:
            if not term.gated and term.weight > 0:
                raise ValueError(
                    f"term {term.name!r}: a positive reward that is not gated by correctness can be "
                    "farmed by wrong answers; gate it, or give it a weight <= 0 (a penalty)"
                )
        if correctness_weight <= 0:
            raise ValueError("correctness_weight must be positive")
        self.correctness, self.terms = correctness, tuple(terms)
        self.correctness_weight, self.gate = correctness_weight, gate

    def breakdown(self, completion: str, stopped: bool, reference: str) -> dict[str, float]:
        """Each part's weighted contribution (0.0 for gated terms of an incorrect answer) and the total."""
        correct = float(self.correctness(completion, stopped, reference))
        parts = {"correct": self.correctness_weight * correct}
        for term in self.terms:
            applies = not term.gated or correct >= self.gate
            value = term.weight * float(term.fn(completion, stopped, reference)) if applies else 0.0
            parts[term.name] = value if term.gated else min(value, 0.0)  # an ungated term can only take away
        parts["total"] = sum(parts.values())
        return parts

    def __call__(self, completion: str, stopped: bool, reference: str) -> float:
        return self.breakdown(completion, stopped, reference)["total"]


def compose(correctness: RewardFn, terms=(), **kw) -> Composite:
    return Composite(correctness, list(terms), **kw)


# -------------------------------------------------------------------------------- format terms


def boxed_format(completion: str, stopped: bool, reference: str) -> float:
    """1.0 when the completion gives exactly one \\boxed{...} answer and ends soon after it."""
    boxes = [m.start() for m in re.finditer(r"\\boxed\s*\{", completion)]
    if len(boxes) != 1:
        return 0.0
    return float(len(completion) - boxes[0] <= 200)


def stopped_format(completion: str, stopped: bool, reference: str) -> float:
    """1.0 when the completion ended with the stop token (not cut off by the length limit)."""
    return float(stopped)


def code_block_format(completion: str, stopped: bool, reference: str) -> float:
    """1.0 when the completion holds exactly one fenced ```python block."""
    return float(len(re.findall(r"```(?:python|py)\s*\n", completion)) == 1)


def length_overflow(max_chars: int) -> RewardFn:
    """0 up to `max_chars`, then 1 per further `max_chars` characters: an ungated penalty with a
    negative weight, e.g. Term("length", length_overflow(2000), -0.1, gated=False)."""

    def overflow(completion: str, stopped: bool, reference: str) -> float:
        return max(0, len(completion) - max_chars) / max_chars

    return overflow
