"""`rollout.workers: auto` in a real run: the policy's decisions are recorded, and the worker count
changes when work runs, never what it computes."""

import pytest
from support import TINY_OVERRIDES

from spotrl.chaos import strip_timing
from spotrl.configs import build_config
from spotrl.flows import rundir
from spotrl.storage.weights import WeightStore


@pytest.mark.slow
def test_auto_workers_record_decisions_and_keep_the_digest(smoke_run, tmp_path):
    from spotrl.flows import train as train_module

    config = build_config(None, [*TINY_OVERRIDES, "iterations=3", "rollout.workers=auto"])
    run_dir = tmp_path / "auto"
    train_module.train(config=config, run_dir=str(run_dir))

    metrics = rundir.read_records(run_dir, "metrics")
    decisions = [m["timing"]["fleet"] for m in metrics]
    assert all(d["policy"] == "cost_aware" and 1 <= d["workers"] <= config.rollout.shards for d in decisions)
    # iteration i+1 is launched before iteration i is recorded: the first two have nothing measured yet
    assert [("reason" in d) for d in decisions] == [True, True, False]
    third = decisions[2]
    assert third["inputs"]["iterations"] == 1 and third["inputs"]["worker_tokens_per_s"] > 0
    assert third["predicted_seconds"] > 0 and third["predicted_cost"] > 0
    assert third["actual_seconds"] == metrics[2]["seconds"]
    price = config.fleet.spot_price_per_hour * third["workers"] + config.fleet.trainer_price_per_hour
    assert third["actual_cost"] == pytest.approx(metrics[2]["seconds"] * price / 3600)

    # the same rollouts and weights as the run that never heard of workers (the smoke run, 2 iterations)
    assert [strip_timing(m) for m in metrics[:2]] == [
        strip_timing(m) for m in rundir.read_records(smoke_run, "metrics")
    ]
    assert WeightStore(run_dir / "weights").verified_digest(2) == WeightStore(smoke_run / "weights").verified_digest(2)


def _record(iteration, seconds, compilations=0):
    timing = {"rollout_seconds": seconds / 2, "update_seconds": seconds / 4, "compilations": compilations}
    return {"iteration": iteration, "rollout_tokens": 400, "seconds": seconds, "timing": timing}


def test_fleet_runner_per_setting(tmp_path):
    from prefect.task_runners import ThreadPoolTaskRunner

    from spotrl.flows.fleet import RolloutFleet

    def fleet_for(*overrides):
        return RolloutFleet(build_config(None, [*TINY_OVERRIDES, *overrides]), tmp_path)

    with fleet_for() as fleet:  # no key: the flow's own runner, nothing recorded
        assert fleet.runner(1) is None
        metrics = {"seconds": 1.0, "timing": {}}
        fleet.record(1, metrics)
        assert metrics == {"seconds": 1.0, "timing": {}}

    with fleet_for("rollout.workers=1", "fleet.spot_price_per_hour=3.6", "fleet.trainer_price_per_hour=36") as fleet:
        pool = fleet.runner(1)
        assert isinstance(pool, ThreadPoolTaskRunner) and pool._max_workers == 1 and fleet.runner(1) is pool
        metrics = {"seconds": 10.0, "timing": {}}
        fleet.record(1, metrics)
        assert metrics["timing"]["fleet"] == {
            "workers": 1,
            "policy": "fixed",
            "actual_seconds": 10.0,
            "actual_cost": pytest.approx(10 * (0.001 + 0.01)),
        }
    assert fleet.pools == {}  # closed with the flow

    rundir.write_record(tmp_path, "metrics", 1, _record(1, 8.0, compilations=3))
    rundir.write_record(tmp_path, "metrics", 2, _record(2, 1.0))
    with fleet_for("rollout.workers=auto", "iterations=5") as fleet:
        fleet.runner(3)
        decision = fleet.decisions[3]
        assert decision["inputs"]["iterations"] == 2 and decision["inputs"]["steady_iterations"] == 1
        assert 1 <= decision["workers"] <= 2 and decision["predicted_seconds"] > 0
        assert fleet.runner(3)._max_workers == decision["workers"]  # decided once per iteration
    with fleet_for("rollout.workers=auto", "fleet.max_workers=1") as fleet:
        assert fleet.runner(3)._max_workers == 1
