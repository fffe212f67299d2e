"""Advantage estimators.

Sequence-level estimators live in `ADVANTAGE_ESTIMATORS`, keyed by name, all with one signature:

    estimator(rewards [groups, G], eps=..., ddof=...) -> advantages [groups, G]

where row g holds the G sampled completions of one prompt. `eps` and `ddof` are accepted by every
estimator (so a config can pass them blindly) and used only by those that divide by a standard
deviation: x / (std + eps), std with `ddof` delta degrees of freedom (1: the sample std, as verl
and TRL; 0: the population std). Every estimator that divides by a std uses this one convention.

Token-level estimators, for rewards that live on tokens (PPO's GAE, REINFORCE++ with or without a
per-token KL reward), live in `PER_TOKEN_ADVANTAGE_ESTIMATORS`, with one signature:

    estimator(rewards [B], mask [B, N], *, group_size, kl=None, kl_coef=0.0, values=None, gamma, lam,
              eps, ddof) -> (advantages [B, N], value targets [B, N] or None)

where `kl` [B, N] (times `kl_coef`) is subtracted from the per-token rewards and `values` are the
critic's (GAE only). The helpers they are made of follow, with the convention that `mask` [B, N]
marks the completion tokens that are actions; masked positions are skipped, never treated as time
steps. An advantage name is in one of the two registries (GAE and REINFORCE++ have only a per-token
form); the config's `algorithm.advantage` accepts the names of both.
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


def std(x: jax.Array, axis=None, ddof: int = 1, weights: jax.Array | None = None, keepdims: bool = False):
    """Standard deviation with `ddof` delta degrees of freedom over the entries where `weights`
    (0/1, default all) is set: sqrt(sum w (x - mean)^2 / (n - ddof)), n = sum w.

    n <= ddof (a single entry with ddof 1) gives 0 rather than NaN: the entries then equal their
    mean, so x - mean is 0 and the normalised advantage is 0, as for a unanimous group.
    """
    w = jnp.ones_like(x) if weights is None else weights.astype(x.dtype)
    n = w.sum(axis=axis, keepdims=True)
    mean = (x * w).sum(axis=axis, keepdims=True) / jnp.maximum(n, 1.0)
    var = (jnp.square(x - mean) * w).sum(axis=axis, keepdims=True) / jnp.maximum(n - ddof, 1.0)
    out = jnp.sqrt(var)
    return out if keepdims else jnp.squeeze(out, axis=axis)


@ADVANTAGE_ESTIMATORS.register("grpo")
def group_normalized_advantages(rewards: jnp.ndarray, eps: float = 1e-4, ddof: int = 1) -> jnp.ndarray:
    """GRPO: (r - mean(group)) / (std(group) + eps) for rewards [groups, group_size].

    ddof=1 (default) is the sample std, as verl (`torch.std`, eps 1e-6) and TRL (eps 1e-4) use;
    ddof=0, the population std, gives advantages smaller by sqrt((G-1)/G) (0.71 at G = 2, 0.94 at
    G = 8). A group whose rewards are all equal gets advantage 0 for every sample.
    """
    mean = rewards.mean(axis=-1, keepdims=True)
    return (rewards - mean) / (std(rewards, axis=-1, ddof=ddof, keepdims=True) + eps)


@ADVANTAGE_ESTIMATORS.register("dr_grpo")
def group_centered_advantages(rewards: jnp.ndarray, eps: float = 1e-4, ddof: int = 1) -> jnp.ndarray:
    """Dr.GRPO: r - mean(group), with no division by the group's std (`eps`, `ddof` unused).

    Dividing by std up-weights prompts that are nearly always solved or nearly always failed
    (a question-difficulty bias); Liu et al. 2025, "Understanding R1-Zero-Like Training".
    """
    del eps, ddof
    return rewards - rewards.mean(axis=-1, keepdims=True)


@ADVANTAGE_ESTIMATORS.register("rloo")
def leave_one_out_advantages(rewards: jnp.ndarray, eps: float = 1e-4, ddof: int = 1) -> jnp.ndarray:
    """RLOO: r_i - mean of the other G-1 rewards of the group (`eps`, `ddof` unused).

    The baseline excludes the sample itself, so it is independent of that sample and the
    estimator stays unbiased (Kool et al. 2019; Ahmadian et al. 2024, "Back to Basics").
    Equals G/(G-1) * (r_i - mean(group)). Needs G >= 2.
    """
    del eps, ddof
    g = rewards.shape[-1]
    if g < 2:
        raise ValueError(f"rloo needs at least 2 samples per group, got {g}")
    baseline = (rewards.sum(axis=-1, keepdims=True) - rewards) / (g - 1)
    return rewards - baseline


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


def masked_whiten(x: jax.Array, mask: jax.Array, eps: float = 1e-4, ddof: int = 1) -> jax.Array:
    """(x - mean) / (std + eps) with the mean and std (`ddof`, as `std`) over the valid entries of
    the whole batch; 0 elsewhere. Each valid token weighs the same, so a sequence weighs as many
    tokens as it has: REINFORCE++'s and PPO's batch normalisation, as in verl and OpenRLHF (which
    divide by sqrt(var + 1e-8), a difference below 1e-4 / std).
    """
    m = mask.astype(jnp.promote_types(x.dtype, jnp.float32))
    mean = (x * m).sum() / jnp.maximum(m.sum(), 1.0)
    return jnp.where(mask.astype(bool), (x - mean) / (std(x, ddof=ddof, weights=m) + eps), 0.0)


@PER_TOKEN_ADVANTAGE_ESTIMATORS.register("gae")
def gae_advantages(
    rewards, mask, *, group_size, kl=None, kl_coef=0.0, values=None, gamma=1.0, lam=0.95, eps=1e-4, ddof=1
):
    """PPO: GAE over the per-token rewards with the critic's values, whitened; the returns are the
    value head's targets."""
    advantages, returns = gae(token_level_rewards(rewards, mask, kl, kl_coef), jnp.asarray(values), mask, gamma, lam)
    return masked_whiten(advantages, mask, eps, ddof), returns


