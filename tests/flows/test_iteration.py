"""flows/iteration.py without Prefect: the look-ahead's schedule, the metrics record and the log line.

The stages here record what they are asked and return small references: the look-ahead decides
which iteration samples with which weights version and when, which must not depend on what the
stages compute (tests/flows/test_train.py runs the real ones).
"""

from spotrl.config import RunConfig
from spotrl.flows.fleet import RolloutFleet
from spotrl.flows.iteration import Collected, LookAhead, Round, iteration_line, iteration_metrics


class _Done:
    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


class RecordingStages:
    """Launches rounds whose shards have `signal[(iteration, round)]` groups with signal."""

    def __init__(self, config: RunConfig, signal=None):
        self.config, self.signal = config, signal or {}
        self.launched, self.estimated = [], []

    def launch(self, iteration, number, weights, runner=None, difficulty=None) -> Round:
        self.launched.append((iteration, number, weights["version"], difficulty and difficulty["at"]))
        groups = self.signal.get((iteration, number), 0)
        sampled = _Done([{"round": number, "iteration": iteration}])
        scored = _Done([{"round": number, "groups_with_signal": groups}])
        return Round(iteration, number, weights, difficulty, {"round": number}, sampled, scored)

    def difficulty(self, iteration, weights_version) -> dict:
        self.estimated.append((iteration, weights_version))
        return {"at": iteration, "stream_rows": 1, "never_solved": 0, "always_solved": 0, "estimated": 1}


class Store:
    def ref(self, version):
        return {"version": version, "from": "store"}


def _look_ahead(tmp_path, start=1, signal=None, **overrides):
    config = RunConfig(**overrides)
    stages = RecordingStages(config, signal)
    ahead = LookAhead(stages, RolloutFleet(config, tmp_path), start, {"version": start - 1}, Store())
    return ahead, stages


def test_without_staleness_each_iteration_launches_once_its_predecessor_is_published(tmp_path):
    ahead, stages = _look_ahead(tmp_path, iterations=3)
    ahead.collect(1)
    assert stages.launched == [(1, 0, 0, None)]
    ahead.publish({"version": 1})
    assert stages.launched[-1] == (2, 0, 1, None)
    ahead.collect(2)  # launched already: not again
    ahead.publish({"version": 2})
    ahead.collect(3)
    ahead.publish({"version": 3})  # past the last iteration: nothing
    assert [(i, v) for i, _, v, _ in stages.launched] == [(1, 0), (2, 1), (3, 2)]


def test_staleness_two_runs_two_iterations_ahead_and_a_resume_takes_older_versions_from_the_store(tmp_path):
    ahead, stages = _look_ahead(tmp_path, iterations=6, rollout={"max_staleness": 2})
    ahead.launch_ready(1)
    assert [(i, v) for i, _, v, _ in stages.launched] == [(1, 0), (2, 0), (3, 0)]
    ahead.publish({"version": 1})
    assert stages.launched[-1][:3] == (4, 0, 1)
    # resuming after iteration 4: iteration 5 samples with v2, 6 with v3 (from the store), v4 is given
    ahead, stages = _look_ahead(tmp_path, start=5, iterations=6, rollout={"max_staleness": 2})
    assert ahead.published == {
        4: {"version": 4},
        2: {"version": 2, "from": "store"},
        3: {"version": 3, "from": "store"},
    }
    ahead.launch_ready(5)
    assert [(i, v) for i, _, v, _ in stages.launched] == [(5, 2), (6, 3)]


def test_dynamic_sampling_adds_rounds_with_the_same_weights_until_enough_groups_have_signal(tmp_path):
    signal = {(1, 0): 10, (1, 1): 20, (1, 2): 40, (1, 3): 64}
    ds = {"dynamic_sampling": {"enabled": True, "max_rounds": 4}}
    ahead, stages = _look_ahead(tmp_path, signal=signal, iterations=2, algorithm=ds)
    collected = ahead.collect(1)
    # 10 + 20 + 40 = 70 >= 64 prompts after round 2: round 3 never runs
    assert stages.launched == [(1, 0, 0, None), (1, 1, 0, None), (1, 2, 0, None)]
    assert [p["round"] for p in collected.plans] == [0, 1, 2]
    assert [r["round"] for r in collected.rollouts] == [0, 1, 2] == [s["round"] for s in collected.scored]
    ahead, stages = _look_ahead(
        tmp_path, iterations=2, algorithm={"dynamic_sampling": {"enabled": True, "max_rounds": 2}}
    )
    assert len(ahead.collect(1).plans) == 3  # no signal at all: 1 + max_rounds rounds


