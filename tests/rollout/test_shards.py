"""rollout/shards.py: the LPT planner, predicted costs, idle fraction and the length record, by hand."""

import itertools

import pandas as pd
import pytest

from spotrl.rollout.shards import (
    equal_plan,
    idle_fraction,
    length_record,
    lpt_plan,
    makespan,
    merge_lengths,
    predicted_costs,
    shard_capacity,
)
from spotrl.storage.rollouts import write_shard


def test_lpt_by_hand():
    # costs 7 5 4 3 2 1 on 2 shards (capacity 3): 7->s0, 5->s1, 4->s1 (5<7), 3->s0 (7<9), 2->s1 (9<10),
    # s1 is full (3 prompts), 1->s0
    assert lpt_plan([3, 7, 1, 5, 4, 2], 2) == [[0, 1, 2], [3, 4, 5]]
    assert makespan(lpt_plan([3, 7, 1, 5, 4, 2], 2), [3, 7, 1, 5, 4, 2]) == 11
    # ties: the earlier prompt first, the lower shard first
    assert lpt_plan([1, 1, 1, 1], 2) == [[0, 2], [1, 3]]


def test_lpt_spreads_a_long_tail_that_equal_slices_pile_on_one_shard():
    costs = [100, 90, 80, 5, 5, 5, 5, 5, 5]
    assert equal_plan(costs, 3) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert makespan(equal_plan(costs, 3), costs) == 270
    # 100, 90, 80 one each; the 5s to the lightest shard with room: s2 (80, 85) until full, s1 (90, 95), s0
    assert lpt_plan(costs, 3) == [[0, 7, 8], [1, 5, 6], [2, 3, 4]]
    assert makespan(lpt_plan(costs, 3), costs) == 110


@pytest.mark.parametrize("n,shards", [(7, 3), (9, 3), (5, 5), (6, 4)])
def test_lpt_is_a_partition_within_capacity_and_no_worse_than_brute_force_by_4_3(n, shards):
    costs = [(i * 37) % 11 + 1 for i in range(n)]
    plan = lpt_plan(costs, shards)
    assert sorted(i for part in plan for i in part) == list(range(n))
    assert all(len(part) <= shard_capacity(n, shards) for part in plan)
    best = min(  # every assignment of prompts to shards that respects the capacity
        max(sum(c for c, s in zip(costs, a) if s == k) for k in range(shards))
        for a in itertools.product(range(shards), repeat=n)
        if all(a.count(k) <= shard_capacity(n, shards) for k in range(shards))
    )
    assert best <= makespan(plan, costs) <= 4 / 3 * best + max(costs)


def test_predicted_costs_use_own_mean_else_running_mean():
    record = merge_lengths({}, ["a", "a", "b"], [4, 6, 9])  # prompt a: 4, 6; prompt b: 9
    assert record == {"a": (2, 10), "b": (1, 9)}
    # prompt c unseen: the mean of all 3 completions, 19 / 3
    assert predicted_costs(["a", "b", "c"], [3, 2, 1], record, default=8) == pytest.approx([3 + 5, 2 + 9, 1 + 19 / 3])
    assert predicted_costs(["c"], [1], {}, default=8) == [9.0]


def test_idle_fraction_by_hand():
    # round 1: shards busy 2 s and 4 s, held 2 x 4 s; round 2: 1 s and 1 s, held 2 x 1 s -> 1 - 8 / 10
    assert idle_fraction([[2.0, 4.0], [1.0, 1.0]]) == pytest.approx(0.2)
    assert idle_fraction([[3.0, 3.0, 3.0]]) == 0.0


def test_length_record_is_rebuilt_from_scored_shards_and_kept(tmp_path):
    def scored(iteration, shard, ids, lengths):
        write_shard(
            tmp_path / "rollouts", iteration, shard, "scored", pd.DataFrame({"prompt_id": ids, "length": lengths})
        )

    scored(1, 0, ["a", "b"], [3, 5])
    scored(1, 1, ["a"], [7])
    scored(2, 0, ["b"], [1])
    assert length_record(tmp_path, 0) == {}
    assert length_record(tmp_path, 1) == {"a": (2, 10), "b": (1, 5)}
    assert length_record(tmp_path, 2) == {"a": (2, 10), "b": (2, 6)}
    assert sorted(p.name for p in (tmp_path / "lengths").iterdir()) == ["iter_000001.json", "iter_000002.json"]
    scored(2, 1, ["a"], [100])  # a record, once written, is what later plans read (the shards are not re-read)
    assert length_record(tmp_path, 2) == {"a": (2, 10), "b": (2, 6)}
    assert length_record(tmp_path, 3) == {"a": (2, 10), "b": (2, 6)}  # iteration 3 not scored yet: nothing to add


def test_plan_round_costs_prompt_tokens_plus_expected_completion_and_pads_to_the_longest():
    from spotrl.config import RolloutConfig
    from spotrl.model.tokenizers import CharTokenizer
    from spotrl.rollout.shards import plan_round

    tokenizer = CharTokenizer()
    prompts = pd.DataFrame({"id": [10, 11, 12, 13], "prompt": ["1+1=", "12+34=", "9=", "123+4="]})
    record = {"11": (2, 20)}  # prompt 11: two completions of 10 tokens on average; the rest: the running mean
    rollout = RolloutConfig(prompts_per_iteration=4, shards=2, max_new_tokens=8)
    plan = plan_round(prompts, tokenizer, record, rollout)
    lengths = [len(tokenizer.encode_batch_left_padded([p])[1][0]) for p in prompts["prompt"]]
    costs = [lengths[0] + 10.0, lengths[1] + 10.0, lengths[2] + 10.0, lengths[3] + 10.0]
    assert plan["prompt_length"] == max(lengths)
    assert plan["shards"] == lpt_plan(costs, 2)
    assert plan["sizes"] == [2, 2] and sum(plan["predicted_costs"]) == pytest.approx(sum(costs))
    equal = plan_round(prompts, tokenizer, {}, rollout.model_copy(update={"plan": "equal"}))
    assert equal["shards"] == [[0, 1], [2, 3]]
    assert equal["predicted_costs"] == [lengths[0] + lengths[1] + 8.0, lengths[2] + lengths[3] + 8.0]  # 8/2 each
