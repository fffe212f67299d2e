"""One RL update over a batch of scored group rollouts: advantages, then minibatched clipped steps."""

from __future__ import annotations

import jax
import numpy as np

from spotrl.model import sequences
from spotrl.model.advantages import ADVANTAGE_ESTIMATORS
from spotrl.model.train_step import RLBatch


def policy_update(step_fn, state, opt_state, *, prompt_tokens, prompt_valid, tokens, lengths, old_logprobs,
                  rewards, group_size: int, estimator: str, advantage_eps: float, minibatches: int,
                  epochs: int, rng: np.random.Generator):
    """Returns (state, opt_state, metrics averaged over the optimizer steps)."""
    rewards = np.asarray(rewards, np.float32)
    advantages = np.asarray(
        ADVANTAGE_ESTIMATORS[estimator](rewards.reshape(-1, group_size), eps=advantage_eps)
    ).reshape(-1)
    all_tokens, all_valid = sequences.join(prompt_tokens, prompt_valid, tokens, lengths)
    rows = len(rewards)
    size = rows // minibatches
    history = []
    for _ in range(epochs):
        order = rng.permutation(rows)
        for m in range(minibatches):
            take = order[m * size : (m + 1) * size]
            batch = RLBatch(all_tokens[take], all_valid[take], np.asarray(old_logprobs)[take], advantages[take])
            state, opt_state, metrics = step_fn(state, opt_state, batch)
            history.append(metrics)
    history = jax.device_get(history)
    summary = {k: float(np.mean([h[k] for h in history])) for k in history[0]}
    summary.update(
        advantage_mean=float(advantages.mean()),
        advantage_std=float(advantages.std()),
        groups_with_signal=float((rewards.reshape(-1, group_size).std(axis=1) > 0).mean()),
        optimizer_steps=len(history),
    )
    return state, opt_state, summary
