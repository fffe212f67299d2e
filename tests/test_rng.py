"""spotrl/rng.py: the streams a run samples with are the ones its checkpoints record."""

import jax
import numpy as np

from spotrl.rng import derive_key, derive_numpy_rng, minibatch_rng, next_iteration_streams, rollout_key


def test_rollout_keys_are_the_derived_streams():
    same = lambda a, b: np.array_equal(jax.random.key_data(a), jax.random.key_data(b))  # noqa: E731
    assert same(rollout_key(3, 5), derive_key(3, "rollout", 5))
    assert same(rollout_key(3, 5, 2), derive_key(3, "rollout", 5, 2))
    assert not same(rollout_key(3, 5, 1), rollout_key(3, 5))


def test_checkpoints_record_the_streams_the_next_iteration_uses():
    recorded = next_iteration_streams(seed=3, iteration=4)
    assert recorded["iteration"] == 5
    assert recorded["rollout"] == np.asarray(jax.random.key_data(rollout_key(3, 5))).tolist()
    state = minibatch_rng(3, 5).bit_generator.state["state"]
    assert recorded["minibatches"] == {k: str(v) for k, v in state.items()}
    # the minibatch stream is the numpy stream named "minibatches"
    np.testing.assert_array_equal(
        minibatch_rng(3, 5).permutation(10), derive_numpy_rng(3, "minibatches", 5).permutation(10)
    )
