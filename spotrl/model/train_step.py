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

from spotrl.model.losses import clipped_policy_loss, token_logprobs
from spotrl.model.transformer import forward


class RLBatch(NamedTuple):
    tokens: jax.Array  # [B, P+N] left-padded prompt followed by the completion
    valid: jax.Array  # [B, P+N] real prompt tokens and completion tokens up to the stop token
    old_logprobs: jax.Array  # [B, N] behaviour logprobs from the sampler
    advantages: jax.Array  # [B]


def make_optimizer(learning_rate: float, weight_decay: float, b1: float, b2: float, grad_clip: float):
    parts = [optax.clip_by_global_norm(grad_clip)] if grad_clip > 0 else []
    parts.append(optax.adamw(learning_rate, b1=b1, b2=b2, weight_decay=weight_decay))
    return optax.chain(*parts)


def completion_logprobs(model, tokens: jax.Array, valid: jax.Array, completion_len: int, temperature: float):
    """Logprobs [B, N] of the last N tokens of each row, and the logits that produced them."""
    logits = forward(model, tokens, valid)
    prompt_len = tokens.shape[1] - completion_len
    logits = logits[:, prompt_len - 1 : -1]
    return token_logprobs(logits, tokens[:, prompt_len:], temperature), logits


@functools.lru_cache(maxsize=16)
def build_rl_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, clip_eps: float, temperature: float):
    """A jitted `(params, opt_state, batch) -> (params, opt_state, metrics)` GRPO/PPO-clip step."""

    def loss_fn(params, batch: RLBatch):
        model = nnx.merge(graphdef, params)
        completion_len = batch.old_logprobs.shape[1]
        logprobs, logits = completion_logprobs(model, batch.tokens, batch.valid, completion_len, temperature)
        mask = batch.valid[:, -completion_len:]
        loss, metrics = clipped_policy_loss(logprobs, batch.old_logprobs, batch.advantages, mask, clip_eps)
        probs = jax.nn.softmax(logits, axis=-1)
        entropy = -(probs * jax.nn.log_softmax(logits, axis=-1)).sum(-1)
        metrics["entropy"] = (entropy * mask).sum() / jnp.maximum(mask.sum(), 1)
        return loss, metrics

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(params, opt_state, batch: RLBatch):
        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics = dict(metrics, loss=loss, grad_norm=optax.tree.norm(grads))
        return params, opt_state, metrics

    return step


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
