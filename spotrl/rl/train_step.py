"""Jit-compiled train steps: the RL policy-gradient step and the supervised warm-start step.

Parameters and optimizer state are donated, so each step updates them in place on the device.
Steps are built once per (graph, optimizer, hyper-parameters) and reused across iterations.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from spotrl.model import sharding
from spotrl.model.transformer import forward
from spotrl.rl.losses import LossSpec, explained_variance, policy_loss, token_entropy, token_logprobs, value_loss


class RLBatch(NamedTuple):
    tokens: jax.Array  # [B, P+N] left-padded prompt followed by the completion
    valid: jax.Array  # [B, P+N] real prompt tokens and completion tokens up to the stop token
    old_logprobs: jax.Array  # [B, N] behaviour logprobs from the sampler
    advantages: jax.Array  # [B] one per sequence, or [B, N] one per token
    ref_logprobs: jax.Array | None = None  # [B, N] frozen reference policy, for a KL penalty in the loss
    old_values: jax.Array | None = None  # [B, N] the critic's values at sampling time (PPO)
    returns: jax.Array | None = None  # [B, N] value targets (PPO)
    behaviour_weights: jax.Array | None = None  # [B, N] truncated importance weights for stale rollouts


def loss_spec(algorithm, max_new_tokens: int) -> LossSpec:
    """The LossSpec an `AlgorithmConfig` asks for."""
    a = algorithm
    norm = a.norm_constant
    if a.aggregation == "seq_mean_token_sum_norm" and norm is None:
        norm = float(max_new_tokens)  # Dr.GRPO: a constant, the generation budget
    return LossSpec(
        ratio_level=a.ratio_level,
        clip_low=a.clip_low,
        clip_high=a.clip_high,
        dual_clip=a.dual_clip,
        aggregation=a.aggregation,
        norm_constant=norm,
        kl_coef=0.0 if a.kl.in_reward else a.kl.coef,
        kl_estimator=a.kl.estimator,
        entropy_coef=a.entropy_coef,
        value_coef=a.value.coef if a.value.head != "none" else 0.0,
        value_clip=a.value.clip,
    )


def make_optimizer(learning_rate: float, weight_decay: float, b1: float, b2: float, grad_clip: float):
    parts = [optax.clip_by_global_norm(grad_clip)] if grad_clip > 0 else []
    parts.append(optax.adamw(learning_rate, b1=b1, b2=b2, weight_decay=weight_decay))
    return optax.chain(*parts)


def completion_logprobs(model, tokens: jax.Array, valid: jax.Array, completion_len: int, temperature: float):
    """Logprobs [B, N] of the last N tokens of each row under softmax(logits / temperature), and
    the untempered logits that produced them."""
    logits = forward(model, tokens, valid)
    prompt_len = tokens.shape[1] - completion_len
    logits = logits[:, prompt_len - 1 : -1]
    return token_logprobs(logits, tokens[:, prompt_len:], temperature), logits


# The batch-level count each loss aggregation divides by (see losses.LOSS_AGGREGATIONS): a
# micro-batch's loss, weighted by its share of that count, adds up to the full batch's loss.
# A sum over rows divided by a constant counts 1 per micro-batch: the micro-batches' losses add up.
_AGGREGATION_COUNTS = {
    "token_mean": lambda mask: mask.sum(),
    "seq_mean_token_mean": lambda mask: (mask.sum(axis=-1) > 0).sum(),
    "seq_mean_token_sum_norm": lambda mask: jnp.ones((), jnp.int32),
}


@functools.lru_cache(maxsize=16)
def build_rl_step(
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    spec: LossSpec,
    temperature: float,
    critic_graphdef: nnx.GraphDef | None = None,
    critic_tx: optax.GradientTransformation | None = None,
    micro_batches: int = 1,
    mesh: jax.sharding.Mesh | None = None,
):
    """A jitted `(train_state, batch) -> (train_state, metrics)` step of the loss template.

    train_state: {"params", "opt_state"} plus {"critic", "critic_opt_state"} with a critic; it is
    donated. With a shared-trunk critic the value loss also reaches the policy's trunk.

    micro_batches > 1: the batch's rows are split into that many equal micro-batches whose
    gradients are accumulated (in a `lax.scan`, so only one micro-batch's activations are alive)
    before the one optimizer update. Each micro-batch's loss is weighted by its share of the
    whole batch's token (or sequence) count, so the update equals the full-batch update up to
    float rounding, however unevenly the valid tokens fall (optax.MultiSteps' plain mean of the
    micro-batch gradients would not be). Metrics are the same weighted sums; explained_variance,
    which does not decompose, becomes the token-weighted mean of the micro-batches'.

    mesh: trace the step with the activation constraints of spotrl/model/sharding.py on this
    mesh. The caller places the state (`sharding.shard_tree`) and the batch (`sharding.shard_batch`).
    """
    if micro_batches > 1 and spec.aggregation not in _AGGREGATION_COUNTS:
        raise ValueError(f"micro-batching does not know how to weight aggregation {spec.aggregation!r}")

    def loss_fn(params, critic_params, batch: RLBatch, weights=None):
        model = nnx.merge(graphdef, params)
        completion_len = batch.old_logprobs.shape[1]
        logprobs, logits = completion_logprobs(model, batch.tokens, batch.valid, completion_len, temperature)
        mask = batch.valid[:, -completion_len:]
        loss, metrics = policy_loss(
            logprobs,
            batch.old_logprobs,
            batch.advantages,
            mask,
            spec,
            ref_logprobs=batch.ref_logprobs if spec.kl_coef else None,
            entropy=token_entropy(logits, temperature),  # of the distribution the logprobs are of
            behaviour_weights=batch.behaviour_weights,
        )
        if weights is not None:
            loss = loss * weights["policy"]
        if critic_graphdef is not None:
            values = completion_values(
                nnx.merge(critic_graphdef, critic_params), model, batch.tokens, batch.valid, completion_len
            )
            v_loss, v_metrics = value_loss(values, batch.old_values, batch.returns, mask, clip=spec.value_clip)
            weighted_v_loss = v_loss if weights is None else v_loss * weights["tokens"]
            loss = loss + spec.value_coef * weighted_v_loss
            metrics.update(
                v_metrics, value_loss=v_loss, explained_variance=explained_variance(values, batch.returns, mask)
            )
        return loss, metrics

    grad_fn = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)

    def accumulated(params, critic, batch: RLBatch):
        completion_len = batch.old_logprobs.shape[1]
        count_policy = _AGGREGATION_COUNTS[spec.aggregation]
        full_mask = batch.valid[:, -completion_len:]
        totals = {"policy": jnp.maximum(count_policy(full_mask), 1), "tokens": jnp.maximum(full_mask.sum(), 1)}
        micro = jax.tree.map(lambda x: x.reshape(micro_batches, x.shape[0] // micro_batches, *x.shape[1:]), batch)

        def one(carry, mb: RLBatch):
            mask = mb.valid[:, -completion_len:]
            weights = {"policy": count_policy(mask) / totals["policy"], "tokens": mask.sum() / totals["tokens"]}
            (loss, metrics), grads = grad_fn(params, critic, mb, weights)
            metrics = {k: v * weights["policy" if k == "pg_loss" else "tokens"] for k, v in metrics.items()}
            return jax.tree.map(jnp.add, carry, (loss, metrics, grads)), None

        zeros = jax.tree.map(
            jnp.zeros_like, jax.eval_shape(grad_fn, params, critic, jax.tree.map(lambda x: x[0], micro), totals)
        )
        (loss, metrics, grads), _ = jax.lax.scan(one, (zeros[0][0], zeros[0][1], zeros[1]), micro)
        return (loss, metrics), grads

    @functools.partial(jax.jit, donate_argnums=(0,))
    def step(state: dict, batch: RLBatch):
        critic = state.get("critic")
        with sharding.activation_mesh(mesh):
            if micro_batches == 1:
                (loss, metrics), (grads, critic_grads) = grad_fn(state["params"], critic, batch)
            else:
                (loss, metrics), (grads, critic_grads) = accumulated(state["params"], critic, batch)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        new = {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state}
        if critic_graphdef is not None:
            critic_updates, critic_opt_state = critic_tx.update(critic_grads, state["critic_opt_state"], critic)
            new.update(critic=optax.apply_updates(critic, critic_updates), critic_opt_state=critic_opt_state)
        if mesh is not None:  # left to itself XLA may re-layout the outputs: then no donation, and a retrace
            new = jax.lax.with_sharding_constraint(new, sharding.tree_shardings(new, mesh))
        return new, dict(metrics, loss=loss, grad_norm=optax.tree.norm(grads))

    return step


def completion_values(critic, model, tokens: jax.Array, valid: jax.Array, completion_len: int) -> jax.Array:
    """Values [B, N] of the states before each completion token (aligned with completion_logprobs)."""
    return critic(model, tokens, valid)[:, tokens.shape[1] - completion_len - 1 : -1]


@functools.lru_cache(maxsize=16)
def build_scoring_fn(graphdef: nnx.GraphDef, temperature: float, critic_graphdef: nnx.GraphDef | None = None):
    """Jitted `(params, critic_params, tokens, valid, completion_len) -> (logprobs, values or None)`,
    without gradients: the reference policy's logprobs for a KL, the critic's values at sampling time."""

    @functools.partial(jax.jit, static_argnums=(4,))
    def score(params, critic_params, tokens, valid, completion_len):
        model = nnx.merge(graphdef, params)
        logprobs, _ = completion_logprobs(model, tokens, valid, completion_len, temperature)
        values = None
        if critic_graphdef is not None:
            values = completion_values(nnx.merge(critic_graphdef, critic_params), model, tokens, valid, completion_len)
        return logprobs, values

    return score


@functools.lru_cache(maxsize=16)
def build_sft_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation):
    """A jitted supervised step: cross-entropy on the tokens where `target_mask` is set."""

    def loss_fn(params, tokens, valid, target_mask):
        model = nnx.merge(graphdef, params)
        logits = forward(model, tokens, valid)[:, :-1]
        logp = token_logprobs(logits, tokens[:, 1:])
        mask = target_mask[:, 1:].astype(jnp.float32)
        return -(logp * mask).sum() / jnp.maximum(mask.sum(), 1.0)

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(params, opt_state, tokens, valid, target_mask):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, valid, target_mask)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step
