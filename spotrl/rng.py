"""Every random choice derives from (run seed, stream, iteration, prompt, sample, ...) by folding JAX keys.

Nothing depends on wall-clock time, host order or how many times a process was restarted, so a
resumed run regenerates exactly the rollouts an uninterrupted run would have. `derive_numpy_rng` is
the same derivation for numpy generators; JAX is only imported by the functions that make JAX keys,
so numpy-only users (curation) do not load it.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import jax


def derive_key(seed: int, stream: str, *path: int) -> jax.Array:
    import jax

    key = jax.random.fold_in(jax.random.key(seed), zlib.crc32(stream.encode()))
    for part in path:
        key = jax.random.fold_in(key, part)
    return key


def derive_numpy_rng(seed: int, stream: str, *path: int) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(stream.encode()), *path])


def rollout_key(seed: int, iteration: int, generation_round: int = 0) -> jax.Array:
    """The key of an iteration's rollout round (round 0: the iteration's own). Sample j of the
    round's prompt i draws with fold_in(fold_in(this key, i), j) (rollout/completions.py), on
    whichever shard or worker it runs: the shard plan never changes what is sampled."""
    if generation_round == 0:
        return derive_key(seed, "rollout", iteration)
    return derive_key(seed, "rollout", iteration, generation_round)


def minibatch_rng(seed: int, iteration: int) -> np.random.Generator:
    """The generator that orders an iteration's rollouts into minibatches."""
    return derive_numpy_rng(seed, "minibatches", iteration)


def next_iteration_streams(seed: int, iteration: int) -> dict:
    """The concrete keys iteration `iteration + 1` will use, as JSON: recorded in each checkpoint.

    A resume re-derives them and compares, so a change to the derivation (a code change between the
    kill and the resume) is caught instead of silently breaking reproducibility.
    """
    import jax

    nxt = iteration + 1
    minibatch_state = minibatch_rng(seed, nxt).bit_generator.state["state"]
    return {
        "iteration": nxt,
        "rollout": np.asarray(jax.random.key_data(rollout_key(seed, nxt))).tolist(),
        "minibatches": {k: str(v) for k, v in minibatch_state.items()},
    }
