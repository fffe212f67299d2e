"""The built-in code problem: write a small Python function that passes given tests, generated offline.

Each problem comes from a family (add a constant, count a character, sum multiples, ...) with drawn
parameters. The prompt states the function and shows one example call; `tests` holds five
`assert f(...) == <literal>` lines (the example and four more, unseen), which the sandbox checks
out of process (see `spotrl.rewards.code_tests`). The expected values come from the family's
reference implementation here, and `metadata` carries the reference solution's source, so a test can
run it through the sandbox. Splits are deterministic from the seed and the train split never holds
a held-out prompt.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from spotrl.model.tokenizers import TEXT_ALPHABET, BucketedCharTokenizer
from spotrl.problems.spec import Problem, register
from spotrl.rng import derive_numpy_rng

SOURCE = "builtin/code"
TESTS_PER_PROBLEM = 5
WORDS = ("apple", "river", "stone", "cloud", "tiger", "maple", "ocean", "piano", "ember", "lunar", "delta", "quartz")


@dataclass(frozen=True)
class Family:
    name: str
    params: Callable[[np.random.Generator], dict]
    signature: str  # with {param} placeholders
    description: str
    solution: str  # Python source of the reference, with {param} placeholders
    inputs: Callable[[np.random.Generator, dict], list[tuple]]
    reference: Callable[..., object]  # (params, *args) -> expected value


def _ints(lo, hi):
    return lambda rng, p: [(int(x),) for x in rng.integers(lo, hi, TESTS_PER_PROBLEM)]


def _text(rng, p):
    out = []
    for _ in range(TESTS_PER_PROBLEM):
        k = int(rng.integers(1, 5))
        out.append((" ".join(str(w) for w in rng.choice(WORDS, k)),))
    return out


def _lists(rng, p):
    return [([int(v) for v in rng.integers(-20, 21, int(rng.integers(1, 7)))],) for _ in range(TESTS_PER_PROBLEM)]


FAMILIES = (
    Family(
        "add_const",
        lambda r: {"k": int(r.integers(2, 50))},
        "add_{k}(x)",
        "returns x plus {k}",
        "def add_{k}(x):\n    return x + {k}\n",
        _ints(-100, 100),
        lambda p, x: x + p["k"],
    ),
    Family(
        "mul_const",
        lambda r: {"k": int(r.integers(2, 13))},
        "times_{k}(x)",
        "returns x multiplied by {k}",
        "def times_{k}(x):\n    return x * {k}\n",
        _ints(-50, 50),
        lambda p, x: x * p["k"],
    ),
    Family(
        "clamp",
        lambda r: (lambda lo: {"lo": lo, "hi": lo + int(r.integers(5, 30))})(int(r.integers(-20, 10))),
        "clamp(x)",
        "returns x limited to the range from {lo} to {hi} (inclusive)",
        "def clamp(x):\n    return max({lo}, min({hi}, x))\n",
        _ints(-40, 50),
        lambda p, x: max(p["lo"], min(p["hi"], x)),
    ),
    Family(
        "count_char",
        lambda r: {"c": str(r.choice(list("aeiornt")))},
        "count_{c}(s)",
        "returns how many times the letter '{c}' occurs in the string s",
        "def count_{c}(s):\n    return s.count('{c}')\n",
        _text,
        lambda p, s: s.count(p["c"]),
    ),
    Family(
        "reverse_words",
        lambda r: {},
        "reverse_words(s)",
        "returns the words of the string s in reverse order, joined by single spaces",
        "def reverse_words(s):\n    return ' '.join(reversed(s.split()))\n",
        _text,
        lambda p, s: " ".join(reversed(s.split())),
    ),
    Family(
        "sum_multiples",
        lambda r: {"a": int(r.integers(2, 6)), "b": int(r.integers(6, 10))},
        "sum_multiples(n)",
        "returns the sum of the positive integers below n that are multiples of {a} or of {b}",
        "def sum_multiples(n):\n    return sum(i for i in range(1, n) if i % {a} == 0 or i % {b} == 0)\n",
        _ints(0, 200),
        lambda p, n: sum(i for i in range(1, n) if i % p["a"] == 0 or i % p["b"] == 0),
    ),
    Family(
        "divisible",
        lambda r: {"k": int(r.integers(2, 12))},
        "divisible_by_{k}(x)",
        "returns True if the integer x is divisible by {k} and False otherwise",
        "def divisible_by_{k}(x):\n    return x % {k} == 0\n",
        _ints(-60, 60),
        lambda p, x: x % p["k"] == 0,
    ),
    Family(
        "spread",
        lambda r: {},
        "spread(xs)",
        "returns the largest number in the non-empty list xs minus the smallest",
        "def spread(xs):\n    return max(xs) - min(xs)\n",
        _lists,
        lambda p, xs: max(xs) - min(xs),
    ),
    Family(
        "digit_sum",
        lambda r: {},
        "digit_sum(n)",
        "returns the sum of the decimal digits of the non-negative integer n",
        "def digit_sum(n):\n    return sum(int(d) for d in str(n))\n",
        _ints(0, 100000),
        lambda p, n: sum(int(d) for d in str(n)),
    ),
    Family(
        "above",
        lambda r: {"k": int(r.integers(-5, 6))},
        "above(xs)",
        "returns a list of the elements of the list xs that are greater than {k}, in their original order",
        "def above(xs):\n    return [x for x in xs if x > {k}]\n",
        _lists,
        lambda p, xs: [x for x in xs if x > p["k"]],
    ),
    Family(
        "repeat",
        lambda r: {"k": int(r.integers(2, 5)), "sep": str(r.choice(["-", "+", ","]))},
        "repeat(s)",
        "returns the string s repeated {k} times, with '{sep}' between the copies",
        "def repeat(s):\n    return '{sep}'.join([s] * {k})\n",
        _text,
        lambda p, s: p["sep"].join([s] * p["k"]),
    ),
    Family(
        "fib",
        lambda r: {},
        "fib(n)",
        "returns the n-th Fibonacci number, where fib(0) == 0 and fib(1) == 1",
        "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
        _ints(0, 40),
        lambda p, n: _fib(n),
    ),
)


def _fib(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def _call(name: str, args: tuple) -> str:
    return f"{name}({', '.join(repr(a) for a in args)})"


def make_problem(rng: np.random.Generator) -> dict:
    family = FAMILIES[int(rng.integers(len(FAMILIES)))]
    params = family.params(rng)
    signature = family.signature.format(**params)
    name = signature.split("(")[0]
    cases = family.inputs(rng, params)
    lines = [f"assert {_call(name, args)} == {family.reference(params, *args)!r}" for args in cases]
    first = cases[0]
    prompt = (
        f"Write a Python function `{signature}` that {family.description.format(**params)}.\n"
        f"For example, `{_call(name, first)}` returns `{family.reference(params, *first)!r}`.\n"
        "Answer with the function in a ```python code block."
    )
    solution = family.solution.format(**params)
    return {
        "prompt": prompt,
        "tests": "\n".join(lines) + "\n",
        "metadata": json.dumps({"family": family.name, "entry_point": name, "reference": solution}, sort_keys=True),
    }


def completion_text(reference: str) -> str:
    """The completion a supervised warm start would train on for a reference solution."""
    return f"```python\n{reference}```"


def make_splits(seed: int, train_size: int, eval_size: int, max_rounds: int = 50) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Train and held-out problems as canonical frames (id, prompt, answer=None, tests, source, metadata)."""
    rng = derive_numpy_rng(seed, "code-task")
    seen: set[str] = set()

    def draw(size: int, split: str) -> pd.DataFrame:
        rows = []
        for _ in range(max_rounds * max(size, 1)):
            if len(rows) == size:
                break
            problem = make_problem(rng)
            if problem["prompt"] in seen:
                continue
            seen.add(problem["prompt"])
            rows.append(
                {
                    "id": f"code/{split}-{len(rows):06d}",
                    "prompt": problem["prompt"],
                    "answer": None,
                    "tests": problem["tests"],
                    "source": SOURCE,
                    "metadata": problem["metadata"],
                }
            )
        if len(rows) < size:
            raise ValueError(f"could only generate {len(rows)} distinct {split} code problems, {size} asked")
        return pd.DataFrame(rows, columns=["id", "prompt", "answer", "tests", "source", "metadata"]).astype(object)

    held_out = draw(eval_size, "eval")
    train = draw(train_size, "train")
    return train, held_out


def _target(answer, metadata) -> str | None:
    """The reference solution (from the row's metadata) as a completion; None without one."""
    try:
        reference = json.loads(metadata).get("reference") if isinstance(metadata, str) else None
    except ValueError:
        reference = None
    return completion_text(reference) if isinstance(reference, str) else None


def _builtin_splits(problem_cfg, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    train, held_out = make_splits(seed, problem_cfg.train_size, problem_cfg.eval_size)
    return CODE.run_rows(train), CODE.run_rows(held_out)


CODE = register(
    Problem(
        name="code",
        alphabet=TEXT_ALPHABET,
        tokenizer_class=BucketedCharTokenizer,
        verifier="code",
        reference_field="tests",
        target=_target,
        builtin_splits=_builtin_splits,
    )
)
