"""The built-in arithmetic task: `a+b=` with exact, verifiable answers.

Operands have 2..4 digits and are zero-padded to 4 in the prompt ("0012+0345="). Answers are
written least-significant digit first ("753" for 357): the order in which a left-to-right decoder
can compute carries, which makes the task learnable by a tiny model on a CPU. Splits are generated
deterministically from the seed; the train split never contains a held-out prompt.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from spotrl.curation.schema import to_dataset

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


def make_splits(seed: int, train_size: int, eval_size: int, min_digits: int = 2, max_digits: int = 4):
    """Train and held-out splits as validated `datasets.Dataset`s (id, prompt, answer, source)."""
    if not 1 <= min_digits <= max_digits <= WIDTH:
        raise ValueError(f"need 1 <= min_digits <= max_digits <= {WIDTH}, got {min_digits}, {max_digits}")
    rng = np.random.default_rng([seed, 0x5EED])
    eval_rows = _unique_rows(_problems(rng, eval_size * 2, min_digits, max_digits), eval_size, "eval", exclude=set())
    held_out = set(eval_rows["prompt"])
    train_rows = _unique_rows(_problems(rng, train_size * 2, min_digits, max_digits), train_size, "train", held_out)
    return to_dataset(train_rows, "arithmetic/train"), to_dataset(eval_rows, "arithmetic/eval")


def _unique_rows(problems, size: int, split: str, exclude: set[str]) -> pd.DataFrame:
    rows, seen = [], set(exclude)
    for a, b in problems:
        prompt = prompt_text(a, b)
        if prompt in seen:
            continue
        seen.add(prompt)
        rows.append({"id": f"{split}-{len(rows):06d}", "prompt": prompt, "answer": str(a + b), "source": SOURCE})
        if len(rows) == size:
            break
    if len(rows) < size:
        raise ValueError(f"could only generate {len(rows)} distinct {split} problems, {size} asked")
    return pd.DataFrame(rows)
