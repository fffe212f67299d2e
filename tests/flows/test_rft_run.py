"""`algorithm.name: rft` through the train flow: the same rollout and reward stages, an update that
trains on the verified completions, checkpoints and weights like any update; deterministic, and
a run killed inside an update resumes to the same weights."""

import math
import os

import pandas as pd
import pytest
from support import TINY_OVERRIDES

from spotrl.chaos import Kill, run_attempt, strip_timing
from spotrl.configs import build_config
from spotrl.flows import rundir
from spotrl.storage.parquet import read_frame
from spotrl.storage.records import read_jsonl
from spotrl.storage.rollouts import find_shard
from spotrl.storage.weights import WeightStore

pytestmark = pytest.mark.slow  # end to end: whole rft runs, killed and resumed

# the smoke preset on one-digit sums, with a warm start long enough that some samples verify
OVERRIDES = [o for o in TINY_OVERRIDES if not o.startswith("iterations=")] + [
    "iterations=3",
    "algorithm.name=rft",
    "problem.min_digits=1",
    "problem.max_digits=1",
    "problem.train_size=60",
    "problem.eval_size=16",
    "warmstart.max_steps=100",
    "warmstart.batch_size=32",
    "optimizer.learning_rate=1e-3",
    "weights.keep=5",  # every version stays, to compare each with the one before
]


@pytest.fixture(scope="module")
def rft_run(prefect_harness, tmp_path_factory):
    from spotrl.flows.train import train

    config = build_config(None, OVERRIDES)
    run_dir = tmp_path_factory.mktemp("rft") / "run"
    return run_dir, config, train(config=config, run_dir=str(run_dir))


def test_rft_trains_on_the_verified_rollouts_of_each_iteration(rft_run):
    run_dir, config, result = rft_run
    metrics = rundir.read_records(run_dir, "metrics")
    assert [m["iteration"] for m in metrics] == [1, 2, 3]
    assert result["after"]["iteration"] == 3
    batch_rows = config.rollout.prompts_per_iteration * config.rollout.group_size
    minibatch = batch_rows // config.algorithm.minibatches
    weights = WeightStore(run_dir / "weights")
    assert sum(m["kept_rows"] for m in metrics) > 0  # the warm start solves some: something is trained on
    for m in metrics:
        i = m["iteration"]
        scored = pd.concat(
            read_frame(find_shard(run_dir / "rollouts", i, s, "scored")) for s in range(config.rollout.shards)
        )
        verified = int((scored["task_reward"] >= config.algorithm.rft.min_reward).sum())
        assert m["kept_rows"] == verified and m["kept_fraction"] == pytest.approx(verified / batch_rows)
        assert m["optimizer_steps"] == config.algorithm.epochs * math.ceil(verified / minibatch)
        assert ("loss" in m) == (verified > 0) and ("clip_frac" not in m)
        # no verified completion, no step: the published weights are the previous version's
        same = weights.manifest(i)["sha256"] == weights.manifest(i - 1)["sha256"]
        assert same == (verified == 0)


def test_rft_run_is_deterministic_across_a_kill_inside_its_update(rft_run, tmp_path):
    from prefect.settings import PREFECT_API_URL

    finished, _, _ = rft_run
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    run_dir = tmp_path / "run"
    killed = run_attempt(run_dir, OVERRIDES, Kill(failpoint="update.step@2"), env=env)
    assert killed.was_killed, killed.output
    resumed = run_attempt(run_dir, OVERRIDES, env=env)
    assert resumed.returncode == 0, resumed.output
    assert "resuming after iteration 1" in resumed.output
    assert WeightStore(run_dir / "weights").verified_digest() == WeightStore(finished / "weights").verified_digest()
    for name in ("metrics.jsonl", "eval.jsonl"):
        assert [strip_timing(r) for r in read_jsonl(run_dir / name)] == [
            strip_timing(r) for r in read_jsonl(finished / name)
        ]
