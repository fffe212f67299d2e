"""Sampling groups of completions for text prompts, in fixed-size chunks (static shapes)."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from spotrl.model.sampler import SamplingParams, generate


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


def sample_completions(
    graphdef,
    state,
    tokenizer,
    prompts: list[str],
    group_size: int,
    sampling: SamplingParams,
    key: jax.Array,
    max_chunk_rows: int = 1024,
) -> Completions:
    rows = [p for p in prompts for _ in range(group_size)]
    prompt_tokens, prompt_valid = tokenizer.encode_batch_left_padded(rows)
    chunk = min(len(rows), max_chunk_rows)
    parts = []
    for index, start in enumerate(range(0, len(rows), chunk)):
        stop = min(start + chunk, len(rows))
        take = np.arange(start, start + chunk).clip(max=stop - 1)  # pad the last chunk by repetition
        out = generate(graphdef, state, prompt_tokens[take], prompt_valid[take], jax.random.fold_in(key, index), sampling)
        parts.append(jax.tree.map(lambda x: np.asarray(x)[: stop - start], out))
    tokens = np.concatenate([p.tokens for p in parts])
    lengths = np.concatenate([p.lengths for p in parts])
    stopped = tokens[np.arange(len(rows)), np.maximum(lengths - 1, 0)] == sampling.stop_token
    return Completions(
        prompt_tokens=prompt_tokens,
        prompt_valid=prompt_valid,
        tokens=tokens,
        logprobs=np.concatenate([p.logprobs for p in parts]),
        lengths=lengths,
        texts=[tokenizer.decode(t) for t in tokens],
        stopped=stopped,
    )
