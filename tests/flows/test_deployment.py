"""The deployment path as a user meets it: the documented commands on a real local Prefect server
(SQLite) and process worker (the `prefect_server` fixture ran the set-up lines), then what the UI
shows of the runs: names, task run names, the run's own lines in its logs, the resolved config."""

import json
import re
import time

import pytest

from spotrl.configs import load_config
from spotrl.flows import rundir

pytestmark = pytest.mark.slow


def _wait_finished(server, flow_run_id: str, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        run = server.api.get(f"/flow_runs/{flow_run_id}").raise_for_status().json()
        if run["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            return run
        if time.monotonic() > deadline:
            pytest.fail(f"flow run {flow_run_id} not finished after {timeout} s\n{server.log('worker')}")
        time.sleep(0.5)


def test_the_documented_runs_train_a_preset_and_a_changed_key_and_show_in_the_ui(prefect_server):
    assert [run[-1] for run in prefect_server.documented_runs] == ["run_dir=runs/smoke", "run_dir=runs/smoke-3"]
    ids = []
    for args in prefect_server.documented_runs:
        out = prefect_server.cli(*args)
        ids.append(re.search(r"UUID: ([0-9a-f-]{36})", out.stdout).group(1))
    runs = [_wait_finished(prefect_server, i) for i in ids]
    assert [r["state"]["name"] for r in runs] == ["Completed", "Completed"], prefect_server.log("worker")

    # a preset by name, and one key changed over it
    smoke, smoke3 = prefect_server.root / "runs" / "smoke", prefect_server.root / "runs" / "smoke-3"
    assert rundir.read_config(smoke) == load_config("smoke")
    assert rundir.read_config(smoke3) == load_config("smoke", ["iterations=3"])
    assert [m["iteration"] for m in rundir.read_records(smoke3, "metrics")] == [1, 2, 3]
    assert (smoke3 / "weights" / "LATEST").read_text().strip() == "3"

    # runs and task runs one can tell apart
    assert [r["name"] for r in runs] == ["runs/smoke attempt 1", "runs/smoke-3 attempt 1"]
    task_runs = (
        prefect_server.api.post("/task_runs/filter", json={"flow_runs": {"id": {"any_": [ids[1]]}}, "limit": 200})
        .raise_for_status()
        .json()
    )
    names = {t["name"] for t in task_runs}
    expected = {f"{stage}-i{i:04d}" for i in (1, 2, 3) for stage in ("update", "checkpoint", "publish")}
    expected |= {f"{stage}-i{i:04d}-s{s}" for i in (1, 2, 3) for s in (0, 1) for stage in ("rollout", "reward")}
    assert expected <= names, sorted(names)
    assert {t["state"]["type"] for t in task_runs} == {"COMPLETED"}

    # the run's own lines are in its Prefect logs, not only on the worker's terminal
    logs = prefect_server.cli("flow-run", "logs", ids[1]).stdout
    for line in (f"run directory: {smoke3}", "warm start:", "iteration    3/3  reward", "pass@1", "pass@2"):
        assert line in logs, logs[-3000:]

    # the resolved config and its digest, whatever was passed
    artifacts = (
        prefect_server.api.post("/artifacts/filter", json={"artifacts": {"flow_run_id": {"any_": [ids[1]]}}})
        .raise_for_status()
        .json()
    )
    by_key = {}
    for artifact in sorted(artifacts, key=lambda a: a["created"]):
        by_key.setdefault(artifact["key"], []).append(artifact)
    assert set(by_key) == {"run-config", "training-progress", "held-out-pass-at-k", "run-summary"}
    expected_config = load_config("smoke", ["iterations=3"])
    (config_artifact,) = by_key["run-config"]
    assert expected_config.digest() in config_artifact["data"] and "iterations: 3" in config_artifact["data"]

    # progress, the held-out table (its last version: every evaluation), the summary `spotrl train` prints
    (progress,) = by_key["training-progress"]
    assert progress["type"] == "progress" and float(progress["data"]) == 100.0
    table = json.loads(by_key["held-out-pass-at-k"][-1]["data"])
    evals = rundir.read_records(smoke3, "eval")
    assert [row["iteration"] for row in table] == [e["iteration"] for e in evals] == [0, 3]
    assert [row["pass@1"] for row in table] == [f"{e['pass_at_1']:.1%}" for e in evals]
    (summary,) = by_key["run-summary"]
    assert "held-out pass@1" in summary["data"] and f"run directory: {smoke3}" in summary["data"]
    assert (smoke3 / "weights" / "LATEST").read_text().strip() == "3"


def test_every_config_key_has_help_in_the_run_form(prefect_server):
    deployment = prefect_server.api.get("/deployments/name/train/train").raise_for_status().json()
    schema = deployment["parameter_openapi_schema"]
    assert {"config", "preset", "run_dir"} <= set(schema["properties"])
    missing = [
        f"{name}.{key}"
        for name, model in schema["definitions"].items()
        for key, prop in model.get("properties", {}).items()
        if not prop.get("description")
    ]
    assert not missing, missing


def test_a_bad_preset_fails_the_run_naming_it(prefect_server):
    out = prefect_server.cli(
        "deployment", "run", "train/train", "--param", "preset=no-such-preset", "--param", "run_dir=runs/bad"
    )
    run = _wait_finished(prefect_server, re.search(r"UUID: ([0-9a-f-]{36})", out.stdout).group(1))
    assert run["state"]["name"] == "Failed" and "no preset 'no-such-preset'" in run["state"]["message"]
    assert not (prefect_server.root / "runs" / "bad").exists()  # refused before any work
