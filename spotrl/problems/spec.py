"""What a problem decides, as one registered `Problem` spec: the tokenizer of the built-in model,
the verifier, the field the verifier checks, the built-in prompts, the completions a supervised warm
start trains on, and the config checks only that problem needs.

The run's prompt rows (RUN/data, `curation.schema.PROMPT_SCHEMA`) carry in `answer` the reference
the problem's verifier receives (`Problem.reference_field` of the canonical row: the answer for
`arithmetic` and `math`, the tests, Python asserts, for `code`). `target`, when present, is the
completion a warm start teaches (the reference solution of a built-in code problem); rows without one
are not used by the warm start.

This layer sits below curation, rewards and rl: the verifier is named by its key in
`spotrl.rewards.verifiers.VERIFIERS`, not imported, and the built-in splits are pandas frames that
curation validates and stores.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import pandas as pd

from spotrl.model.tokenizers import CharTokenizer
from spotrl.registry import Registry

if TYPE_CHECKING:
    from spotrl.config import ProblemConfig, RunConfig


@dataclasses.dataclass(frozen=True)
class GeneratedSource:
    """Rows a generated problem made from the seed (as many per source as its weight asks): records
    with id, prompt, answer (the verifier's reference) and any other fields (kept in the canonical
    row's metadata)."""

    name: str
    records: list[dict]


@dataclasses.dataclass(frozen=True)
class Problem:
    name: str
    alphabet: str  # the characters the built-in model's tokenizer encodes (and curation accepts)
    tokenizer_class: type[CharTokenizer]  # CharTokenizer, or BucketedCharTokenizer for prompts of many lengths
    verifier: str  # the key of its verifier in spotrl.rewards.verifiers.VERIFIERS
    reference_field: str  # the canonical field the verifier checks: "answer" or "tests"
    # (answer, metadata JSON or None) of a canonical row -> the completion a warm start teaches, or None
    target: Callable[[object, object], str | None]
    # (problem config, seed) -> (train, eval) frames of prompt rows; None: no built-in prompts
    builtin_splits: Callable[[ProblemConfig, int], tuple[pd.DataFrame, pd.DataFrame]] | None = None
    # the longest prompt the problem has, for the memory estimate; None: unknown (512 tokens assumed)
    longest_prompt: str | None = None
    # raises ValueError (naming the dotted keys) for a run config this problem cannot run with
    check_config: Callable[[RunConfig], None] | None = None
    # (problem config, seed) -> generated sources, curated like dataset sources (quarantine, dedup,
    # the train/held-out split, manifest); None: not a generated problem
    generated: Callable[[ProblemConfig, int], list[GeneratedSource]] | None = None
    # the reference is text the model could write, checked against `alphabet` by curation; False
    # for a structured reference only the verifier reads (reasoning-gym's entry JSON)
    reference_is_text: bool = True

    def tokenizer(self) -> CharTokenizer:
        """The built-in model's tokenizer for this problem."""
        return self.tokenizer_class(self.alphabet)

    def run_rows(self, canonical: pd.DataFrame) -> pd.DataFrame:
        """Canonical curated rows as the run's prompt rows (id, prompt, answer = the verifier's
        reference, source, target)."""
        targets = [self.target(a, m) for a, m in zip(canonical["answer"], canonical["metadata"])]
        return pd.DataFrame(
            {
                "id": canonical["id"].astype(object),
                "prompt": canonical["prompt"].astype(object),
                "answer": canonical[self.reference_field].astype(object),
                "source": canonical["source"].astype(object),
                "target": pd.Series(targets, dtype=object, index=canonical.index),
            }
        ).reset_index(drop=True)

    def warm_start_examples(self, split) -> tuple[list[str], list[str], list[str]]:
        """(prompts, verifier references, target completions) of the rows of a split (a
        `datasets.Dataset` of prompt rows) that a warm start can learn from."""
        if "target" not in split.column_names:  # built-in rows without targets: the target follows from the answer
            rows = [(p, a, self.target(a, None)) for p, a in zip(split["prompt"], split["answer"])]
        else:
            rows = list(zip(split["prompt"], split["answer"], split["target"]))
        rows = [r for r in rows if r[2] is not None]
        return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]


PROBLEMS: Registry[Problem] = Registry("problem")


def register(problem: Problem) -> Problem:
    return PROBLEMS.register(problem.name)(problem)


def get_problem(name: str) -> Problem:
    """The registered problem `name` (its provider, spotrl.problems, imported on first use)."""
    import spotrl.problems  # noqa: F401  registers the built-in problems

    return PROBLEMS[name]
