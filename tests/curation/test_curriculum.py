"""spotrl/curation/curriculum.py's schedule and batches.py's rollout rows (no model, no JAX)."""

import numpy as np
import pytest

from spotrl.curation.batches import batch_indices, rollout_rows
from spotrl.curation.curriculum import estimate_iteration
from spotrl.rng import derive_numpy_rng
from spotrl.rollout.shards import equal_plan


@pytest.mark.parametrize(
    "every, expected",
    [
        (1, [1, 2, 3, 4, 5, 6, 7]),
        (2, [1, 1, 3, 3, 5, 5, 7]),
        (3, [1, 1, 1, 4, 4, 4, 7]),
        (10, [1] * 7),
    ],
)
def test_which_estimate_serves_each_iteration(every, expected):
    assert [estimate_iteration(j, every) for j in range(1, 8)] == expected


def test_an_estimate_serves_its_own_iteration_first():
    for every in (1, 2, 5):
        for j in range(1, 30):
            e = estimate_iteration(j, every)
            assert e <= j < e + every and (e - 1) % every == 0


def test_rollout_rows_are_the_iteration_prompts_and_an_equal_plan_splits_them_in_order():
    pool = np.arange(100, 120)  # the stream's training rows
    rows = batch_indices(7, 3, 6, len(pool))
    round_rows = rollout_rows(7, 3, 0, pool, 6)
    np.testing.assert_array_equal(round_rows, pool[rows])
    shards = [round_rows[part] for part in equal_plan([1.0] * 6, 4)]
    assert [len(s) for s in shards] == [2, 2, 1, 1]
    np.testing.assert_array_equal(np.concatenate(shards), pool[rows])


def test_dynamic_sampling_rounds_draw_from_their_own_stream():
    pool = np.arange(50)
    extra = rollout_rows(7, 3, 2, pool, 6)
    expected = derive_numpy_rng(7, "dynamic_sampling", 3, 2).choice(50, size=6, replace=False)
    np.testing.assert_array_equal(extra, expected)
    assert not np.array_equal(extra, rollout_rows(7, 3, 1, pool, 6))
