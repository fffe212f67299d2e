"""Policy and value losses for RL post-training, built from one template.

GRPO, Dr.GRPO, DAPO, RLOO, REINFORCE++, GSPO and PPO differ only in a few choices, each a field
of the `LossSpec` that `policy_loss` takes:

    ratio_level   "token" (PPO/GRPO) or "sequence" (GSPO's length-normalised sequence ratio)
    clip_low/high asymmetric clip range (DAPO's clip-higher); equal values give PPO's clip
    dual_clip     lower bound c * A on the objective for negative advantages (Ye et al. 2020); 3 by
                  default as in verl, None turns it off
    aggregation   how per-token terms become one scalar (a name in `LOSS_AGGREGATIONS`)
    kl_estimator  k1/k2/k3 penalty to a frozen reference policy (a name in `KL_ESTIMATORS`)
    entropy_coef  entropy bonus

All functions are pure and jit-able; string and `None` options are Python values fixed at trace
time. Shapes: logprobs-like arrays and `mask` are [B, N] over completion tokens (mask 1 for real
tokens), advantages are [B] (one per sequence) or [B, N] (one per token).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from spotrl.registry import Registry


def tempered_log_softmax(logits: jax.Array, temperature: float = 1.0) -> jax.Array:
    """log softmax(logits / temperature) over the last axis: the distribution the sampler draws
    from. Temperature 0 (greedy sampling) has no such distribution and keeps the logits as they are."""
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    return jax.nn.log_softmax(logits, axis=-1)


def token_logprobs(logits: jax.Array, targets: jax.Array, temperature: float = 1.0) -> jax.Array:
    """log softmax(logits / temperature) at targets; logits [..., V], targets [...]."""
    logp = tempered_log_softmax(logits, temperature)
    return jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]


def token_entropy(logits: jax.Array, temperature: float = 1.0) -> jax.Array:
    """Entropy [...] of softmax(logits / temperature), logits [..., V]: the same tempered
    distribution as `token_logprobs` and the sampler's, for the entropy metric and bonus."""
    logp = tempered_log_softmax(logits, temperature)
    return -(jnp.exp(logp) * logp).sum(-1)


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of x over the entries where mask is set; 0 (not NaN) when none is.

    Masked entries are selected away, not multiplied by 0, so inf/NaN there cannot leak in.
    """
    valid = mask.astype(bool)
    return jnp.where(valid, x, 0.0).sum() / jnp.maximum(valid.sum(), 1).astype(x.dtype)


# --- KL estimators ------------------------------------------------------------------------------
# Per-token estimators of KL(pi || pi_ref) from samples of pi, with d = log pi_ref - log pi
# (Schulman, "Approximating KL Divergence", 2020). Each takes (logprobs, ref_logprobs) -> [B, N].

# verl's bounds: exp() of a log ratio past 20 overflows float16 and makes one token's gradient
# dwarf the batch's; a clamped term has no gradient, like a clipped one.
LOG_RATIO_CLAMP = 20.0
K3_CLAMP = 10.0

KL_ESTIMATORS: Registry[Callable[[jax.Array, jax.Array], jax.Array]] = Registry("KL estimator")


@KL_ESTIMATORS.register("k1")
def kl_k1(logprobs: jax.Array, ref_logprobs: jax.Array) -> jax.Array:
    """k1 = log pi - log pi_ref = -d: unbiased, high variance, can be negative per token."""
    return logprobs - ref_logprobs


@KL_ESTIMATORS.register("k2")
def kl_k2(logprobs: jax.Array, ref_logprobs: jax.Array) -> jax.Array:
    """k2 = d^2 / 2: biased value but non-negative and low variance; used as a loss (samples held
    fixed) its expected gradient is exactly that of KL(pi || pi_ref) (Tang & Munos 2025)."""
    return 0.5 * jnp.square(logprobs - ref_logprobs)


@KL_ESTIMATORS.register("k3")
def kl_k3(logprobs: jax.Array, ref_logprobs: jax.Array) -> jax.Array:
    """k3 = exp(d) - d - 1: unbiased value and non-negative (GRPO's estimator, Shao et al. 2024);
    used as a loss its expected gradient is that of the forward KL(pi_ref || pi) instead.
    As in verl, d is clamped to [-20, 20] before the exp and k3 to [-10, 10] after it."""
    d = jnp.clip(ref_logprobs - logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return jnp.clip(jnp.exp(d) - d - 1.0, -K3_CLAMP, K3_CLAMP)


# --- Aggregations -------------------------------------------------------------------------------
# Each takes (per_token [B, N], mask [B, N] float, norm_constant) -> scalar. Rows without any valid
# token (e.g. padding rows of a partly filled batch) are left out of per-sequence means.

LOSS_AGGREGATIONS: Registry[Callable[[jax.Array, jax.Array, float | None], jax.Array]] = Registry("loss aggregation")


def _masked_sum(per_token: jax.Array, mask: jax.Array) -> jax.Array:
    return jnp.where(mask.astype(bool), per_token, 0.0).sum(axis=-1)


def _mean_over_nonempty_rows(per_sequence: jax.Array, mask: jax.Array) -> jax.Array:
    nonempty = (mask.sum(axis=-1) > 0).astype(per_sequence.dtype)
    return (per_sequence * nonempty).sum() / jnp.maximum(nonempty.sum(), 1.0)


@LOSS_AGGREGATIONS.register("token_mean")
def token_mean(per_token: jax.Array, mask: jax.Array, norm_constant: float | None = None) -> jax.Array:
    """Mean over every valid token of the batch: each token weighs the same, so long sequences
    are not down-weighted (DAPO's token-level loss, Yu et al. 2025, sec. 3.3)."""
    del norm_constant
    return masked_mean(per_token, mask)


@LOSS_AGGREGATIONS.register("seq_mean_token_mean")
def seq_mean_token_mean(per_token: jax.Array, mask: jax.Array, norm_constant: float | None = None) -> jax.Array:
    """Mean over sequences of each sequence's token-mean: each sequence weighs the same
    (the original GRPO objective, Shao et al. 2024; GSPO's sequence-level objective)."""
    del norm_constant
    per_sequence = _masked_sum(per_token, mask) / jnp.maximum(mask.sum(axis=-1), 1.0)
    return _mean_over_nonempty_rows(per_sequence, mask)


@LOSS_AGGREGATIONS.register("seq_mean_token_sum_norm")
def seq_mean_token_sum_norm(per_token: jax.Array, mask: jax.Array, norm_constant: float | None = None) -> jax.Array:
    """Sum over every valid token of the batch divided by a constant (default N, the generation
    budget): verl's `seq-mean-token-sum-norm`, which, despite the name, sums over sequences.
    Dividing by a constant instead of the sequence's own length removes GRPO's length bias, which
    favours long wrong answers (Dr.GRPO, Liu et al. 2025). TRL's `dr_grpo` also divides by the
    number of sequences B, a B times smaller loss (and gradient) for the same batch."""
    if norm_constant is None:
        norm_constant = per_token.shape[-1]
    return _masked_sum(per_token, mask).sum() / norm_constant


# --- Policy loss ----------------------------------------------------------------------------------


def importance_log_ratio(
    logprobs: jax.Array, old_logprobs: jax.Array, mask: jax.Array, ratio_level: str = "token"
) -> jax.Array:
    """log of the importance ratio pi/pi_old, [B, N]; 0 at masked tokens.

    "token":    log pi(y_t) - log pi_old(y_t)                            (PPO, GRPO, DAPO)
    "sequence": mean over the sequence's valid tokens of the token log ratios, broadcast to
                every token, i.e. log s_i with s_i = (pi(y_i) / pi_old(y_i))^(1/|y_i|) (GSPO,
                Zheng et al. 2025). The gradient flows through s_i itself, so each token
                gets s_i * A_i / |y_i| * grad log pi(y_t); with per-sequence advantages this
                equals GSPO-token's gradient, with per-token advantages it is plain GSPO.
    Masking happens before the exp, so garbage logprobs on padding can never overflow to inf, and
    the result is clamped to [-20, 20] (verl's bound), so exp() of it stays finite in float32.
    """
    valid = mask.astype(bool)
    log_ratio = jnp.where(valid, logprobs - old_logprobs, 0.0)
    if ratio_level == "token":
        return jnp.clip(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    if ratio_level == "sequence":
        lengths = jnp.maximum(valid.sum(axis=-1, keepdims=True), 1)
        per_sequence = jnp.clip(log_ratio.sum(axis=-1, keepdims=True) / lengths, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return jnp.where(valid, jnp.broadcast_to(per_sequence, log_ratio.shape), 0.0)
    raise ValueError(f"ratio_level must be 'token' or 'sequence', got {ratio_level!r}")


RATIO_LEVELS = ("token", "sequence")


@dataclasses.dataclass(frozen=True)
class LossSpec:
    """The loss template's choices (see `policy_loss`); hashable, fixed at trace time.

    Checked at construction: dual_clip > 1, norm_constant only with 'seq_mean_token_sum_norm', a
    known ratio_level. An aggregation's name is looked up where the loss is built (the train step
    names the ones micro-batching cannot weight). value_coef and value_clip are the value loss's
    (the train step's, with a critic), not policy_loss's.
    """

    ratio_level: str = "token"
    clip_low: float = 0.2
    clip_high: float | None = 0.2  # None: clip_low, the symmetric PPO clip
    dual_clip: float | None = 3.0
    aggregation: str = "token_mean"
    norm_constant: float | None = None
    kl_coef: float = 0.0  # KL penalty in the loss (0 when there is none, or it is in the reward)
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    value_coef: float = 0.0  # with a critic
    value_clip: float | None = None

    def __post_init__(self):
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {self.dual_clip}")
        if self.norm_constant is not None and self.aggregation != "seq_mean_token_sum_norm":
            raise ValueError(f"norm_constant is only used by 'seq_mean_token_sum_norm', not {self.aggregation!r}")
        if self.ratio_level not in RATIO_LEVELS:
            raise ValueError(f"ratio_level must be 'token' or 'sequence', got {self.ratio_level!r}")


def policy_loss(
    logprobs: jax.Array,
    old_logprobs: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    spec: LossSpec = LossSpec(),
    *,
    ref_logprobs: jax.Array | None = None,
    entropy: jax.Array | None = None,
    behaviour_weights: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The clipped-surrogate template of `spec`'s choices; returns (loss to minimise, metrics).

    behaviour_weights [B, N]: truncated importance weights min(pi_prox / pi_behaviour, cap) for
    rollouts sampled by older weights (decoupled PPO: `old_logprobs` are then the trainer's own
    recomputed "proximal" logprobs); they scale the surrogate and carry no gradient.

    Per token, with r the importance ratio of `ratio_level` and A the advantage:

        surrogate = min(r A, clip(r, 1 - clip_low, 1 + clip_high) A)
        surrogate = max(surrogate, dual_clip * A)        where A < 0, if dual_clip is set
        loss_t    = -surrogate + kl_coef * KL_t - entropy_coef * H_t

    and the loss is `aggregation` of loss_t over the valid tokens. `clip_high=None` means
    `clip_low` (symmetric PPO clip); DAPO uses clip_low=0.2, clip_high=0.28 so that unlikely
    tokens with A > 0 can still grow. The dual clip bounds the loss of a negative-advantage token
    whose ratio has exploded (ratio > c); it needs c > 1 (default 3, verl's; None: off).

    ref_logprobs [B, N]: frozen reference policy, for the KL penalty in the loss (GRPO's k3 by
    default; needed when spec.kl_coef is set). entropy [B, N]: per-token entropies of the current
    policy, for the bonus (needed when spec.entropy_coef is set).

    Metrics (token means over valid tokens):
      pg_loss          the aggregated clipped-surrogate term alone
      clip_frac_low    share of tokens where the lower bound is active and chosen (A < 0, r < 1-lo)
      clip_frac_high   same for the upper bound (A > 0, r > 1+hi)
      clip_frac        their sum
      dual_clip_frac   share where the dual clip is active (only if dual_clip is set)
      ratio_mean       mean importance ratio (the broadcast sequence ratio for "sequence")
      approx_kl        KL(pi_old || pi) by k3 on the token ratios: >= 0, low variance
      kl, entropy      token means of the KL estimate and the entropy, when given
    """
    clip_low, dual_clip, norm_constant = spec.clip_low, spec.dual_clip, spec.norm_constant
    clip_high = clip_low if spec.clip_high is None else spec.clip_high
    if spec.kl_coef and ref_logprobs is None:
        raise ValueError("kl_coef is set but no ref_logprobs were given")
    if spec.entropy_coef and entropy is None:
        raise ValueError("entropy_coef is set but no entropy was given")
    aggregate = LOSS_AGGREGATIONS[spec.aggregation]

    dtype = jnp.promote_types(logprobs.dtype, jnp.float32)
    logprobs, old_logprobs = logprobs.astype(dtype), old_logprobs.astype(dtype)
    valid = mask.astype(bool)
    m = valid.astype(dtype)
    adv = advantages.astype(dtype)
    adv = jnp.broadcast_to(adv[:, None] if adv.ndim == 1 else adv, logprobs.shape)

    ratio = jnp.exp(importance_log_ratio(logprobs, old_logprobs, valid, spec.ratio_level))
    unclipped = ratio * adv
    clipped = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    surrogate = jnp.minimum(unclipped, clipped)
    clip_chosen = clipped < unclipped  # the min picked the clipped branch: its gradient is 0
    metrics = {
        "clip_frac_low": masked_mean((clip_chosen & (ratio < 1.0)).astype(dtype), m),
        "clip_frac_high": masked_mean((clip_chosen & (ratio > 1.0)).astype(dtype), m),
    }
    metrics["clip_frac"] = metrics["clip_frac_low"] + metrics["clip_frac_high"]
    if dual_clip is not None:
        floor = dual_clip * adv
        dual_active = (adv < 0) & (floor > surrogate)
        surrogate = jnp.where(dual_active, floor, surrogate)
        metrics["dual_clip_frac"] = masked_mean(dual_active.astype(dtype), m)

    if behaviour_weights is not None:
        surrogate = surrogate * jax.lax.stop_gradient(behaviour_weights.astype(dtype))
    per_token = -surrogate
    metrics["pg_loss"] = aggregate(per_token, m, norm_constant)
    if ref_logprobs is not None:
        ref_logprobs = jnp.where(valid, ref_logprobs.astype(dtype), logprobs)  # KL 0 on padding
        kl = KL_ESTIMATORS[spec.kl_estimator](logprobs, ref_logprobs)
        metrics["kl"] = masked_mean(kl, m)
        per_token = per_token + spec.kl_coef * kl
    if entropy is not None:
        entropy = entropy.astype(dtype)
        metrics["entropy"] = masked_mean(entropy, m)
        per_token = per_token - spec.entropy_coef * entropy
    loss = aggregate(per_token, m, norm_constant)

    metrics["ratio_mean"] = masked_mean(ratio, m)
    # k3 for KL(pi_old || pi) from samples of pi_old: (r - 1) - log r with r = pi / pi_old
    metrics["approx_kl"] = masked_mean(kl_k3(jnp.where(valid, old_logprobs, logprobs), logprobs), m)
    return loss, metrics


def clipped_policy_loss(
    logprobs: jax.Array,
    old_logprobs: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    clip_eps: float,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Token-mean PPO clipped surrogate: `policy_loss` with token ratios, a symmetric clip and no
    dual clip.

    logprobs, old_logprobs, mask: [B, N] per completion token; advantages: [B], one per sequence.
    loss = -sum_t mask * min(r A, clip(r, 1-eps, 1+eps) A) / sum_t mask, with r = exp(logp - old).
    """
    return policy_loss(
        logprobs,
        old_logprobs,
        advantages,
        mask,
        LossSpec(ratio_level="token", clip_low=clip_eps, clip_high=clip_eps, dual_clip=None, aggregation="token_mean"),
    )


# --- Value loss (PPO) ---------------------------------------------------------------------------


def value_loss(
    values: jax.Array,
    old_values: jax.Array,
    returns: jax.Array,
    mask: jax.Array,
    clip: float | None = 0.2,
    aggregation: str = "token_mean",
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """PPO's clipped value loss; returns (loss, metrics).

        v_clip = old + clip(v - old, -clip, clip)
        loss_t = 0.5 * max((v - R)^2, (v_clip - R)^2)

    Taking the max keeps the value head from moving further than `clip` from the rollout's
    values in one update (OpenAI baselines ppo2, verl, OpenRLHF). `clip=None` or 0 gives the
    plain 0.5 (v - R)^2. Metrics: value_clip_frac (share of tokens where the clipped term is
    larger) and value_mean.
    """
    dtype = jnp.promote_types(values.dtype, jnp.float32)
    values, old_values, returns = values.astype(dtype), old_values.astype(dtype), returns.astype(dtype)
    m = mask.astype(dtype)
    unclipped = jnp.square(values - returns)
    if clip:
        v_clipped = old_values + jnp.clip(values - old_values, -clip, clip)
        clipped = jnp.square(v_clipped - returns)
        per_token = 0.5 * jnp.maximum(unclipped, clipped)
        clip_frac = masked_mean((clipped > unclipped).astype(dtype), m)
    else:
        per_token = 0.5 * unclipped
        clip_frac = jnp.zeros((), dtype)
    loss = LOSS_AGGREGATIONS[aggregation](per_token, m, None)
    return loss, {"value_clip_frac": clip_frac, "value_mean": masked_mean(values, m)}


def explained_variance(values: jax.Array, returns: jax.Array, mask: jax.Array) -> jax.Array:
    """1 - Var[R - V] / Var[R] over valid tokens: 1 is a perfect value head, 0 is no better than
    predicting the mean, < 0 is worse. NaN when the returns have no variance (as in baselines)."""
    m = mask.astype(jnp.promote_types(values.dtype, jnp.float32))

    def var(x):
        mean = masked_mean(x, m)
        return masked_mean(jnp.square(x - mean), m)

    var_returns = var(returns)
    return jnp.where(
        var_returns > 0, 1.0 - var(returns - values) / jnp.where(var_returns > 0, var_returns, 1.0), jnp.nan
    )
