"""Sampling groups of completions for text prompts, in fixed-size chunks (static shapes)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from spotrl.rollout.sampler import SamplingParams, generate, generate_groups, is_stop


@dataclasses.dataclass
class Completions:
    """Row r is sample r % group_size of prompt r // group_size."""

    prompt_tokens: np.ndarray  # [R, P]
    prompt_valid: np.ndarray  # [R, P]
    tokens: np.ndarray  # [R, N]
    logprobs: np.ndarray  # [R, N]
    lengths: np.ndarray  # [R]
    texts: list[str]
    stopped: np.ndarray  # [R] bool: ended with the stop token

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())


@dataclasses.dataclass(frozen=True, eq=False)
class LoadedPolicy:
    """A policy's graph, its weights and its tokenizer, ready to sample: what every sampling
    caller hands on together. Not spotrl/model/policy.py's Policy (a network's static parts and
    its dict <-> State conversions); compared by identity, never by its arrays."""

    graphdef: Any  # nnx.GraphDef of the network
    state: Any  # its weights (nnx.State)
    tokenizer: Any  # encode_batch_left_padded, decode


def sample_completions(
    policy: LoadedPolicy,
    prompts: list[str],
    group_size: int,
    sampling: SamplingParams,
    key: jax.Array,
    max_chunk_rows: int = 1024,
    shared_prefill: bool | None = None,
    prompt_ids: list[int] | None = None,
    chunk_rows: int | None = None,
    prompt_length: int | None = None,
    on_chunk: Callable[[Completions], None] | None = None,
) -> Completions:
    """group_size samples of every prompt by `policy`, in chunks of at most max_chunk_rows rows.

    shared_prefill (default: on whenever group_size > 1) prefills each prompt once and reuses its
    KV cache for all samples of its group (`generate_groups`); off, every prompt is repeated
    group_size times and prefilled per row (`generate`). When max_chunk_rows is a multiple of
    group_size (or all rows fit one chunk) both paths see the same chunks, batch shapes and keys,
    so they draw the same random numbers and differ only by floating-point rounding in the prefill.

    Sample j of prompt i draws with fold_in(fold_in(key, prompt_ids[i]), j) (prompt_ids default to
    0, 1, ...), whichever chunk or batch it lands in. `chunk_rows` fixes every chunk's row count
    (short ones padded by repetition) and `prompt_length` the padded prompt length: with both fixed,
    a completion comes out the same bit for bit in any batch (see rollout/shards.py).

    `on_chunk`, if given, is called with each chunk's completions as soon as they are sampled, in
    order (a caller scores or reports while the next chunk samples).
    """
    graphdef, state, tokenizer = policy.graphdef, policy.state, policy.tokenizer
    if shared_prefill is None:
        shared_prefill = group_size > 1
    rows = [p for p in prompts for _ in range(group_size)]
    prompt_tokens, prompt_valid = tokenizer.encode_batch_left_padded(list(prompts), prompt_length)
    prompt_tokens = np.repeat(prompt_tokens, group_size, axis=0)
    prompt_valid = np.repeat(prompt_valid, group_size, axis=0)
    keys = sample_keys(key, np.arange(len(prompts)) if prompt_ids is None else prompt_ids, group_size)
    chunk = chunk_rows or min(len(rows), max_chunk_rows)
    if shared_prefill:
        chunk = max(1, chunk // group_size) * group_size  # whole groups
    parts = []
    for start in range(0, len(rows), chunk):
        stop = min(start + chunk, len(rows))
        take = np.arange(start, start + chunk).clip(max=stop - 1)  # pad the last chunk by repetition
        chunk_key = keys[take]
        if shared_prefill:
            heads = take[::group_size]  # the first row of every group: one per prompt
            out = generate_groups(
                graphdef, state, prompt_tokens[heads], prompt_valid[heads], chunk_key, sampling, group_size
            )
        else:
            out = generate(graphdef, state, prompt_tokens[take], prompt_valid[take], chunk_key, sampling)
        out = jax.tree.map(lambda x, rows=stop - start: np.asarray(x)[:rows], out)
        part = Completions(
            prompt_tokens=prompt_tokens[start:stop],
            prompt_valid=prompt_valid[start:stop],
            tokens=out.tokens,
            logprobs=out.logprobs,
            lengths=out.lengths,
            texts=[tokenizer.decode(t) for t in out.tokens],
            stopped=np.asarray(is_stop(out.tokens[np.arange(stop - start), np.maximum(out.lengths - 1, 0)], sampling)),
        )
        if on_chunk is not None:
            on_chunk(part)
        parts.append(part)
    return Completions(
        prompt_tokens=prompt_tokens,
        prompt_valid=prompt_valid,
        tokens=np.concatenate([p.tokens for p in parts]),
        logprobs=np.concatenate([p.logprobs for p in parts]),
        lengths=np.concatenate([p.lengths for p in parts]),
        texts=[text for p in parts for text in p.texts],
        stopped=np.concatenate([p.stopped for p in parts]),
    )


def sample_keys(key: jax.Array, prompt_ids, group_size: int) -> jax.Array:
    """The key of every row [len(prompt_ids) * group_size]: sample j of prompt p draws with
    fold_in(fold_in(key, p), j)."""
    ids = jnp.repeat(jnp.asarray(prompt_ids, jnp.uint32), group_size)
    samples = jnp.tile(jnp.arange(group_size, dtype=jnp.uint32), len(prompt_ids))
    return _fold_twice(key, ids, samples)


@jax.jit
def _fold_twice(key, first, second):
    fold = jax.vmap(jax.random.fold_in, (None, 0))
    return jax.vmap(jax.random.fold_in)(fold(key, first), second)


def completions_frame(prompts, completions: Completions, group_size: int, weights_version: int) -> pd.DataFrame:
    """A rollout shard: one row per completion, `group_size` rows per prompt. `prompts` has the
    columns id, prompt and answer (a DataFrame or a datasets.Dataset)."""
    repeat = lambda column: [v for v in prompts[column] for _ in range(group_size)]  # noqa: E731
    return pd.DataFrame(
        {
            "prompt_id": repeat("id"),
            "prompt": repeat("prompt"),
            "answer": repeat("answer"),
            "sample": np.tile(np.arange(group_size), len(prompts)),
            "completion": completions.texts,
            "tokens": list(completions.tokens),
            "logprobs": list(completions.logprobs),
            "length": completions.lengths,
            "stopped": completions.stopped,
            "weights_version": weights_version,
        }
    )


def shard_number(shard: int, generation_round: int, shards: int) -> int:
    """A rollout shard's number in its iteration: round r's shards follow round r - 1's."""
    return shard + generation_round * shards


def round_frame(
    prompts, completions: Completions, group_size: int, weights_version: int, generation_round: int, positions
) -> pd.DataFrame:
    """A rollout shard of a planned round: `completions_frame` plus each row's `round` and `slot`,
    the place of its prompt among the round's prompts (`positions[i]` for the shard's prompt i),
    by which the update orders rows whichever shard sampled them (rl/batch.in_generation_order)."""
    frame = completions_frame(prompts, completions, group_size, weights_version)
    frame["round"], frame["slot"] = generation_round, np.repeat(np.asarray(positions, np.int64), group_size)
    return frame
