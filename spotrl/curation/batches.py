"""Which training prompts each iteration sees: epochs of seeded permutations, addressed by a cursor."""

from __future__ import annotations

import numpy as np

from spotrl.model.rng import derive_numpy_rng


def batch_indices(seed: int, iteration: int, batch_size: int, dataset_size: int) -> np.ndarray:
    """Row indices for RL iteration `iteration` (1-based).

    The data cursor before the iteration is (iteration - 1) * batch_size; it walks through one seeded
    permutation per epoch, so a resumed run continues exactly where it stopped.
    """
    if iteration < 1:
        raise ValueError(f"iterations are numbered from 1, got {iteration}")
    cursor = (iteration - 1) * batch_size
    out = np.empty(batch_size, np.int64)
    for i in range(batch_size):
        epoch, offset = divmod(cursor + i, dataset_size)
        out[i] = _permutation(seed, epoch, dataset_size)[offset]
    return out


_PERMUTATIONS: dict[tuple[int, int, int], np.ndarray] = {}


def _permutation(seed: int, epoch: int, size: int) -> np.ndarray:
    key = (seed, epoch, size)
    if key not in _PERMUTATIONS:
        _PERMUTATIONS.clear()
        _PERMUTATIONS[key] = derive_numpy_rng(seed, "data-order", epoch).permutation(size)
    return _PERMUTATIONS[key]
