"""The whole train flow on a tiny config, against a real (test-harness) Prefect server."""

import json

import pytest

from spotrl.cli.main import main as cli_main
from spotrl.flows import rundir
from spotrl.storage.atomic import sha256_file
from spotrl.storage.parquet import read_frame
from spotrl.storage.rollouts import find_shard

pytestmark = pytest.mark.slow  # end to end: a whole run of the train flow


@pytest.fixture(scope="module")
def finished_run(prefect_harness, tiny_config, tmp_path_factory):
    from spotrl.flows.iteration import Stages
    from spotrl.flows.train import train

    run_dir = tmp_path_factory.mktemp("run")
    launches, launch = [], Stages.launch

    def recorded_launch(stages, iteration, number, weights, *args):
        launches.append((iteration, weights["version"], number))
        return launch(stages, iteration, number, weights, *args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Stages, "launch", recorded_launch)
        result = train(config=tiny_config, run_dir=str(run_dir))
    return run_dir, {**result, "launches": launches}


def test_run_directory_contract(finished_run, tiny_config):
    run_dir, result = finished_run
    assert rundir.read_config(run_dir) == tiny_config
    metrics = rundir.read_records(run_dir, "metrics")
    assert [m["iteration"] for m in metrics] == [1, 2]
    for m in metrics:
        assert {"iteration", "reward_mean", "tokens_per_s", "seconds", "loss", "staleness"} <= m.keys()
        assert 0.0 <= m["reward_mean"] <= 1.0 and m["tokens_per_s"] > 0 and m["staleness"] == 0
    evals = rundir.read_records(run_dir, "eval")
    assert [(e["iteration"], e["weights_version"]) for e in evals] == [(0, 0), (2, 2)]
    assert all(e["k"] == 2 and 0 <= e["pass_at_1"] <= e["pass_at_k"] <= 1 for e in evals)
    assert result["before"] == evals[0] and result["after"] == evals[-1]
    assert (run_dir / "weights" / "LATEST").read_text().strip() == "2"
    assert (run_dir / "checkpoints" / "iter_000002.sealed.json").exists()
    assert any((run_dir / "prefect-results").iterdir())


def test_each_iteration_is_generated_once(finished_run):
    """Rollouts of iteration i are launched once, with weights i-1 (a relaunch after they were
    collected would be a cache hit, so the result would not show it, but it would leave tasks no one
    waits for, which outlive the flow)."""
    _, result = finished_run
    assert result["launches"] == [(1, 0, 0), (2, 1, 0)]


def test_rollout_shards_carry_version_and_match_rewards(finished_run, tiny_config):
    run_dir, _ = finished_run
    r = tiny_config.rollout
    frames = [read_frame(find_shard(run_dir / "rollouts", 2, s, "scored")) for s in range(r.shards)]
    frame = __import__("pandas").concat(frames)
    assert len(frame) == r.prompts_per_iteration * r.group_size
    assert set(frame["weights_version"]) == {1}  # on-policy: iteration 2 samples with version 1
    for _, row in frame.iterrows():
        expected = float(row["stopped"] and row["completion"][::-1] == row["answer"])
        assert row["reward"] == expected
    metrics = rundir.read_records(run_dir, "metrics")[1]
    assert metrics["reward_mean"] == pytest.approx(frame["reward"].mean())


def test_rerun_of_the_finished_run_returns_the_same_weights_and_result_faster(finished_run, tiny_config):
    """A finished run resumes after its last iteration: nothing is sampled or trained again."""
    from spotrl.flows.train import train

    run_dir, first = finished_run
    second = train(config=tiny_config, run_dir=str(run_dir))
    assert second["weights_sha256"] == first["weights_sha256"]
    assert second["after"] == first["after"]  # the last evaluation's record, not sampled again
    assert second["seconds"] < first["seconds"]


def test_digest_and_eval_commands(finished_run, capsys):
    run_dir, result = finished_run
    assert cli_main(["digest", "--run-dir", str(run_dir)]) == 0
    digest = capsys.readouterr().out.strip()
    assert digest == result["weights_sha256"] == sha256_file(run_dir / "weights" / "v000002" / "model.safetensors")
    assert cli_main(["eval", "--run-dir", str(run_dir), "--json"]) == 0
    ev = json.loads(capsys.readouterr().out)
    # the same weights, the same eval seed: the same numbers as the flow's final evaluation
    assert ev["pass_at_1"] == result["after"]["pass_at_1"] and ev["pass_at_k"] == result["after"]["pass_at_k"]


def test_cli_refuses_bad_config_before_any_work(tmp_path, capsys):
    assert cli_main(["train", "--run-dir", str(tmp_path / "r"), "--set", "eval.k=99"]) == 2
    assert "eval.k" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
