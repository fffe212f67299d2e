"""Which training prompts each iteration sees: epochs of seeded permutations, addressed by a cursor."""

from __future__ import annotations

import functools

import numpy as np

from spotrl.rng import derive_numpy_rng


def batch_indices(seed: int, iteration: int, batch_size: int, dataset_size: int) -> np.ndarray:
    """Row indices for RL iteration `iteration` (1-based).

    The data cursor before the iteration is (iteration - 1) * batch_size; it walks through one seeded
    permutation per epoch, so a resumed run continues exactly where it stopped.
    """
    if iteration < 1:
        raise ValueError(f"iterations are numbered from 1, got {iteration}")
    positions = (iteration - 1) * batch_size + np.arange(batch_size)
    epochs, offsets = np.divmod(positions, dataset_size)
    out = np.empty(batch_size, np.int64)
    for epoch in np.unique(epochs):
        chosen = epochs == epoch
        out[chosen] = _permutation(seed, int(epoch), dataset_size)[offsets[chosen]]
    return out


@functools.lru_cache(maxsize=2)
def _permutation(seed: int, epoch: int, size: int) -> np.ndarray:
    return derive_numpy_rng(seed, "data-order", epoch).permutation(size)


def rollout_rows(seed: int, iteration: int, generation_round: int, pool: np.ndarray, prompts: int) -> np.ndarray:
    """The rows of `pool` (training row indices) a rollout round samples, in the order their keys follow.

    Round 0 takes the iteration's `prompts` in the seeded data order (batch_indices); rounds >= 1
    are dynamic sampling's extra generations, `prompts` drawn from a stream of their own. How they
    are split over the shards is the rollout plan's choice (rollout/shards.py).
    """
    if generation_round == 0:
        return pool[batch_indices(seed, iteration, prompts, len(pool))]
    rng = derive_numpy_rng(seed, "dynamic_sampling", iteration, generation_round)
    return pool[rng.choice(len(pool), size=prompts, replace=False)]
