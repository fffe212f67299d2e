"""The built-in code problem as a training run: rewards come from the sandbox, and a sandbox that
fails is retried and reported, never scored 0."""

import json

import numpy as np
import pandas as pd
import pytest

from spotrl.configs import build_config
from spotrl.storage.parquet import read_frame
from spotrl.storage.rollouts import find_shard, write_shard

pytestmark = pytest.mark.slow  # end to end: whole runs of the train flow

CODE_OVERRIDES = [
    "problem.name=code",
    "model.vocab_size=100",
    "problem.train_size=16",
    "problem.eval_size=4",
    "rollout.max_new_tokens=104",  # the longest reference solution takes 103 tokens with EOS
    "rollout.prompts_per_iteration=4",
    "rollout.group_size=2",
    "rollout.shards=1",
    "algorithm.minibatches=1",
    "warmstart.max_steps=2",
    "warmstart.check_every=10",
    "warmstart.check_prompts=2",  # no greedy check: 1 compile less
    "eval.prompts=2",
    "eval.n=2",
    "eval.k=2",
    "problem.verify_workers=2",
]


@pytest.fixture
def code_config(tiny_config):
    return build_config(tiny_config.model_dump(mode="json"), CODE_OVERRIDES)


def test_code_problem_trains_end_to_end_with_sandbox_rewards(prefect_harness, tmp_path, code_config):
    from spotrl.curation.store import load_split
    from spotrl.flows import rundir
    from spotrl.flows.train import train
    from spotrl.rewards.code import extract_code
    from spotrl.rewards.sandbox.runner import Sandbox

    run = tmp_path / "run"
    result = train(config=code_config, run_dir=str(run))
    assert [m["iteration"] for m in rundir.read_records(run, "metrics")] == [1, 2]
    assert result["after"]["weights_version"] == 2
    split = load_split(run / "data", "train")
    tests = dict(zip(split["id"], split["answer"]))  # a code row's verifier reference is its tests
    sandbox = Sandbox()
    for iteration in (1, 2):
        scored = read_frame(find_shard(run / "rollouts", iteration, 0, "scored"))
        assert [tests[i] for i in scored["prompt_id"]] == scored["answer"].tolist()  # the verifier got the tests
        assert all(t.startswith("assert ") for t in scored["answer"])
        # each reward is the verdict of a fresh sandbox on that completion (0 for one that never stopped)
        stopped = scored["stopped"].to_numpy(bool)
        jobs = [(extract_code(c), t) for c, t in zip(scored["completion"][stopped], scored["answer"][stopped])]
        expected = np.zeros(len(scored))
        expected[stopped] = [result.reward for result in sandbox.run_many(jobs, workers=2)]
        assert scored["reward"].tolist() == expected.tolist()


def _shard(config, run, completions, stopped):
    from spotrl.problems import code as code_problem

    train, _ = code_problem.make_splits(0, 2, 1)
    meta = [json.loads(m) for m in train["metadata"]]
    g = config.rollout.group_size
    frame = pd.DataFrame(
        {
            "prompt_id": [i for i in train["id"] for _ in range(g)],
            "prompt": [p for p in train["prompt"] for _ in range(g)],
            "answer": [t for t in train["tests"] for _ in range(g)],
            "sample": np.tile(np.arange(g), 2),
            "completion": [c(m) for m in meta for c in completions],
            "tokens": [np.zeros(4, np.int32)] * 2 * g,
            "logprobs": [np.zeros(4, np.float32)] * 2 * g,
            "length": [4] * 2 * g,
            "stopped": stopped * 2,
            "weights_version": 0,
        }
    )
    path, sha256 = write_shard(run / "rollouts", 1, 0, "rollouts", frame)
    return {"uri": str(path), "sha256": sha256, "iteration": 1, "shard": 0}


def test_reward_stage_scores_code_in_the_sandbox_and_never_scores_its_failure_0(
    prefect_harness, tmp_path, code_config, monkeypatch
):
    from prefect import flow

    from spotrl.problems.code import completion_text
    from spotrl.rewards.sandbox import runner as sandbox_module
    from spotrl.tasks import stages

    config = build_config(code_config.model_dump(mode="json"), ["rollout.group_size=4", "problem.verify_workers=1"])
    run = tmp_path / "run"
    reference = lambda m: completion_text(m["reference"])  # noqa: E731
    wrong = lambda m: f"```python\ndef {m['entry_point']}(*args):\n    return None\n```"  # noqa: E731
    broken = lambda m: "```python\ndef oops(:\n```"  # noqa: E731
    ref = _shard(config, run, [reference, wrong, reference, broken], [True, True, False, True])
    scored = stages.reward.fn(config, str(run), ref)
    rewards = read_frame(scored["uri"])["reward"].tolist()
    # passes; wrong value; right code but cut off (no stop token); syntax error
    assert rewards == [1.0, 0.0, 0.0, 0.0] * 2

    # a sandbox that cannot start: each attempt fails after the sandbox's own retries, Prefect retries
    # the stage, and it ends Failed with the reason; nothing is scored
    failing = sandbox_module.Sandbox(python=str(tmp_path / "no-such-python"), backoff_s=0.0)
    monkeypatch.setattr(sandbox_module, "_DEFAULT", failing)
    for path in (run / "rollouts").rglob("scored_*"):
        path.unlink()

    @flow
    def score_once():
        state = stages.reward.with_options(result_storage=run / "prefect-results", refresh_cache=True)(
            config, str(run), ref, return_state=True
        )
        return state.type.value, state.message

    state, message = score_once()
    assert state == "FAILED" and "could not start the sandbox" in message
    attempts = 1 + stages.reward.retries
    assert failing.stats["infra_errors"] == attempts * (1 + failing.retries) and failing.stats["runs"] == 0
    assert not list((run / "rollouts").rglob("scored_*"))
