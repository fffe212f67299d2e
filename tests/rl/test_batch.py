"""spotrl/rl/batch.py: the rows an update trains on, against hand-computed frames."""

import numpy as np
import pandas as pd

from spotrl.rl.batch import training_batch

G = 2  # completions per prompt


def _frame(rewards, versions):
    """One row per completion, G per prompt in order: prompt 'p<group>', sample 's<row>'."""
    n = len(rewards)
    return pd.DataFrame(
        {
            "prompt": [f"p{i // G}" for i in range(n)],
            "sample": [f"s{i}" for i in range(n)],
            "reward": np.asarray(rewards, float),
            "weights_version": versions,
        }
    )


def test_stale_rollouts_are_dropped_and_counted():
    # iteration 5 with max_staleness 1 trains on versions 3 and 4; group p0 was sampled with version 2
    frame = _frame([0, 1, 1, 0, 0, 1], [2, 2, 3, 3, 4, 4])
    batch = training_batch(frame, 5, group_size=G, prompts=2, max_staleness=1, dynamic_sampling=False)
    assert batch.info == {"rollouts_dropped_stale": 2}
    assert list(batch.frame["sample"]) == ["s2", "s3", "s4", "s5"]
    assert batch.real_rows == 4 and batch.warning is None


def test_without_dynamic_sampling_the_first_groups_are_kept():
    frame = _frame([0, 0, 1, 0, 1, 1], [4] * 6)
    batch = training_batch(frame, 5, group_size=G, prompts=2, max_staleness=0, dynamic_sampling=False)
    assert list(batch.frame["sample"]) == ["s0", "s1", "s2", "s3"]  # p0 has no signal but is kept
    assert batch.real_rows == 4 and batch.info == {"rollouts_dropped_stale": 0}


def test_dynamic_sampling_keeps_the_first_groups_with_signal():
    # groups: p0 [0, 0] no signal, p1 [1, 0] signal, p2 [1, 1] none, p3 [0, 1] signal, p4 [1, 0] signal
    frame = _frame([0, 0, 1, 0, 1, 1, 0, 1, 1, 0], [4] * 10)
    batch = training_batch(frame, 5, group_size=G, prompts=2, max_staleness=0, dynamic_sampling=True)
    assert list(batch.frame["sample"]) == ["s2", "s3", "s6", "s7"]
    assert batch.real_rows == 4 and batch.warning is None
    assert batch.info == {
        "rollouts_dropped_stale": 0,
        "groups_generated": 5,
        "groups_dropped": 2,
        "groups_trained": 2,
        "batch_short_groups": 0,
    }


def test_a_short_batch_is_padded_with_the_first_row_and_a_warning():
    frame = _frame([0, 0, 0, 1, 1, 1], [4] * 6)  # only p1 has signal
    batch = training_batch(frame, 5, group_size=G, prompts=3, max_staleness=0, dynamic_sampling=True)
    assert list(batch.frame["sample"]) == ["s2", "s3", "s0", "s0", "s0", "s0"]
    assert batch.real_rows == 2
    assert batch.info["groups_trained"] == 1 and batch.info["batch_short_groups"] == 2
    assert batch.warning == (
        "dynamic sampling: only 1 of 3 groups had signal after 3 generated; training on 1 (the rest is padding)"
    )
    assert list(batch.frame.index) == list(range(6))


def test_padding_after_a_stale_drop_uses_the_first_fresh_row():
    frame = _frame([0, 1, 0, 1], [0, 0, 4, 4])
    batch = training_batch(frame, 5, group_size=G, prompts=2, max_staleness=0, dynamic_sampling=False)
    assert list(batch.frame["sample"]) == ["s2", "s3", "s2", "s2"]
    assert batch.real_rows == 2 and batch.info == {"rollouts_dropped_stale": 2}


def test_nothing_left_gives_an_empty_batch():
    frame = _frame([0, 1], [0, 0])
    batch = training_batch(frame, 5, group_size=G, prompts=2, max_staleness=0, dynamic_sampling=False)
    assert len(batch.frame) == 0 and batch.real_rows == 0


def test_in_generation_order_sorts_by_round_then_slot_then_sample_whatever_the_shard_order():
    from spotrl.rl.batch import in_generation_order

    shard_b = pd.DataFrame({"round": [0, 0, 1, 1], "slot": [1, 1, 0, 0], "sample": [1, 0, 0, 1], "x": list("abcd")})
    shard_a = pd.DataFrame({"round": [0, 0], "slot": [0, 0], "sample": [0, 1], "x": list("ef")})
    frame = in_generation_order([shard_b, shard_a])
    assert list(frame["x"]) == ["e", "f", "b", "a", "c", "d"]
    assert list(frame.index) == list(range(6))
    assert in_generation_order([shard_a, shard_b])["x"].tolist() == frame["x"].tolist()
