"""Every random choice derives from (run seed, stream, iteration, shard, ...) by folding JAX keys.

Nothing depends on wall-clock time, host order or how many times a process was restarted, so a
resumed run regenerates exactly the rollouts an uninterrupted run would have.
"""

from __future__ import annotations

import zlib

import jax
import numpy as np


def derive_key(seed: int, stream: str, *path: int) -> jax.Array:
    key = jax.random.fold_in(jax.random.key(seed), zlib.crc32(stream.encode()))
    for part in path:
        key = jax.random.fold_in(key, part)
    return key


def derive_numpy_rng(seed: int, stream: str, *path: int) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(stream.encode()), *path])
