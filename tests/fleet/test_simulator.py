"""The discrete-event simulator on timelines worked out by hand, and its invariants under preemptions.

The hand model is tests/fleet_fixtures.py's HAND: every completion 100 tokens, a shard of p prompts takes
1 + 2p s, a cold start 10 s, a pull 1 s, the trainer 5 s per iteration (update + publish).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from fleet_fixtures import HAND

from spotrl.fleet.fleet_model import LONG_TAILED, with_overrides
from spotrl.fleet.simulator import simulate
from spotrl.fleet.sizing import FleetPolicy, predict


def test_two_synchronous_iterations_by_hand():
    # W=2, shards of 4 prompts (9 s): cold 10, pull 1, generate 9 -> 20; train 5 -> 25.
    # Iteration 2: pull 1 + generate 9 + train 5 -> 40.
    r = simulate(HAND, 2, "fixed", iterations=2)
    assert r.iteration_seconds == pytest.approx((25, 15))
    assert r.seconds_per_iteration == pytest.approx(20)
    # billed: 2 workers x 40 s at $0.001/s, the trainer 40 s at $0.01/s
    assert r.cost_per_iteration == pytest.approx((2 * 40 * 0.001 + 40 * 0.01) / 2)
    assert r.idle_fraction == pytest.approx(1 - (2 * 2 * 9) / (2 * 40))
    assert (r.work_lost_s_per_iteration, r.preemptions, r.workers_mean) == (0, 0, 2)


def test_staleness_one_overlaps_by_hand():
    # k=1: iterations 1 and 2 sample with v0 and start at once. Workers: cold 10, pull v0 11, iteration 1's
    # shards 11-20, iteration 2's 20-29. Trainer: iteration 1 at 20-25 publishes v1 and launches iteration 3
    # (v1); iteration 2 at 29-34. Iteration 3's shards wait for the workers (29), pull v1 (30) and end at 39;
    # trained at 44.
    r = simulate(HAND, 2, "async_k1", iterations=3)
    assert r.iteration_seconds == pytest.approx((25, 9, 10))
    assert r.seconds_per_iteration == pytest.approx(44 / 3)


def test_steady_iterations_match_the_analytic_prediction():
    r = simulate(HAND, 4, "fixed", iterations=4)
    assert r.iteration_seconds[1:] == pytest.approx((predict(HAND, 4).seconds,) * 3)


def test_the_fleet_shrinks_between_iterations_by_hand():
    # 4 workers for iteration 1 (shards of 2 prompts: 5 s): 10 + 1 + 5 + 5 -> 21. Iteration 2 on 2
    # workers: the two idle ones leave at 21; shards of 4 prompts: 21 + 1 + 9 + 5 -> 36.
    counts = iter((4, 2))
    policy = FleetPolicy("shrink", 0, lambda model, size, current: next(counts))
    r = simulate(HAND, 4, policy, iterations=2)
    assert r.iteration_seconds == pytest.approx((21, 15))
    assert r.workers_mean == 3
    billed = 2 * 36 + 2 * 21
    assert r.cost_per_iteration == pytest.approx((billed * 0.001 + 36 * 0.01) / 2)
    assert r.idle_fraction == pytest.approx(1 - (4 * 5 + 2 * 9) / billed)


def test_busy_time_is_the_sum_of_shard_times_of_the_drawn_lengths():
    """A naive reference: draw the same lengths, split the prompts the same way, add up the shards."""
    model = with_overrides(LONG_TAILED, {"market.preemptions_per_hour": 0})
    iterations, workers = 3, 64
    r = simulate(model, workers, "fixed", iterations=iterations, seed=5)
    w, speed = model.workload, model.worker
    busy = 0.0
    for i in range(1, iterations + 1):
        lengths = w.lengths.draw(np.random.default_rng([5, 1, i]), (w.prompts, w.group_size))
        for block in np.array_split(np.arange(w.prompts), workers):
            busy += speed.shard_seconds(lengths[block].sum(), lengths[block].max())
    billed = workers * r.seconds_per_iteration * iterations  # no preemption: every worker lives throughout
    assert r.idle_fraction == pytest.approx(1 - busy / billed)


def test_same_seed_same_result_and_preemptions_lose_work():
    model = with_overrides(LONG_TAILED, {"market.preemptions_per_hour": 2.0, "market.notice_s": 0.0})
    a, b = simulate(model, 64, "fixed", iterations=4, seed=1), simulate(model, 64, "fixed", iterations=4, seed=1)
    assert a == b
    assert simulate(model, 64, "fixed", iterations=4, seed=2) != a
    assert a.preemptions > 0 and a.work_lost_s_per_iteration > 0 and 0 < a.work_lost_fraction < 1
    calm = simulate(with_overrides(model, {"market.preemptions_per_hour": 0}), 64, "fixed", iterations=4, seed=1)
    assert calm.preemptions == 0 and calm.work_lost_s_per_iteration == 0
    assert a.seconds_per_iteration > calm.seconds_per_iteration  # redone shards and cold replacements


def test_a_long_notice_keeps_every_shard():
    """Each shard ends within an hour's notice: preempted workers finish what they hold, nothing is lost."""
    model = with_overrides(LONG_TAILED, {"market.preemptions_per_hour": 2.0, "market.notice_s": 3600.0})
    r = simulate(model, 64, "fixed", iterations=3, seed=1)
    assert r.preemptions > 0 and r.work_lost_s_per_iteration == 0


def test_on_demand_workers_are_never_preempted_and_cost_more():
    spot = with_overrides(LONG_TAILED, {"market.preemptions_per_hour": 0})
    on_demand = dataclasses.replace(spot, market=dataclasses.replace(spot.market, spot=False))
    a, b = simulate(spot, 8, "fixed", iterations=2), simulate(on_demand, 8, "fixed", iterations=2)
    assert a.seconds_per_iteration == b.seconds_per_iteration and b.cost_per_iteration > a.cost_per_iteration


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="fleet_size"):
        simulate(HAND, 0)
    with pytest.raises(ValueError, match="no fleet policy 'nope'"):
        simulate(HAND, 2, "nope")
