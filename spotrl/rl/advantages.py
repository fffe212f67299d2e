"""Advantage estimators.

Sequence-level estimators live in `ADVANTAGE_ESTIMATORS`, keyed by name, all with one signature:

    estimator(rewards [groups, G], eps=...) -> advantages [groups, G]

where row g holds the G sampled completions of one prompt. `eps` is accepted by every estimator
(so a config can pass it blindly) and used only by those that divide by a standard deviation.

Token-level estimators, for rewards that live on tokens (PPO's GAE, REINFORCE++ with a per-token
KL reward), live in `PER_TOKEN_ADVANTAGE_ESTIMATORS`, with one signature:

    estimator(rewards [B], mask [B, N], *, group_size, kl=None, kl_coef=0.0, values=None, gamma, lam)
        -> (advantages [B, N], value targets [B, N] or None)

where `kl` [B, N] (times `kl_coef`) is subtracted from the per-token rewards and `values` are the
critic's (GAE only). The helpers they are made of follow, with the convention that `mask` [B, N]
marks the completion tokens that are actions; masked positions are skipped, never treated as time
steps. An advantage name is one of either registry ("gae" only has a per-token form); the config's
`algorithm.advantage` accepts the names of both.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from spotrl.registry import Registry
from spotrl.rl.shaping import token_level_rewards

ADVANTAGE_ESTIMATORS: Registry[Callable[..., jnp.ndarray]] = Registry("advantage estimator")
PER_TOKEN_ADVANTAGE_ESTIMATORS: Registry[Callable[..., tuple[jax.Array, jax.Array | None]]] = Registry(
    "per-token advantage estimator"
)


@ADVANTAGE_ESTIMATORS.register("grpo")
def group_normalized_advantages(rewards: jnp.ndarray, eps: float = 1e-4) -> jnp.ndarray:
    """GRPO: (r - mean(group)) / (std(group) + eps) for rewards [groups, group_size].

    The population standard deviation (ddof=0) is used; a group whose rewards are all equal gets
    advantage 0 for every sample.
    """
    mean = rewards.mean(axis=-1, keepdims=True)
    std = rewards.std(axis=-1, keepdims=True)
    return (rewards - mean) / (std + eps)


@ADVANTAGE_ESTIMATORS.register("dr_grpo")
def group_centered_advantages(rewards: jnp.ndarray, eps: float = 1e-4) -> jnp.ndarray:
    """Dr.GRPO: r - mean(group), with no division by the group's std (`eps` is unused).

    Dividing by std up-weights prompts that are nearly always solved or nearly always failed
    (a question-difficulty bias); Liu et al. 2025, "Understanding R1-Zero-Like Training".
    """
    del eps
    return rewards - rewards.mean(axis=-1, keepdims=True)


@ADVANTAGE_ESTIMATORS.register("rloo")
def leave_one_out_advantages(rewards: jnp.ndarray, eps: float = 1e-4) -> jnp.ndarray:
    """RLOO: r_i - mean of the other G-1 rewards of the group (`eps` is unused).

    The baseline excludes the sample itself, so it is independent of that sample and the
    estimator stays unbiased (Kool et al. 2019; Ahmadian et al. 2024, "Back to Basics").
    Equals G/(G-1) * (r_i - mean(group)). Needs G >= 2.
    """
    del eps
    g = rewards.shape[-1]
    if g < 2:
        raise ValueError(f"rloo needs at least 2 samples per group, got {g}")
    baseline = (rewards.sum(axis=-1, keepdims=True) - rewards) / (g - 1)
    return rewards - baseline


@ADVANTAGE_ESTIMATORS.register("reinforce_pp")
def batch_whitened_advantages(rewards: jnp.ndarray, eps: float = 1e-4) -> jnp.ndarray:
    """REINFORCE++: returns whitened over the whole batch, (r - mean(all)) / (std(all) + eps).

    No per-prompt group statistics: normalising over the global batch is what makes REINFORCE++
    robust to prompts whose few samples all agree (Hu et al. 2025, "REINFORCE++").
    With outcome rewards, gamma = 1 and no KL in the reward, every token's return is the sequence
    reward, so this is OpenRLHF's `reinforce` estimator except that OpenRLHF whitens over tokens
    (each sequence weighted by its length) and we weight each sequence once. For the token-level
    variant with a KL reward, use `discounted_returns` and `masked_whiten` below.
    """
    return (rewards - rewards.mean()) / (rewards.std() + eps)


@ADVANTAGE_ESTIMATORS.register("reinforce_pp_baseline")
def group_centered_batch_whitened_advantages(rewards: jnp.ndarray, eps: float = 1e-4) -> jnp.ndarray:
    """REINFORCE++-baseline: subtract the group mean, then whiten over the whole batch.

    The group mean removes the prompt's difficulty; the batch statistics (not the group's std)
    set the scale, which avoids GRPO's blow-up on nearly-unanimous groups (Hu et al. 2025;
    OpenRLHF `reinforce_baseline`).
    """
    centered = rewards - rewards.mean(axis=-1, keepdims=True)
    return (centered - centered.mean()) / (centered.std() + eps)


def gae(
    rewards: jax.Array, values: jax.Array, mask: jax.Array, gamma: float, lam: float
) -> tuple[jax.Array, jax.Array]:
    """Generalised advantage estimation (Schulman et al. 2016) over completion tokens.

    rewards, values, mask: [B, N]. Returns (advantages, returns), both [B, N], 0 where mask is 0.

        delta_t = r_t + gamma * V_{t'} - V_t        (t' = next valid token; V = 0 after the last)
        A_t     = delta_t + gamma * lam * A_{t'}
        R_t     = A_t + V_t                          (the value-head target)

    Masked positions are skipped rather than treated as steps: right padding after the stop token
    then behaves as the end of the episode, and masked tokens inside a row (e.g. tool output in a
    multi-turn rollout) pass the next value and advantage through unchanged (verl's convention).
    Rewards and values at masked positions are ignored, so put a sequence reward on a valid token.
    The outputs are stop-gradient: they are targets, computed from the rollout's old values.
    """
    dtype = jnp.promote_types(jnp.result_type(rewards, values), jnp.float32)
    rewards, values = rewards.astype(dtype), values.astype(dtype)
    valid = mask.astype(bool)

    def step(carry, xs):
        next_value, next_adv = carry
        r, v, m = xs
        adv = r + gamma * next_value - v + gamma * lam * next_adv
        carry = (jnp.where(m, v, next_value), jnp.where(m, adv, next_adv))
        return carry, jnp.where(m, adv, 0.0)

    zeros = jnp.zeros(rewards.shape[0], dtype)
    _, adv_t = jax.lax.scan(step, (zeros, zeros), (rewards.T, values.T, valid.T), reverse=True)
    advantages = adv_t.T
    returns = jnp.where(valid, advantages + values, 0.0)
    return jax.lax.stop_gradient(advantages), jax.lax.stop_gradient(returns)


def discounted_returns(rewards: jax.Array, mask: jax.Array, gamma: float) -> jax.Array:
    """Reward-to-go sum_k gamma^k r_{t+k} over valid tokens, [B, N] (REINFORCE's return).

    This is GAE with V = 0 and lam = 1, so it shares `gae`'s handling of masked positions.
    """
    return gae(rewards, jnp.zeros_like(rewards), mask, gamma, 1.0)[0]


def masked_whiten(x: jax.Array, mask: jax.Array, eps: float = 1e-8) -> jax.Array:
    """(x - mean) / (std + eps) with mean and population std over the valid entries; 0 elsewhere.

    REINFORCE++'s batch normalisation of token-level returns (OpenRLHF normalises over all
    action tokens of the batch the same way).
    """
    m = mask.astype(jnp.promote_types(x.dtype, jnp.float32))
    n = jnp.maximum(m.sum(), 1.0)
    mean = (x * m).sum() / n
    var = (jnp.square(x - mean) * m).sum() / n
    return jnp.where(mask.astype(bool), (x - mean) / (jnp.sqrt(var) + eps), 0.0)


@PER_TOKEN_ADVANTAGE_ESTIMATORS.register("gae")
def gae_advantages(rewards, mask, *, group_size, kl=None, kl_coef=0.0, values=None, gamma=1.0, lam=0.95):
    """PPO: GAE over the per-token rewards with the critic's values, whitened; the returns are the
    value head's targets."""
    advantages, returns = gae(token_level_rewards(rewards, mask, kl, kl_coef), jnp.asarray(values), mask, gamma, lam)
    return masked_whiten(advantages, mask), returns


@PER_TOKEN_ADVANTAGE_ESTIMATORS.register("reinforce_pp")
def whitened_token_returns(rewards, mask, *, group_size, kl=None, kl_coef=0.0, values=None, gamma=1.0, lam=0.95):
    """REINFORCE++ with rewards on tokens: discounted returns, whitened over the batch's tokens."""
    return masked_whiten(discounted_returns(token_level_rewards(rewards, mask, kl, kl_coef), mask, gamma), mask), None


@PER_TOKEN_ADVANTAGE_ESTIMATORS.register("reinforce_pp_baseline")
def group_centered_whitened_token_returns(rewards, mask, *, group_size, **kwargs):
    """REINFORCE++-baseline with rewards on tokens: sequence rewards minus their group's mean, then
    as `reinforce_pp`."""
    grouped = rewards.reshape(-1, group_size)
    centered = (grouped - grouped.mean(-1, keepdims=True)).reshape(-1)
    return whitened_token_returns(centered, mask, group_size=group_size, **kwargs)
