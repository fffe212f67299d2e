"""The no-label countdown problem as a run: rewards are reasoning-gym's verdicts, and a scorer that fails
fails the reward stage (nothing is scored 0 for it)."""

import json

import numpy as np
import pandas as pd
import pytest

from spotrl.configs import build_config
from spotrl.storage.parquet import read_frame
from spotrl.storage.rollouts import find_shard, write_shard

COUNTDOWN_OVERRIDES = [
    "problem.name=countdown",
    "model.vocab_size=21",
    "problem.train_size=200",
    "problem.eval_size=16",
    "warmstart.max_steps=20",
    "warmstart.target_greedy_accuracy=1.0",
    "rollout.max_new_tokens=10",
]


@pytest.fixture
def countdown_config(tiny_config):
    return build_config(tiny_config.model_dump(mode="json"), COUNTDOWN_OVERRIDES)


@pytest.mark.slow
def test_countdown_trains_end_to_end_with_reasoning_gym_rewards(prefect_harness, tmp_path, countdown_config):
    import reasoning_gym

    from spotrl.curation.store import load_split
    from spotrl.flows import rundir
    from spotrl.flows.train import train

    run = tmp_path / "run"
    result = train(config=countdown_config, run_dir=str(run))
    assert [m["iteration"] for m in rundir.read_records(run, "metrics")] == [1, 2]
    assert result["after"]["weights_version"] == 2
    train_rows = load_split(run / "data", "train")
    assert all("expression" not in a and '"answer"' not in a for a in train_rows["answer"])  # no solution
    scorer = reasoning_gym.create_dataset("countdown", size=1, seed=0)  # the scorer, in this process
    for iteration in (1, 2):
        scored = read_frame(find_shard(run / "rollouts", iteration, 0, "scored"))
        expected = [
            float(stopped and scorer.score_answer(c.strip(), json.loads(a)["entry"]) >= 1.0)
            for c, a, stopped in zip(scored["completion"], scored["answer"], scored["stopped"])
        ]
        assert scored["task_reward"].tolist() == expected


def test_reward_stage_fails_when_the_scorer_fails(tmp_path, countdown_config):
    from spotrl.rewards.rgym import ScorerError
    from spotrl.tasks import stages

    good = json.dumps(
        {"dataset": "countdown", "options": {}, "entry": {"metadata": {"numbers": [3, 5, 7], "target": 22}}}
    )
    bad = json.dumps({"dataset": "no_such_dataset", "options": {}, "entry": {}})  # score_answer cannot run
    run = tmp_path / "run"
    g = countdown_config.rollout.group_size
    frame = pd.DataFrame(
        {
            "prompt_id": ["a"] * g + ["b"] * g,
            "prompt": ["3 5 7=22"] * 2 * g,
            "answer": [good] * g + [bad] * g,
            "sample": np.tile(np.arange(g), 2),
            "completion": ["3*5+7"] * 2 * g,
            "tokens": [np.zeros(4, np.int32)] * 2 * g,
            "logprobs": [np.zeros(4, np.float32)] * 2 * g,
            "length": [4] * 2 * g,
            "stopped": [True] * 2 * g,
            "weights_version": 0,
        }
    )
    path, sha256 = write_shard(run / "rollouts", 1, 0, "rollouts", frame)
    ref = {"uri": str(path), "sha256": sha256, "iteration": 1, "shard": 0}
    with pytest.raises(ScorerError, match="no_such_dataset"):
        stages.reward.fn(countdown_config, str(run), ref)
    assert not list((run / "rollouts").rglob("scored_*"))
    # the same shard with only good references is scored 1.0
    frame["answer"] = good
    path, sha256 = write_shard(run / "rollouts", 2, 0, "rollouts", frame)
    scored = stages.reward.fn(countdown_config, str(run), {**ref, "uri": str(path), "sha256": sha256, "iteration": 2})
    assert read_frame(scored["uri"])["task_reward"].tolist() == [1.0] * 2 * g