def test_difficulty_is_estimated_once_per_period_with_the_estimating_iterations_weights(tmp_path):
    ahead, stages = _look_ahead(
        tmp_path, iterations=5, rollout={"max_staleness": 1}, curation={"difficulty": {"every": 2, "samples": 2}}
    )
    ahead.launch_ready(1)
    ahead.publish({"version": 1})
    ahead.publish({"version": 2})
    ahead.publish({"version": 3})
    # iterations 1, 2 filter by the estimate before 1 (made with v0); 3, 4 by the one before 3 (v1); 5: before 5 (v3)
    assert stages.estimated == [(1, 0), (3, 1), (5, 3)]
    assert [(i, at) for i, _, _, at in stages.launched] == [(1, 1), (2, 1), (3, 3), (4, 3), (5, 5)]


def test_iteration_metrics_by_hand():
    rollouts = [  # round 0 on two shards (1 s and 3 s), round 1 on one (2 s)
        {"round": 0, "tokens": 30, "rollout_seconds": 1.0, "weights_version": 4, "worker": "b"},
        {"round": 0, "tokens": 10, "rollout_seconds": 3.0, "weights_version": 4, "worker": "a"},
        {"round": 1, "tokens": 20, "rollout_seconds": 2.0, "weights_version": 4, "worker": "a"},
    ]
    scored = [
        {"rows": 8, "reward_sum": 2.0, "shaped_reward_sum": 1.0, "length_sum": 16},
        {"rows": 8, "reward_sum": 6.0, "shaped_reward_sum": 5.0, "length_sum": 32},
    ]
    plans = [{"round": 0, "sizes": [2, 2], "predicted_costs": [1.0, 2.0], "rows": [9]}]
    updated = {"uri": "x", "iteration": 6, "update_seconds": 0.5, "loss": 0.25}
    m = iteration_metrics(6, Collected(rollouts, scored, plans), updated, {"version": 6}, 9.0, 2)
    assert m["staleness"] == 6 - 1 - 4 and m["generation_rounds"] == 2
    assert m["reward_mean"] == 8.0 / 16 and m["shaped_reward_mean"] == 6.0 / 16 and m["completion_length_mean"] == 3.0
    assert m["rollout_plan"] == [{"round": 0, "sizes": [2, 2], "predicted_costs": [1.0, 2.0]}]
    assert m["loss"] == 0.25 and "uri" not in m and "update_seconds" not in m
    assert m["timing"]["rollout_seconds"] == 3.0 + 2.0 and m["tokens_per_s"] == 60 / 5.0
    # round 0 holds 2 workers for 3 s, busy 4 s; round 1 one worker 2 s, busy 2 s: 1 - 6/8
    assert m["timing"]["rollout_idle_fraction"] == 1 - 6 / 8
    assert m["timing"]["rollout_workers"] == ["a", "b"] and m["timing"]["compilations"] == 2


def test_iteration_line_says_loss_and_clip_or_rfts_kept_share():
    m = {
        "iteration": 7,
        "reward_mean": 0.5,
        "loss": -0.01234,
        "clip_frac": 0.125,
        "tokens_per_s": 12345.6,
        "seconds": 0.8,
    }
    assert iteration_line(m, 200) == "iteration    7/200  reward 0.500  loss -0.0123  clip 0.125  12,346 tok/s  0.80s"
    rft = {k: v for k, v in m.items() if k not in ("loss", "clip_frac")} | {"kept_fraction": 0.25}
    assert iteration_line(rft, 9) == "iteration    7/9  reward 0.500  loss    none  kept 0.250  12,346 tok/s  0.80s"
