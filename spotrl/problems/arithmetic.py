"""The built-in arithmetic problem: `a+b=` with exact, verifiable answers.

Operands have 2..4 digits and are zero-padded to 4 in the prompt ("0012+0345="). Answers are
written least-significant digit first ("753" for 357): the order in which a left-to-right decoder
can compute carries, which makes the problem learnable by a tiny model on a CPU. Splits are generated
deterministically from the seed; the train split never contains a held-out prompt.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from spotrl.model.tokenizers import DIGITS_ALPHABET, CharTokenizer
from spotrl.problems.spec import Problem, register

SOURCE = "builtin/arithmetic"
WIDTH = 4


def _problems(rng: np.random.Generator, n: int, min_digits: int, max_digits: int) -> list[tuple[int, int]]:
    digits = rng.integers(min_digits, max_digits + 1, size=(n, 2))
    low = 10 ** (digits - 1)
    return [(int(a), int(b)) for a, b in rng.integers(low, 10**digits)]


def prompt_text(a: int, b: int) -> str:
    return f"{a:0{WIDTH}d}+{b:0{WIDTH}d}="


def completion_text(answer: str) -> str:
    """The completion the verifier accepts for an answer: its digits reversed."""
    return answer[::-1]


def make_splits(
    seed: int, train_size: int, eval_size: int, min_digits: int = 2, max_digits: int = 4
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Train and held-out splits as frames of prompt rows (id, prompt, answer, source)."""
    if not 1 <= min_digits <= max_digits <= WIDTH:
        raise ValueError(f"need 1 <= min_digits <= max_digits <= {WIDTH}, got {min_digits}, {max_digits}")
    if train_size + eval_size > distinct_problems(min_digits, max_digits):
        raise ValueError(
            f"{train_size} + {eval_size} problems asked, but only "
            f"{distinct_problems(min_digits, max_digits)} distinct ones have {min_digits}..{max_digits} digits"
        )
    rng = np.random.default_rng([seed, 0x5EED])
    draw = lambda n: _problems(rng, n, min_digits, max_digits)  # noqa: E731
    eval_rows = _unique_rows(draw, eval_size, "eval", exclude=set())
    train_rows = _unique_rows(draw, train_size, "train", set(eval_rows["prompt"]))
    return train_rows, eval_rows


def distinct_problems(min_digits: int, max_digits: int) -> int:
    operands = 10**max_digits - 10 ** (min_digits - 1)
    return operands * operands


def _unique_rows(draw, size: int, split: str, exclude: set[str], max_rounds: int = 50) -> pd.DataFrame:
    """`size` distinct problems not in `exclude`, drawing 2 * size at a time until there are enough."""
    rows, seen = [], set(exclude)
    for _ in range(max_rounds):
        for a, b in draw(size * 2):
            prompt = prompt_text(a, b)
            if prompt in seen:
                continue
            seen.add(prompt)
            rows.append({"id": f"{split}-{len(rows):06d}", "prompt": prompt, "answer": str(a + b), "source": SOURCE})
            if len(rows) == size:
                return pd.DataFrame(rows)
    raise ValueError(f"could only generate {len(rows)} distinct {split} problems, {size} asked")


def _target(answer, metadata) -> str | None:
    return completion_text(answer) if isinstance(answer, str) else None


def _builtin_splits(problem_cfg, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    p = problem_cfg
    return make_splits(seed, p.train_size, p.eval_size, p.min_digits, p.max_digits)


def _check_config(config) -> None:
    p = config.problem
    capacity = distinct_problems(p.min_digits, p.max_digits)
    if not config.curation.sources and p.train_size + p.eval_size > capacity:
        raise ValueError(
            f"problem.train_size + problem.eval_size ({p.train_size + p.eval_size}) > the "
            f"{capacity} distinct problems with {p.min_digits}..{p.max_digits} digits"
        )


ARITHMETIC = register(
    Problem(
        name="arithmetic",
        alphabet=DIGITS_ALPHABET,
        tokenizer_class=CharTokenizer,  # prompts of one length: nothing to bucket
        verifier="arithmetic",
        reference_field="answer",
        target=_target,
        builtin_splits=_builtin_splits,
        longest_prompt=prompt_text(9999, 9999),  # every prompt has this length
        check_config=_check_config,
    )
)
