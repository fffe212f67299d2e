"""The built-in task without a labelled solution: given numbers and a target, write an arithmetic
expression that uses every number exactly once and equals the target.

    prompt      "3 5 7=22"       (numbers sorted; numbers and target zero-padded to the widths of
                                  max_value and max_target, so every prompt of a run has one length)
    correct     "3*5+7", "7+5*3", "(7-5)*... " anything reasoning-gym's countdown scorer gives 1.0
    reference   {"dataset": "countdown", "options": ..., "entry": {"question", "metadata": {numbers, target}}}

Instances come from reasoning-gym's countdown generator (seeded from the run seed) and are scored
by its score_answer (the `reasoning_gym` verifier): there are many correct answers, and no row holds
one (the generator's own solution expression is dropped). The warm start teaches the format only:
each row's target is a random well-formed expression over its numbers, drawn from the seed and
redrawn until its value is not the target, so it is never a solution; whatever the policy solves
beyond chance it learned from the verifier.
"""

from __future__ import annotations

import json
from fractions import Fraction

import numpy as np

from spotrl.model.tokenizers import CharTokenizer
from spotrl.problems.reasoning_gym import dataset_seed, reference
from spotrl.problems.spec import GeneratedSource, Problem, register
from spotrl.rng import derive_numpy_rng

ALPHABET = "0123456789 =+-*/()"
OPERATORS = "+-*/"
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}
LEAF = 3  # precedence of a number: never parenthesised
MAX_DRAWS = 100


def generator_options(countdown_cfg) -> dict:
    """reasoning-gym's CountdownConfig fields for the run's countdown section."""
    c = countdown_cfg
    return {
        "min_numbers": c.numbers,
        "max_numbers": c.numbers,
        "min_value": c.min_value,
        "max_value": c.max_value,
        "min_target": c.min_target,
        "max_target": c.max_target,
    }


def prompt_text(numbers, target: int, max_value: int, max_target: int) -> str:
    width, target_width = len(str(max_value)), len(str(max_target))
    return " ".join(f"{n:0{width}d}" for n in sorted(numbers)) + f"={target:0{target_width}d}"


def evaluate(op: str, a: Fraction, b: Fraction) -> Fraction:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return a / b  # ZeroDivisionError for b == 0


def random_expression(rng: np.random.Generator, numbers) -> tuple[str, Fraction] | None:
    """A random expression using each number once: repeatedly join two random subexpressions with a
    random operator (parenthesised only where precedence needs it); None on a division by zero."""
    items = [(str(n), Fraction(n), LEAF) for n in numbers]
    while len(items) > 1:
        i, j = (int(k) for k in rng.choice(len(items), size=2, replace=False))
        (left, a, lp), (right, b, rp) = items[i], items[j]
        op = OPERATORS[int(rng.integers(len(OPERATORS)))]
        prec = _PRECEDENCE[op]
        try:
            value = evaluate(op, a, b)
        except ZeroDivisionError:
            return None
        text = (left if lp >= prec else f"({left})") + op + (right if rp > prec else f"({right})")
        items = [item for k, item in enumerate(items) if k not in (i, j)] + [(text, value, prec)]
    return items[0][0], items[0][1]


def format_target(rng: np.random.Generator, numbers, target: int) -> str | None:
    """A random well-formed expression over `numbers` whose value is not `target` (None if none was drawn)."""
    for _ in range(MAX_DRAWS):
        drawn = random_expression(rng, numbers)
        if drawn is not None and drawn[1] != target:
            return drawn[0]
    return None


def generate(problem_cfg, seed: int) -> list[GeneratedSource]:
    import reasoning_gym

    c, options = problem_cfg.countdown, generator_options(problem_cfg.countdown)
    size = problem_cfg.train_size + problem_cfg.eval_size
    ds = reasoning_gym.create_dataset("countdown", size=size, seed=dataset_seed(seed, 0, "countdown"), **options)
    rng = derive_numpy_rng(seed, "countdown/format")
    records = []
    for j in range(size):
        meta = ds[j]["metadata"]
        numbers, target = sorted(int(n) for n in meta["numbers"]), int(meta["target"])
        prompt = prompt_text(numbers, target, c.max_value, c.max_target)
        # what score_answer reads, and nothing else: the generator's solution stays out of the row
        entry = {"question": prompt, "metadata": {"numbers": numbers, "target": target}}
        records.append(
            {
                "id": f"{j:06d}",
                "prompt": prompt,
                "answer": reference("countdown", options, entry),
                "format_target": format_target(rng, numbers, target),
            }
        )
    return [GeneratedSource("countdown", records)]


def _target(answer, metadata) -> str | None:
    """The row's random format expression (never a solution), from its metadata."""
    try:
        return json.loads(metadata).get("format_target") if isinstance(metadata, str) else None
    except ValueError:
        return None


def _check_config(config) -> None:
    from spotrl.problems.reasoning_gym import check_dataset

    check_dataset("countdown", generator_options(config.problem.countdown), "problem.countdown")


COUNTDOWN = register(
    Problem(
        name="countdown",
        alphabet=ALPHABET,
        tokenizer_class=CharTokenizer,  # prompts of one length (zero-padded): nothing to bucket
        verifier="reasoning_gym",
        reference_field="answer",
        target=_target,
        check_config=_check_config,
        generated=generate,
        reference_is_text=False,
    )
)
