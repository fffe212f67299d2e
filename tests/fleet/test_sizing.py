"""The analytic iteration time and cost, and the cost-aware choice, on hand-computed cases.

The hand model (tests/fleet_fixtures.py, HAND): 8 prompts x 2 completions of exactly 100 tokens (sigma 0), a worker at
100 tok/s with 1 s per shard, no latency floor, 10 s cold start; update 2 s + 0.001 s/token
(1,600 tokens: 1.6 s) + 0.4 s overhead; 1 GB weights published and pulled at 1 GB/s; a worker
$3.6/h ($0.001/s), the trainer $36/h ($0.01/s), no preemptions. For W workers (one shard each,
ceil(8/W) prompts per shard):

    W   tokens/shard  generation  rollout (+1 s pull)  seconds (+5 s train)  cost = s x (0.001 W + 0.01)
    1       1600          17            18                    23                 0.253
    2        800           9            10                    15                 0.180
    3        600           7             8                    13                 0.169
    4        400           5             6                    11                 0.154
    5..7     400           5             6                    11                 0.165, 0.176, 0.187
    8        200           3             4                     9                 0.162
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from fleet_fixtures import HAND

from spotrl.fleet.fleet_model import Lengths, as_dict, with_overrides
from spotrl.fleet.sizing import POLICIES, Objective, choose_workers, predict

SECONDS = {1: 23, 2: 15, 3: 13, 4: 11, 5: 11, 6: 11, 7: 11, 8: 9}


@pytest.mark.parametrize("workers", sorted(SECONDS))
def test_predicted_time_and_cost_by_hand(workers):
    p = predict(HAND, workers)
    assert p.seconds == pytest.approx(SECONDS[workers])
    assert p.train_seconds == pytest.approx(5.0)
    assert p.cost == pytest.approx(SECONDS[workers] * (0.001 * workers + 0.01))


def test_staleness_overlaps_generation_with_the_update():
    assert predict(HAND, 2, staleness=1).seconds == pytest.approx(max(10, 5))
    assert predict(HAND, 8, staleness=2).seconds == pytest.approx(max(4, 5))


def test_new_workers_pay_their_cold_start_over_the_horizon():
    p = predict(HAND, 2, new_workers=2, horizon=10)
    assert p.seconds == pytest.approx(15 + 10 / 10)
    assert p.cost == pytest.approx(16 * 0.012 + 2 * 10 * 0.001 / 10)


def test_on_demand_price_and_the_preemption_delay():
    on_demand = with_overrides(HAND, {"market.spot": "false", "market.preemptions_per_hour": "3.6"})
    assert predict(on_demand, 2).cost == pytest.approx(15 * (2 * 0.002 + 0.01))  # on demand: never preempted
    spot = with_overrides(HAND, {"market.preemptions_per_hour": 3.6})  # 0.001 per worker-second
    hit = 1 - math.exp(-0.001 * 2 * 9)  # some shard of the two is hit during its 9 s
    assert predict(spot, 2).seconds == pytest.approx(15 + hit * 9 / 2)


def test_fixed_shards_run_in_waves():
    fixed = with_overrides(HAND, {"workload.shards": 4})  # 4 shards of 2 prompts (400 tokens, 5 s each)
    assert predict(fixed, 2).seconds == pytest.approx(1 + 2 * 5 + 5)
    assert predict(fixed, 4).seconds == pytest.approx(1 + 5 + 5)


def test_store_egress_is_shared_by_the_workers_pulling():
    capped = with_overrides(HAND, {"network.store_bytes_per_s": 4e9})  # 4 GB/s over 8 workers: 0.5 GB/s each
    assert predict(capped, 8).seconds == pytest.approx(9 - 1 + 2)
    assert predict(capped, 4).seconds == pytest.approx(11)  # 1 GB/s each: the worker's own link


@pytest.mark.parametrize(
    "objective, workers, feasible",
    [
        (Objective("min_cost", deadline_slack=0.1), 8, True),  # within 9.9 s: only W=8
        (Objective("min_cost", deadline_slack=0.25), 4, True),  # within 11.25 s: W=4..8, W=4 cheapest
        (Objective("min_cost", deadline_s=15), 4, True),  # W=2..8 meet it; W=4 cheapest (0.154)
        (Objective("min_cost", deadline_s=16), 4, True),
        (Objective("min_cost", deadline_s=5), 8, False),  # nothing meets it: the fastest
        (Objective("min_time"), 8, True),  # no budget: the fastest
        (Objective("min_time", budget=0.16), 4, True),  # W=8 costs 0.162
        (Objective("min_time", budget=0.17), 8, True),  # W=3, 4, 5, 8 within it: W=8 fastest
        (Objective("min_time", budget=0.1), 4, False),  # nothing within budget: the cheapest
    ],
)
def test_choose_workers_by_hand(objective, workers, feasible):
    decision = choose_workers(HAND, objective, max_workers=8, current=8)
    assert (decision.workers, decision.feasible) == (workers, feasible)
    assert decision.predicted == predict(HAND, workers)


def test_choose_workers_respects_the_cap_and_prefers_warm_workers():
    assert choose_workers(HAND, Objective("min_time"), max_workers=3, current=3).workers == 3
    # from 4 warm workers, 8 would be faster (9 s) but 4 new workers cost 10 s / horizon 1 more: 4 stays
    decision = choose_workers(HAND, Objective("min_time"), max_workers=8, current=4, horizon=1)
    assert decision.workers == 4 and decision.predicted.seconds == pytest.approx(11)
    with pytest.raises(ValueError, match="max_workers"):
        choose_workers(HAND, Objective(), max_workers=0)


def test_capped_lognormal_moments_and_quantiles_match_sampling():
    lengths = Lengths(median=600, sigma=1.0, max_tokens=2000)
    draws = np.minimum(np.random.default_rng(0).lognormal(math.log(600), 1.0, 2_000_000), 2000)
    assert lengths.mean() == pytest.approx(draws.mean(), rel=2e-3)
    assert lengths.std() == pytest.approx(draws.std(), rel=5e-3)
    assert lengths.longest(3) == pytest.approx(np.quantile(draws, 0.75), rel=1e-2)
    assert Lengths(median=600, sigma=1.0, max_tokens=8192).longest(10**6) == 8192  # the cap
    measured = Lengths(samples=(1, 2, 3, 10))
    assert measured.mean() == 4 and measured.draw(np.random.default_rng(0), 100).max() <= 10


def test_overrides_name_the_bad_key_and_convert_types():
    model = with_overrides(HAND, {"worker.tokens_per_s": "250", "market.spot": "false", "workload.prompts": "16"})
    assert (model.worker.tokens_per_s, model.market.spot, model.workload.prompts) == (250.0, False, 16)
    with pytest.raises(KeyError, match="worker.nope"):
        with_overrides(HAND, {"worker.nope": 1})
    assert as_dict(with_overrides(HAND, {"workload.lengths.samples": "3,5"}))["workload"]["lengths"]["measured"] == {
        "count": 2,
        "mean": 4.0,
        "max": 5,
    }


def test_the_policies_by_name():
    assert POLICIES.names() == ["async_k1", "async_k2", "cost_aware", "fixed"]
    assert [POLICIES[n].staleness for n in ("fixed", "cost_aware", "async_k1", "async_k2")] == [0, 0, 1, 2]
    assert POLICIES["fixed"].workers(HAND, 64, 0) == 64
    assert POLICIES["cost_aware"].workers(HAND, 8, 8) == 8  # min cost within 1.1x the fastest (9 s): W=8
