"""Sampling and scoring the policy: held-out pass@1 and pass@k from n samples per prompt (unbiased
estimator), greedy accuracy, and the sampled rewards a difficulty estimate is made of."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import jax
import numpy as np
import pandas as pd

from spotrl.evaluation.passk import mean_pass_at_k
from spotrl.rewards.score import score
from spotrl.rollout.completions import LoadedPolicy, sample_completions
from spotrl.rollout.sampler import SamplingParams


def evaluate_pass_at_k(
    policy: LoadedPolicy,
    verifier: str,
    prompts,
    answers,
    *,
    n: int,
    k: int,
    sampling: SamplingParams,
    key: jax.Array,
    report: Callable[[int, dict], None] | None = None,
    max_chunk_rows: int = 1024,
) -> dict:
    """pass@1 and pass@k of `policy` from n samples per prompt; `report(samples_done, {"pass@1": ...})`,
    if given, after each sampled chunk is scored."""
    answers = [a for a in answers for _ in range(n)]
    scored = []

    def score_chunk(chunk) -> None:
        done = sum(len(r) for r in scored)
        scored.append(score(verifier, chunk.texts, chunk.stopped, answers[done : done + len(chunk.texts)]))
        if report is not None:
            rewards = np.concatenate(scored)
            report(len(rewards), {"pass@1": f"{rewards.mean():.1%}"})

    completions = sample_completions(policy, list(prompts), n, sampling, key, max_chunk_rows, on_chunk=score_chunk)
    rewards = np.concatenate(scored)
    correct = rewards.reshape(len(prompts), n).sum(axis=1)
    return {
        "pass_at_1": mean_pass_at_k(correct, n, 1),
        "pass_at_k": mean_pass_at_k(correct, n, k),
        "k": k,
        "n": n,
        "prompts": len(prompts),
        "tokens": completions.num_tokens,
    }


def greedy_accuracy(policy: LoadedPolicy, verifier: str, prompts, answers, max_new_tokens: int) -> float:
    tokenizer = policy.tokenizer
    sampling = SamplingParams(
        max_new_tokens=max_new_tokens,
        stop_token=tokenizer.eos_id,
        pad_token=tokenizer.pad_id,
        temperature=0.0,
        stop_tokens=tokenizer.stop_ids,
    )
    completions = sample_completions(policy, list(prompts), 1, sampling, jax.random.key(0))
    return float(score(verifier, completions.texts, completions.stopped, list(answers)).mean())


def policy_sample_rewards(policy: LoadedPolicy, verifier: str, sampling, key, workers: int = 1):
    """`sample_rewards(rows, n)` for curation/difficulty.py, sampled by `policy`: batch b samples
    with fold_in(key, b), b counting the calls, so a re-estimate draws the same completions."""
    calls = itertools.count()

    def sample_rewards(rows: pd.DataFrame, n: int) -> np.ndarray:
        completions = sample_completions(
            policy, list(rows["prompt"]), n, sampling, jax.random.fold_in(key, next(calls))
        )
        rewards = score(
            verifier,
            completions.texts,
            completions.stopped,
            [a for a in rows["answer"] for _ in range(n)],
            workers=workers,
        )
        return rewards.reshape(len(rows), n)

    return sample_rewards


def difficulty_sampler(load_policy: Callable[[], LoadedPolicy], verifier: str, sampling, key, workers: int = 1):
    """The `make_sampler()` of curation/curriculum.py: `policy_sample_rewards` with the policy
    `load_policy()` returns, loaded only when an estimate has to be made (not when one is on disk)."""
    return lambda: policy_sample_rewards(load_policy(), verifier, sampling, key, workers)
