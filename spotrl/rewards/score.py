"""Scoring completions with a task's verifier."""

from __future__ import annotations

import numpy as np

from spotrl.rewards.verifiers import get_verifier


def score(task: str, completions: list[str], stopped, answers: list[str]) -> np.ndarray:
    if not len(completions) == len(stopped) == len(answers):
        raise ValueError(f"lengths differ: {len(completions)} completions, {len(stopped)} flags, {len(answers)} answers")
    verify = get_verifier(task)
    return np.array([verify(c, bool(s), a) for c, s, a in zip(completions, stopped, answers)], np.float32)