@PER_TOKEN_ADVANTAGE_ESTIMATORS.register("reinforce_pp")
def whitened_token_returns(
    rewards, mask, *, group_size, kl=None, kl_coef=0.0, values=None, gamma=1.0, lam=0.95, eps=1e-4, ddof=1
):
    """REINFORCE++: discounted returns of the per-token rewards (minus kl_coef * KL when the KL is
    in the reward), whitened over the batch's tokens (Hu et al. 2025; verl, OpenRLHF).

    There is no per-prompt group statistic: normalising over the global batch is what makes
    REINFORCE++ robust to prompts whose few samples all agree. With no KL (or kl_coef 0) and
    gamma = 1 every token's return is its sequence's reward, so this whitens the sequence rewards
    with each sequence weighted by its length: one convention with or without a KL in the reward.
    """
    returns = discounted_returns(token_level_rewards(rewards, mask, kl, kl_coef), mask, gamma)
    return masked_whiten(returns, mask, eps, ddof), None


@PER_TOKEN_ADVANTAGE_ESTIMATORS.register("reinforce_pp_baseline")
def group_centered_whitened_token_returns(rewards, mask, *, group_size, **kwargs):
    """REINFORCE++-baseline: sequence rewards minus their group's mean (removing the prompt's
    difficulty), then as `reinforce_pp`: the batch statistics, not the group's std, set the scale,
    which avoids GRPO's blow-up on nearly-unanimous groups (Hu et al. 2025; OpenRLHF
    `reinforce_baseline`, verl `reinforce_plus_plus_baseline`)."""
    grouped = rewards.reshape(-1, group_size)
    centered = (grouped - grouped.mean(-1, keepdims=True)).reshape(-1)
    return whitened_token_returns(centered, mask, group_size=group_size, **kwargs)
