"""Jit-compiled autoregressive sampler with a fixed-size KV cache.

Prompts arrive left-padded to a common length P (static), the cache has P + max_new_tokens
slots, and the decode loop is a `lax.while_loop` that stops as soon as every row has emitted the
stop token. `generate_groups` samples several continuations of each prompt from one prefill: the
prompt's KV cache is computed once and copied to every sample of its group. Returned logprobs are
those of the sampled tokens under softmax(logits / temperature) before top-k / top-p filtering:
the distribution the trainer recomputes, so that on-policy importance ratios are 1.

Every row samples from a key of its own (`keys` [B], or one key from which row r's is
fold_in(key, r)): a row's tokens depend on its key and its prompt, not on which other rows share
its batch, so a completion can be reproduced in any batch of the same padded shape.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from spotrl.model.transformer import causal_mask, init_cache, positions_from_mask


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    stop_token: int
    pad_token: int = 0
    temperature: float = 1.0  # 0 means greedy
    top_k: int = 0  # 0 disables
    top_p: float = 1.0  # 1 disables
    stop_tokens: tuple[int, ...] = ()  # more ids that end a row (generation_config.json's eos_token_id list)

    @property
    def stop_ids(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys((self.stop_token, *self.stop_tokens)))


def is_stop(tokens: jax.Array, params: SamplingParams) -> jax.Array:
    """Where `tokens` is any of the stop ids."""
    hit = tokens == params.stop_ids[0]
    for stop in params.stop_ids[1:]:
        hit = hit | (tokens == stop)
    return hit


class SampleOutput(NamedTuple):
    tokens: jax.Array  # [B, N] generated tokens, pad after the stop token
    logprobs: jax.Array  # [B, N] behaviour logprobs, 0 after the stop token
    lengths: jax.Array  # [B] generated tokens including the stop token


def filter_logits(logits: jax.Array, top_k: int, top_p: float) -> jax.Array:
    """Mask (to -inf) the tokens outside the top-k and outside the top-p nucleus."""
    neg_inf = jnp.finfo(logits.dtype).min
    if top_k > 0:
        kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
        logits = jnp.where(logits < kth, neg_inf, logits)
    if top_p < 1.0:
        sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        # the smallest logit still inside the nucleus; the top token is always kept
        keep = mass_before < top_p
        cutoff = jnp.min(jnp.where(keep, sorted_logits, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < cutoff, neg_inf, logits)
    return logits


def row_keys(key: jax.Array, batch: int) -> jax.Array:
    """Per-row keys [batch]: `key` itself if it already is one per row, else fold_in(key, row)."""
    if key.ndim == 1:
        if key.shape[0] != batch:
            raise ValueError(f"{key.shape[0]} keys for {batch} rows")
        return key
    return jax.vmap(jax.random.fold_in, (None, 0))(key, jnp.arange(batch))


def sample_token(keys: jax.Array, logits: jax.Array, params: SamplingParams) -> tuple[jax.Array, jax.Array]:
    """One token per row from logits [B, V] (row b drawn with keys[b]), and its behaviour logprob."""
    if params.temperature == 0.0:
        token = jnp.argmax(logits, axis=-1)
        scaled = logits
    else:
        scaled = logits / params.temperature
        token = jax.vmap(jax.random.categorical)(keys, filter_logits(scaled, params.top_k, params.top_p))
    logprob = jnp.take_along_axis(jax.nn.log_softmax(scaled, axis=-1), token[:, None], axis=-1)[:, 0]
    return token.astype(jnp.int32), logprob


def _decode(model, logits, cache, key_valid, next_pos, key, params: SamplingParams, prompt_len: int) -> SampleOutput:
    """The decode loop after a prefill: logits [B, V] of the last prompt token, a cache of
    prompt_len + max_new_tokens slots whose first prompt_len are filled, next_pos [B]."""
    batch = logits.shape[0]
    new = params.max_new_tokens
    keys = row_keys(key, batch)

    def cond(carry):
        i, _, _, done, _, _, _ = carry
        return (i < new) & ~jnp.all(done)

    def body(carry):
        i, last_logits, cache, done, pos, tokens, logprobs = carry
        step_keys = jax.vmap(jax.random.fold_in, (0, None))(keys, i)
        token, logprob = sample_token(step_keys, last_logits, params)
        token = jnp.where(done, params.pad_token, token)
        logprob = jnp.where(done, 0.0, logprob)
        tokens = tokens.at[:, i].set(token)
        logprobs = logprobs.at[:, i].set(logprob)
        done = done | is_stop(token, params)
        slot = prompt_len + i
        mask = causal_mask(jnp.full((1,), slot), key_valid)
        step_logits, cache = model(token[:, None], pos[:, None], mask, cache, slot)
        return i + 1, step_logits[:, 0], cache, done, pos + 1, tokens, logprobs

    carry = (
        jnp.int32(0),
        logits,
        cache,
        jnp.zeros((batch,), bool),
        next_pos,
        jnp.full((batch, new), params.pad_token, jnp.int32),
        jnp.zeros((batch, new), jnp.float32),
    )
    _, _, _, _, _, tokens, logprobs = jax.lax.while_loop(cond, body, carry)
    finished = is_stop(tokens, params)
    first_stop = jnp.argmax(finished, axis=1)
    lengths = jnp.where(finished.any(axis=1), first_stop + 1, new)
    return SampleOutput(tokens, logprobs, lengths.astype(jnp.int32))


def _prefill(model, prompt_tokens, prompt_valid, new: int):
    """Prefill left-padded prompts [B, P] into a fresh cache of P + new slots.

    Returns the last prompt token's logits [B, V], the cache, the key validity [B, P + new] and
    the position of the first generated token [B]."""
    batch, prompt_len = prompt_tokens.shape
    key_valid = jnp.concatenate([prompt_valid, jnp.ones((batch, new), bool)], axis=1)
    positions = positions_from_mask(prompt_valid)
    cache = init_cache(model.config, batch, prompt_len + new)
    logits, cache = model(prompt_tokens, positions, causal_mask(jnp.arange(prompt_len), key_valid), cache, 0)
    return logits[:, -1], cache, key_valid, positions[:, -1] + 1


@partial(jax.jit, static_argnames=("graphdef", "params"))
def _generate(graphdef, state, prompt_tokens, prompt_valid, key, params: SamplingParams) -> SampleOutput:
    model = nnx.merge(graphdef, state)
    logits, cache, key_valid, next_pos = _prefill(model, prompt_tokens, prompt_valid, params.max_new_tokens)
    return _decode(model, logits, cache, key_valid, next_pos, key, params, prompt_tokens.shape[1])


@partial(jax.jit, static_argnames=("graphdef", "params", "group_size"))
def _generate_groups(
    graphdef, state, prompt_tokens, prompt_valid, key, params: SamplingParams, group_size: int
) -> SampleOutput:
    model = nnx.merge(graphdef, state)
    logits, cache, key_valid, next_pos = _prefill(model, prompt_tokens, prompt_valid, params.max_new_tokens)

    # every prompt's prefilled cache, last logits and positions serve all group_size samples of its
    # group: row r of the batch is sample r % group_size of prompt r // group_size
    def repeat(x):
        return jnp.repeat(x, group_size, axis=0)

    logits, cache, key_valid, next_pos = jax.tree.map(repeat, (logits, cache, key_valid, next_pos))
    return _decode(model, logits, cache, key_valid, next_pos, key, params, prompt_tokens.shape[1])


def generate(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    prompt_tokens: jax.Array,
    prompt_valid: jax.Array,
    key: jax.Array,
    params: SamplingParams,
) -> SampleOutput:
    """Sample continuations of left-padded prompts [B, P] (prompt_valid marks real tokens), row b
    with key[b] (`key` [B]) or with fold_in(key, b) (one key)."""
    return _generate(
        graphdef, state, jnp.asarray(prompt_tokens, jnp.int32), jnp.asarray(prompt_valid, bool), key, params
    )


def generate_groups(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    prompt_tokens: jax.Array,
    prompt_valid: jax.Array,
    key: jax.Array,
    params: SamplingParams,
    group_size: int,
) -> SampleOutput:
    """group_size samples of each left-padded prompt [U, P], prefilling every prompt once.

    Returns [U * group_size, N] rows, row r a sample of prompt r // group_size, drawn with key[r]
    (`key` [U * group_size]) or fold_in(key, r): the same rows, and for the same keys the same
    random draws, as `generate` on the prompts repeated group_size times
    (np.repeat(prompt_tokens, group_size, axis=0)), at the prefill cost of U prompts instead of
    U * group_size.
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    return _generate_groups(
        graphdef,
        state,
        jnp.asarray(prompt_tokens, jnp.int32),
        jnp.asarray(prompt_valid, bool),
        key,
        params,
        int(group_size),
    )


def jit_cache_sizes() -> dict[str, int]:
    """Entries in the sampler's jit caches: one compiled executable per distinct static argument /
    shape combination so far (read directly, independent of spotrl.model.compiles' listener)."""
    return {"generate": _generate._cache_size(), "generate_groups": _generate_groups._cache_size()}
