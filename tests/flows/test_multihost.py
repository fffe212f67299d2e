"""The trainer across processes: two CPU processes (one device each, JAX's gloo collectives) train
the smoke run on one 2-device mesh and end with the weights, bit for bit, of one process with 2 devices."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spotrl.ports import free_port

REPO = Path(__file__).resolve().parents[2]
# fsdp over 2 devices: parameters, gradients and optimizer moments are split between the processes;
# an entropy bonus gives the RL updates a gradient even when no group earns a reward
RUN = ["-m", "spotrl", "train", "--config", "smoke", "--set", "model.mesh.fsdp=2"]
RUN += ["--set", "algorithm.entropy_coef=0.01"]


def _digest(run_dir: Path, version: int | None = None) -> str:
    from spotrl.storage.weights import WeightStore

    store = WeightStore(run_dir / "weights")
    return store.digest(store.resolve(version))


@pytest.mark.slow
def test_two_processes_train_to_the_weights_of_one(tmp_path, prefect_harness):
    from prefect.settings import PREFECT_API_URL

    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(PYTHONPATH=str(REPO), PREFECT_API_URL=PREFECT_API_URL.value())

    one = subprocess.run(
        [sys.executable, *RUN, "--run-dir", str(tmp_path / "one")],
        env={**env, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert one.returncode == 0, one.stderr[-3000:]

    distributed = {"SPOTRL_NUM_PROCESSES": "2", "SPOTRL_COORDINATOR_ADDRESS": f"127.0.0.1:{free_port()}"}
    procs = [  # every host runs the same command; process 0 drives the flow, process 1 follows
        subprocess.Popen(
            [sys.executable, *RUN, "--run-dir", str(tmp_path / "two")],
            env={**env, **distributed, "SPOTRL_PROCESS_ID": str(i)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    (lead_out, lead_err), (follow_out, follow_err) = [p.communicate(timeout=600) for p in procs]
    assert procs[0].returncode == 0, lead_err[-3000:]
    assert procs[1].returncode == 0, follow_err[-3000:]

    two = tmp_path / "two"
    assert _digest(two) == _digest(tmp_path / "one")
    assert _digest(two) != _digest(two, 0)  # the RL updates changed the weights: the comparison covers them
    # process 1 ran every trainer stage: the warm start, 2 updates, 3 publishes (v0, v1, v2)
    assert "ran 6 stages" in follow_out, follow_out[-2000:]
    assert "update" in follow_out and "rollout" not in follow_out  # rollouts run in process 0 only
    # orbax: each process wrote the shards on its own device
    state = two / "checkpoints" / "iter_000002" / "state"
    assert (state / "ocdbt.process_0").is_dir() and (state / "ocdbt.process_1").is_dir()
    metrics = [json.loads(line) for line in (two / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in metrics] == [1, 2]  # written once, by process 0
    one_metrics = [json.loads(line) for line in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()]
    assert [m["loss"] for m in metrics] == [m["loss"] for m in one_metrics]
