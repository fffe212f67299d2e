"""One RL update over a batch of scored group rollouts: advantages, then minibatched steps.

Advantages come from one of two families:
  - sequence-level estimators from `ADVANTAGE_ESTIMATORS` on the [groups, G] rewards (GRPO,
    Dr.GRPO, RLOO);
  - per-token returns when rewards live on tokens: GAE with the critic's values (PPO), or
    batch-whitened discounted returns (REINFORCE++, with or without KL in the reward).
Rows past `real_rows` are padding (a dynamic-sampling batch that could not be filled): advantage 0,
no valid completion token, so they add nothing and the step keeps one compiled shape.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from spotrl.model import sequences
from spotrl.rl.advantages import ADVANTAGE_ESTIMATORS, PER_TOKEN_ADVANTAGE_ESTIMATORS
from spotrl.rl.losses import KL_ESTIMATORS
from spotrl.rl.train_step import RLBatch


@dataclasses.dataclass(frozen=True)
class AdvantageSpec:
    estimator: str  # a name in ADVANTAGE_ESTIMATORS or PER_TOKEN_ADVANTAGE_ESTIMATORS
    group_size: int
    eps: float = 1e-4
    ddof: int = 1  # of every std an advantage is divided by: 1 the sample std, 0 the population std
    kl_in_reward_coef: float = 0.0  # > 0: rewards go on tokens, minus coef * KL(behaviour || reference)
    kl_estimator: str = "k1"
    gamma: float = 1.0
    lam: float = 0.95

    @property
    def per_token(self) -> bool:
        """Rewards on tokens: KL in the reward, or an estimator with only a per-token form (GAE)."""
        return self.kl_in_reward_coef > 0 or self.estimator not in ADVANTAGE_ESTIMATORS


def advantage_spec(algorithm, group_size: int) -> AdvantageSpec:
    """The AdvantageSpec an `AlgorithmConfig` asks for."""
    a = algorithm
    return AdvantageSpec(
        estimator=a.advantage,
        group_size=group_size,
        eps=a.advantage_eps,
        ddof={"sample": 1, "population": 0}[a.advantage_std],
        kl_in_reward_coef=a.kl.coef if a.kl.in_reward else 0.0,
        kl_estimator=a.kl.estimator,
        gamma=a.value.gamma,
        lam=a.value.lam,
    )


def compute_advantages(spec: AdvantageSpec, rewards, mask, old_logprobs=None, ref_logprobs=None, old_values=None):
    """Advantages ([B] or [B, N]) and value targets ([B, N], or None without a critic)."""
    rewards = jnp.asarray(rewards, jnp.float32)
    if spec.estimator not in ADVANTAGE_ESTIMATORS and spec.estimator not in PER_TOKEN_ADVANTAGE_ESTIMATORS:
        raise ValueError(
            f"no advantage estimator {spec.estimator!r}; known: "
            f"{sorted(ADVANTAGE_ESTIMATORS.names() + PER_TOKEN_ADVANTAGE_ESTIMATORS.names())}"
        )
    if not spec.per_token:
        grouped = rewards.reshape(-1, spec.group_size)
        return ADVANTAGE_ESTIMATORS[spec.estimator](grouped, eps=spec.eps, ddof=spec.ddof).reshape(-1), None
    if spec.estimator not in PER_TOKEN_ADVANTAGE_ESTIMATORS:
        raise ValueError(
            f"advantage {spec.estimator!r} has no per-token form (KL in the reward needs one of "
            f"{PER_TOKEN_ADVANTAGE_ESTIMATORS.names()})"
        )
    kl = None
    if spec.kl_in_reward_coef > 0:
        kl = KL_ESTIMATORS[spec.kl_estimator](jnp.asarray(old_logprobs), jnp.asarray(ref_logprobs))
    return PER_TOKEN_ADVANTAGE_ESTIMATORS[spec.estimator](
        rewards,
        mask,
        group_size=spec.group_size,
        kl=kl,
        kl_coef=spec.kl_in_reward_coef,
        values=old_values,
        gamma=spec.gamma,
        lam=spec.lam,
        eps=spec.eps,
        ddof=spec.ddof,
    )


@dataclasses.dataclass(frozen=True)
class UpdateBatch:
    """The arrays of one update, row r of each belonging together: what `policy_update` turns into
    advantages and minibatches. Not rl/batch.py's TrainingBatch (the chosen rollout rows, as a
    frame) nor train_step's RLBatch (one minibatch's arrays as the jitted step takes them).

    Rows past `real_rows` (default: all rows are real) are padding.
    """

    prompt_tokens: np.ndarray  # [B, P] left-padded prompts
    prompt_valid: np.ndarray  # [B, P]
    tokens: np.ndarray  # [B, N] completions
    lengths: np.ndarray  # [B] completion lengths
    old_logprobs: np.ndarray  # [B, N] the logprobs the ratio is taken against
    rewards: np.ndarray  # [B] one per completion, `group_size` consecutive rows per prompt
    real_rows: int | None = None
    ref_logprobs: np.ndarray | None = None  # [B, N] the KL reference policy's
    old_values: np.ndarray | None = None  # [B, N] the critic's values at sampling time (PPO)
    behaviour_weights: np.ndarray | None = None  # [B, N] truncated importance weights for stale rollouts


def policy_update(
    step_fn,
    state: dict,
    batch: UpdateBatch,
    spec: AdvantageSpec,
    *,
    minibatches: int,
    epochs: int,
    rng: np.random.Generator,
):
    """Returns (train state, metrics averaged over the optimizer steps)."""
    rows = len(batch.rewards)
    real_rows = rows if batch.real_rows is None else batch.real_rows
    lengths = np.where(np.arange(rows) < real_rows, batch.lengths, 0)  # padding rows: no valid completion token
    width = np.asarray(batch.tokens).shape[1]
    mask = sequences.completion_mask(lengths, width)
    rewards = np.asarray(batch.rewards, np.float32)

    take_real = lambda x: None if x is None else np.asarray(x)[:real_rows]  # noqa: E731
    advantages, returns = compute_advantages(
        spec,
        rewards[:real_rows],
        mask[:real_rows],
        take_real(batch.old_logprobs),
        take_real(batch.ref_logprobs),
        take_real(batch.old_values),
    )
    advantages = _pad_rows(np.asarray(advantages), rows)
    returns = None if returns is None else _pad_rows(np.asarray(returns), rows)

    all_tokens, all_valid = sequences.join(batch.prompt_tokens, batch.prompt_valid, batch.tokens, lengths)
    size = rows // minibatches
    history = []
    for _ in range(epochs):
        order = rng.permutation(rows)
        for m in range(minibatches):
            take = order[m * size : (m + 1) * size]

            def pick(x, take=take):
                return None if x is None else np.asarray(x)[take]

            minibatch = RLBatch(
                all_tokens[take],
                all_valid[take],
                pick(batch.old_logprobs),
                advantages[take],
                ref_logprobs=pick(batch.ref_logprobs),
                old_values=pick(batch.old_values),
                returns=pick(returns),
                behaviour_weights=pick(batch.behaviour_weights),
            )
            state, metrics = step_fn(state, minibatch)
            history.append(metrics)
    history = jax.device_get(history)
    summary = {k: float(np.mean([h[k] for h in history])) for k in history[0]}
    real_adv = advantages[:real_rows][mask[:real_rows]] if advantages.ndim == 2 else advantages[:real_rows]
    summary.update(
        advantage_mean=float(real_adv.mean()) if real_adv.size else 0.0,
        advantage_std=float(real_adv.std()) if real_adv.size else 0.0,
        advantage_abs_max=float(np.abs(real_adv).max()) if real_adv.size else 0.0,
        groups_with_signal=float((rewards[:real_rows].reshape(-1, spec.group_size).std(axis=1) > 0).mean()),
        optimizer_steps=len(history),
    )
    return state, summary


def _pad_rows(x: np.ndarray, rows: int) -> np.ndarray:
    if len(x) == rows:
        return x
    return np.concatenate([x, np.zeros((rows - len(x), *x.shape[1:]), x.dtype)])
