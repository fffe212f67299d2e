"""Reward shaping and batch filtering from DAPO, plus placing rewards on tokens.

Pure functions on arrays of rollout lengths and rewards; they work on numpy or jax inputs and
return jax arrays.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def overlong_penalty(lengths: jax.Array, max_len: int, cache_len: int, penalty: float = 1.0) -> jax.Array:
    """DAPO's soft overlong punishment, in tokens (Yu et al. 2025, sec. 3.4), scaled by `penalty`.

        0                                           if L <= max_len - cache_len
        penalty * ((max_len - cache_len) - L) / cache_len   in the band (max_len - cache_len, max_len]
        -penalty                                    if L > max_len

    The linear ramp reaches -penalty exactly at L = max_len, so a completion cut off at the
    generation budget gets the full penalty. A hard cut-off (truncated = wrong) would punish
    sound but long reasoning; the band gives a graded signal instead. With cache_len = 0 there is
    no band and the penalty is -penalty from L = max_len on (the limit of the ramp).
    The result is added to the task reward: `rewards + overlong_penalty(lengths, ...)`.
    """
    if not 0 <= cache_len <= max_len:
        raise ValueError(f"need 0 <= cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}")
    lengths = jnp.asarray(lengths, jnp.float32)
    if cache_len == 0:
        excess = (lengths >= max_len).astype(jnp.float32)
    else:
        excess = jnp.clip((lengths - (max_len - cache_len)) / cache_len, 0.0, 1.0)
    return -penalty * excess


def groups_with_signal(rewards: jax.Array, atol: float = 0.0) -> jax.Array:
    """bool [groups]: True where a group's rewards are not all equal (max - min > atol).

    A group whose samples all got the same reward has zero group-relative advantage, so it adds
    no gradient, only noise to the batch size; DAPO's dynamic sampling drops such groups and
    samples more prompts until the batch is full (Yu et al. 2025, sec. 3.2).
    """
    rewards = jnp.asarray(rewards)
    return (rewards.max(axis=-1) - rewards.min(axis=-1)) > atol


def token_level_rewards(
    rewards: jax.Array, mask: jax.Array, kl: jax.Array | None = None, kl_coef: float = 0.0
) -> jax.Array:
    """Per-token rewards [B, N]: each sequence reward [B] on its last valid token, minus
    kl_coef * kl [B, N] on every valid token ("KL in the reward", as in InstructGPT-style PPO and
    REINFORCE++); 0 on masked tokens. Feed the result to `advantages.gae` or
    `advantages.discounted_returns`. A row without valid tokens gets no reward.
    """
    valid = jnp.asarray(mask).astype(bool)
    n = valid.shape[-1]
    last = n - 1 - jnp.argmax(valid[:, ::-1], axis=-1)  # index of the last valid token
    at_last = (jnp.arange(n)[None, :] == last[:, None]) & valid.any(axis=-1, keepdims=True)
    out = jnp.where(at_last, jnp.asarray(rewards, jnp.float32)[:, None], 0.0)
    if kl is not None:
        out = out - kl_coef * jnp.where(valid, kl, 0.0)
    return out


def fill_batch_with_signal(grouped_rewards, target: int) -> tuple[list[int], int]:
    """DAPO's dynamic sampling: the first `target` groups (in generation order) that have signal.

    grouped_rewards [groups, G] in the order they were generated. Returns (indices of the kept
    groups, number of groups dropped for having no signal). Fewer than `target` are returned
    when not enough groups had signal.
    """
    has_signal = jax.device_get(groups_with_signal(grouped_rewards))
    kept = [i for i, ok in enumerate(has_signal) if ok][:target]
    return kept, int((~has_signal).sum())


def shaped_rewards(task_reward, lengths, overlong, max_new_tokens: int):
    """The reward trained on: `task_reward` (a float Series) plus, when `overlong.enabled`, the
    overlong penalty (float64; the budget is `overlong.max_tokens`, or the generation budget)."""
    if not overlong.enabled:
        return task_reward
    max_tokens = overlong.max_tokens or max_new_tokens
    penalty = overlong_penalty(np.asarray(lengths), max_tokens, overlong.cache_tokens, overlong.penalty)
    return task_reward + np.asarray(penalty, np.float64)


def reward_summary(frame, group_size: int) -> dict:
    """Sums over a scored rollout shard (columns task_reward, reward, length) and its groups with signal."""
    grouped = frame["reward"].to_numpy().reshape(-1, group_size)
    return {
        "reward_sum": float(frame["task_reward"].sum()),
        "shaped_reward_sum": float(frame["reward"].sum()),
        "length_sum": int(frame["length"].sum()),
        "groups": len(grouped),
        "groups_with_signal": int(np.asarray(groups_with_signal(grouped)).sum()),
    }
