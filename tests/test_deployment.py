"""A real local Prefect server (SQLite), a process worker, and `prefect deployment run`."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from spotrl.flows import rundir

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"Prefect server at {url} not healthy after {timeout}s")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.slow
def test_deployment_run_through_process_worker(tmp_path, tiny_config):
    home = tmp_path / "prefect-home"
    port = _free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = dict(os.environ, PREFECT_HOME=str(home), PREFECT_API_URL=api,
               PREFECT_API_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{home}/prefect.db",
               PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_LOGGING_LEVEL="WARNING")
    env.pop("PREFECT_RESULTS_LOCAL_STORAGE_PATH", None)
    prefect = str(BIN / "prefect")
    logs = tmp_path / "logs"
    logs.mkdir()
    server = subprocess.Popen([prefect, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                              env=env, cwd=tmp_path, stdout=open(logs / "server.log", "w"),
                              stderr=subprocess.STDOUT, start_new_session=True)
    worker = None
    try:
        _wait_healthy(api, 120)
        run = lambda *args: subprocess.run([prefect, *args], env=env, cwd=ROOT, check=True,
                                           capture_output=True, text=True, timeout=180)
        run("work-pool", "create", "spotrl", "--type", "process")
        run("--no-prompt", "deploy", "--all", "--prefect-file", "deployments/prefect.yaml")
        worker = subprocess.Popen([prefect, "worker", "start", "--pool", "spotrl", "--limit", "1"],
                                  env=env, cwd=ROOT, stdout=open(logs / "worker.log", "w"),
                                  stderr=subprocess.STDOUT, start_new_session=True)
        run_dir = tmp_path / "deployed-run"
        params = {"config": tiny_config.model_dump(mode="json"), "run_dir": str(run_dir)}
        out = subprocess.run([prefect, "deployment", "run", "train/train", "--params", json.dumps(params),
                              "--watch", "--watch-timeout", "300"],
                             env=env, cwd=ROOT, capture_output=True, text=True, timeout=360)
        assert out.returncode == 0, out.stdout + out.stderr + (logs / "worker.log").read_text()[-3000:]
        assert "Completed" in out.stdout + out.stderr
        assert rundir.read_config(run_dir) == tiny_config
        assert [m["iteration"] for m in rundir.read_records(run_dir, "metrics")] == [1, 2]
        assert (run_dir / "weights" / "LATEST").read_text().strip() == "2"
    finally:
        if worker is not None:
            _stop(worker)
        _stop(server)
