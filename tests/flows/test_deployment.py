"""A real local Prefect server (SQLite), a process worker, and `prefect deployment run`."""

import json

import pytest

from spotrl.flows import rundir


@pytest.mark.slow
def test_deployment_run_through_process_worker(prefect_server, tmp_path, tiny_config):
    run_dir = tmp_path / "deployed-run"
    params = {"config": tiny_config.model_dump(mode="json"), "run_dir": str(run_dir)}
    out = prefect_server.cli(
        "deployment",
        "run",
        "train/train",
        "--params",
        json.dumps(params),
        "--watch",
        "--watch-timeout",
        "300",
        timeout=360,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr + prefect_server.log("worker", 3000)
    assert "Completed" in out.stdout + out.stderr
    assert rundir.read_config(run_dir) == tiny_config
    assert [m["iteration"] for m in rundir.read_records(run_dir, "metrics")] == [1, 2]
    assert (run_dir / "weights" / "LATEST").read_text().strip() == "2"
