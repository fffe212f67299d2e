"""Scoring completions with a verifier (the one a problem names)."""

from __future__ import annotations

import concurrent.futures

import numpy as np

from spotrl.rewards.verifiers import get_verifier


def score(verifier: str, completions: list[str], stopped, answers: list[str], workers: int = 1) -> np.ndarray:
    """The verifier (a name in VERIFIERS) over every completion, in order; over a pool of `workers` threads when > 1
    (for verifiers that wait on other processes, like the code sandbox). An exception of a
    verifier (a sandbox failure) propagates: nothing is scored 0 for it."""
    if not len(completions) == len(stopped) == len(answers):
        raise ValueError(
            f"lengths differ: {len(completions)} completions, {len(stopped)} flags, {len(answers)} answers"
        )
    verify = get_verifier(verifier)
    items = list(zip(completions, (bool(s) for s in stopped), answers))
    if workers <= 1 or len(items) <= 1:
        return np.array([verify(*item) for item in items], np.float32)
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        return np.array(list(pool.map(lambda item: verify(*item), items)), np.float32)
