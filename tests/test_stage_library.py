"""The library functions the reward and rollout stages call: shaping, the shard summary, keys, worker ids."""

import os
import socket

import jax
import numpy as np
import pandas as pd

from spotrl.config import OverlongConfig
from spotrl.rl.shaping import overlong_penalty, reward_summary, shaped_rewards
from spotrl.rng import derive_key
from spotrl.rollout.completions import Completions, completions_frame, rollout_key
from spotrl.storage.lease import worker_id


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
    tighter = shaped_rewards(frame["task_reward"], frame["length"].to_numpy(), overlong.model_copy(update={"max_tokens": 5}), 8)
    np.testing.assert_array_equal(tighter.to_numpy(), [1.0, -0.5, 0.5, 0.5])


def test_reward_summary_counts_groups_with_signal():
    frame = _scored([1, 0, 1, 1, 0, 0], [3, 4, 5, 6, 7, 8]).assign(reward=[1.0, 0.0, 1.0, 1.0, -0.5, 0.0])
    assert reward_summary(frame, 2) == {"reward_sum": 3.0, "shaped_reward_sum": 2.5, "length_sum": 33, "groups": 3,
                                        "groups_with_signal": 2}


def test_rollout_keys_are_the_derived_streams():
    same = lambda a, b: np.array_equal(jax.random.key_data(a), jax.random.key_data(b))  # noqa: E731
    assert same(rollout_key(3, 5, 1), derive_key(3, "rollout", 5, 1))
    assert same(rollout_key(3, 5, 1, 2), derive_key(3, "rollout", 5, 1, 2))
    assert not same(rollout_key(3, 5, 1, 1), rollout_key(3, 5, 1))


def test_completions_frame_repeats_each_prompt_over_its_group():
    prompts = pd.DataFrame({"id": ["a", "b"], "prompt": ["1+1=", "2+2="], "answer": ["2", "4"]})
    completions = Completions(prompt_tokens=np.zeros((4, 1)), prompt_valid=np.ones((4, 1), bool),
                              tokens=np.arange(8).reshape(4, 2), logprobs=np.zeros((4, 2), np.float32),
                              lengths=np.array([2, 1, 2, 0]), texts=["2", "3", "4", ""],
                              stopped=np.array([True, False, True, False]))
    frame = completions_frame(prompts, completions, 2, weights_version=7)
    assert list(frame["prompt_id"]) == ["a", "a", "b", "b"] and list(frame["answer"]) == ["2", "2", "4", "4"]
    assert list(frame["sample"]) == [0, 1, 0, 1] and list(frame["weights_version"]) == [7] * 4
    assert list(frame.columns) == ["prompt_id", "prompt", "answer", "sample", "completion", "tokens", "logprobs",
                                   "length", "stopped", "weights_version"]
    np.testing.assert_array_equal(frame["tokens"][2], [4, 5])


def test_worker_id_is_host_colon_pid():
    assert worker_id() == f"{socket.gethostname()}:{os.getpid()}"
