"""Policy losses: PPO-style clipped surrogate on token logprobs, aggregated over valid tokens."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def token_logprobs(logits: jax.Array, targets: jax.Array, temperature: float = 1.0) -> jax.Array:
    """log softmax(logits / temperature) at targets; logits [..., V], targets [...]."""
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    logp = jax.nn.log_softmax(logits, axis=-1)
    return jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]


def clipped_policy_loss(
    logprobs: jax.Array,
    old_logprobs: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    clip_eps: float,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Token-mean PPO clipped surrogate.

    logprobs, old_logprobs, mask: [B, N] per completion token; advantages: [B], one per sequence.
    loss = -sum_t mask * min(r A, clip(r, 1-eps, 1+eps) A) / sum_t mask, with r = exp(logp - old).
    """
    mask = mask.astype(jnp.float32)
    ratio = jnp.exp(logprobs - old_logprobs)
    adv = advantages[:, None]
    unclipped = ratio * adv
    clipped = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv
    per_token = -jnp.minimum(unclipped, clipped)
    denom = jnp.maximum(mask.sum(), 1.0)
    loss = (per_token * mask).sum() / denom
    clip_active = (clipped < unclipped).astype(jnp.float32)  # the min chose the clipped branch
    metrics = {
        "clip_frac": (clip_active * mask).sum() / denom,
        "ratio_mean": (ratio * mask).sum() / denom,
        "approx_kl": ((old_logprobs - logprobs) * mask).sum() / denom,
    }
    return loss, metrics
