"""DAPO shaping and filtering, and per-token reward placement, on cases computed by hand."""

import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

from spotrl.config import OverlongConfig
from spotrl.rl.advantages import discounted_returns
from spotrl.rl.shaping import (
    groups_with_signal,
    overlong_penalty,
    reward_summary,
    shaped_rewards,
    token_level_rewards,
)


def test_overlong_penalty_band():
    # max_len 20, cache 4: band (16, 20]; ramp (16 - L) / 4
    lengths = np.array([10, 16, 17, 18, 20, 21])
    np.testing.assert_allclose(overlong_penalty(lengths, 20, 4), [0, 0, -0.25, -0.5, -1, -1], atol=1e-7)
    np.testing.assert_allclose(
        overlong_penalty(lengths, 20, 4, penalty=0.5), [0, 0, -0.125, -0.25, -0.5, -0.5], atol=1e-7
    )


def test_overlong_penalty_edge_bands():
    # no band: full penalty from max_len on;  band = whole budget: linear from 0
    np.testing.assert_allclose(overlong_penalty(jnp.array([19, 20, 21]), 20, 0), [0, -1, -1], atol=1e-7)
    np.testing.assert_allclose(overlong_penalty(jnp.array([0, 5, 10]), 10, 10), [0, -0.5, -1], atol=1e-7)
    with pytest.raises(ValueError, match="cache_len"):
        overlong_penalty(jnp.array([1]), 10, 11)


def test_groups_with_signal():
    rewards = np.array([[1.0, 1, 1], [0, 1, 0], [0, 0, 0], [0.5, 0.5, 0.5]])
    np.testing.assert_array_equal(groups_with_signal(rewards), [False, True, False, False])
    near = np.array([[1.0, 1.001]], np.float32)
    assert bool(groups_with_signal(near)[0]) and not bool(groups_with_signal(near, atol=0.01)[0])


def test_token_level_rewards_on_the_last_valid_token():
    rewards = jnp.array([1.0, 2.0, 3.0])
    mask = jnp.array([[1, 1, 0], [1, 1, 1], [0, 0, 0]])  # row 2 is empty: its reward goes nowhere
    np.testing.assert_allclose(token_level_rewards(rewards, mask), [[0, 1, 0], [0, 0, 2], [0, 0, 0]])
    kl = jnp.array([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6], [0.7, 0.8, 0.9]])
    out = token_level_rewards(rewards, mask, kl=kl, kl_coef=0.5)
    np.testing.assert_allclose(out, [[-0.05, 0.9, 0], [-0.2, -0.25, 1.7], [0, 0, 0]], rtol=1e-6, atol=1e-7)
    # REINFORCE++ returns (gamma 1): reward-to-go of row 0 is [-.05 + .9, .9]
    np.testing.assert_allclose(discounted_returns(out, mask, 1.0)[0], [0.85, 0.9, 0.0], rtol=1e-6)


def _scored(task_reward, lengths):
    return pd.DataFrame({"task_reward": np.asarray(task_reward, np.float32), "length": np.asarray(lengths)})


def test_without_overlong_shaping_the_reward_is_the_task_reward():
    frame = _scored([1, 0, 1, 1], [3, 8, 8, 5])
    task_reward = frame["task_reward"]
    reward = shaped_rewards(task_reward, frame["length"].to_numpy(), OverlongConfig(), 8)
    assert reward is task_reward and reward.dtype == np.float32


def test_overlong_shaping_adds_the_penalty_in_float64():
    frame = _scored([1, 0, 1, 1], [3, 8, 7, 5])
    overlong = OverlongConfig(enabled=True, cache_tokens=2, penalty=0.5)
    reward = shaped_rewards(frame["task_reward"], frame["length"].to_numpy(), overlong, 8)
    assert reward.dtype == np.float64
    np.testing.assert_array_equal(reward.to_numpy(), [1.0, -0.5, 0.75, 1.0])  # band (6, 8]: 7 -> -0.25
    expected = frame["task_reward"] + np.asarray(overlong_penalty(frame["length"].to_numpy(), 8, 2, 0.5), np.float64)
    pd.testing.assert_series_equal(reward, expected)
    # overlong.max_tokens overrides the generation budget
    tighter = shaped_rewards(
        frame["task_reward"], frame["length"].to_numpy(), overlong.model_copy(update={"max_tokens": 5}), 8
    )
    np.testing.assert_array_equal(tighter.to_numpy(), [1.0, -0.5, 0.5, 0.5])


def test_reward_summary_counts_groups_with_signal():
    frame = _scored([1, 0, 1, 1, 0, 0], [3, 4, 5, 6, 7, 8]).assign(reward=[1.0, 0.0, 1.0, 1.0, -0.5, 0.0])
    assert reward_summary(frame, 2) == {
        "reward_sum": 3.0,
        "shaped_reward_sum": 2.5,
        "length_sum": 33,
        "groups": 3,
        "groups_with_signal": 2,
    }
