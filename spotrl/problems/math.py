"""The math problem: free-form questions whose final answer is checked for equivalence. No built-in
prompts: a run names dataset sources in curation.sources."""

from __future__ import annotations

from spotrl.model.tokenizers import TEXT_ALPHABET, BucketedCharTokenizer
from spotrl.problems.spec import Problem, register


def _target(answer, metadata) -> str | None:
    return answer if isinstance(answer, str) else None


def _check_config(config) -> None:
    if not config.curation.sources:
        raise ValueError("problem.name 'math' has no built-in prompts: name dataset sources in curation.sources")


MATH = register(
    Problem(
        name="math",
        alphabet=TEXT_ALPHABET,
        tokenizer_class=BucketedCharTokenizer,
        verifier="math",
        reference_field="answer",
        target=_target,
        check_config=_check_config,
    )
)
