"""Test isolation: Prefect gets its own temporary home, quiet logs and no analytics; the shared fixtures.

Set before anything imports prefect, since Prefect reads its settings at import time. What tests
share besides fixtures (constants, helpers) is in tests/support.py.
"""

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from spotrl.flows.testing import documented_commands, harness_server, isolate_prefect, retry_unavailable_transport
from spotrl.ports import free_port

isolate_prefect(tempfile.mkdtemp(prefix="spotrl-tests-prefect-"))

# Prefect configures logging at import (dictConfig), which closes every handler made before it,
# absl's too: absl's handler holds the sys.stderr of the moment, which under pytest is a capture
# file that must stay open. Imported here, before any test module imports absl (orbax, optax).
import prefect.main  # noqa: E402, F401 - prefect.main is what configures logging
import pytest  # noqa: E402
from support import TINY_OVERRIDES  # noqa: E402

from spotrl.configs import build_config  # noqa: E402


@pytest.fixture(scope="session")
def tiny_config():
    """A config whose whole flow runs in seconds: two RL iterations of a 2-layer model."""
    return build_config(None, TINY_OVERRIDES)


@pytest.fixture(scope="session")
def smoke_run(prefect_harness, tiny_config, tmp_path_factory):
    """A real run of the train flow (the smoke preset: two iterations), in this process; shared by
    the tests that only read a finished run (the report, the fleet simulator's calibration)."""
    from spotrl.flows import train as train_module

    run_dir = tmp_path_factory.mktemp("smoke-run")
    train_module.train(config=tiny_config, run_dir=str(run_dir))
    return run_dir


@pytest.fixture(scope="session")
def prefect_harness():
    with harness_server():
        yield


DEPLOYMENT_FILE = Path(__file__).resolve().parents[1] / "deployments" / "prefect.yaml"


class PrefectServer:
    """A real local Prefect server (SQLite) set up by the `$` lines of deployments/prefect.yaml's
    header, as a user types them: the server, `prefect config set PREFECT_API_URL`, the `spotrl`
    process pool, the deployments (and their triggers), and a process worker. What the test adds: a
    free port instead of 4200, `--limit 2` for the worker, a 1 s polling interval, and a project
    directory of its own (links to spotrl/ and deployments/), so relative run directories stay out of
    the checkout. The documented `prefect deployment run` lines are left to the test (`documented_runs`).
    Talk to it with `api` (an httpx client on its REST API) or `cli` (the prefect CLI); `log("worker")`
    is the worker's output."""

    def __init__(self, repo: Path, base: Path):
        import httpx

        self.logs = base / "logs"
        self.logs.mkdir(parents=True)
        self.root = base / "project"
        self.root.mkdir()
        for name in ("spotrl", "deployments"):
            (self.root / name).symlink_to(repo / name)
        home = base / "prefect-home"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/api"
        self.env = dict(
            os.environ,
            PREFECT_HOME=str(home),
            PREFECT_API_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{home}/prefect.db",
            PREFECT_WORKER_QUERY_SECONDS="1",
            PREFECT_WORKER_PREFETCH_SECONDS="1",
        )
        for setting in ("PREFECT_API_URL", "PREFECT_RESULTS_LOCAL_STORAGE_PATH"):  # the profile's, as set below
            self.env.pop(setting, None)
        self.prefect = str(Path(sys.executable).parent / "prefect")
        self.api = httpx.Client(
            base_url=self.url, timeout=30, transport=retry_unavailable_transport()
        )  # a CI run once failed on a 503
        self._procs: list[subprocess.Popen] = []
        self.documented_runs: list[list[str]] = []

    def _spawn(self, name: str, args: list[str]) -> None:
        self._procs.append(
            subprocess.Popen(
                [self.prefect, *args],
                env=self.env,
                cwd=self.root,
                stdout=open(self.logs / f"{name}.log", "w"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )

    def _wait_healthy(self) -> None:
        import httpx

        deadline = time.monotonic() + 120
        while True:
            try:
                if self.api.get("/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"Prefect server at {self.url} not healthy after 120 s:\n{self.log('server')}")
            time.sleep(0.3)

    def start(self) -> "PrefectServer":
        for command in documented_commands(DEPLOYMENT_FILE):
            assert command[0] == "prefect", command
            args = [arg.replace("127.0.0.1:4200", f"127.0.0.1:{self.port}") for arg in command[1:]]
            if args[:2] == ["server", "start"]:
                self._spawn("server", [*args, "--host", "127.0.0.1", "--port", str(self.port)])
                self._wait_healthy()
            elif args[:2] == ["worker", "start"]:
                self._spawn("worker", [*args, "--limit", "2"])
            elif args[:2] == ["deployment", "run"]:
                self.documented_runs.append(args)
            else:
                self.cli(*args)
        return self

    def cli(self, *args: str, timeout: float = 180, check: bool = True) -> subprocess.CompletedProcess:
        out = subprocess.run(
            [self.prefect, *args], env=self.env, cwd=self.root, capture_output=True, text=True, timeout=timeout
        )
        if check and out.returncode != 0:
            raise RuntimeError(f"prefect {' '.join(args)} exited {out.returncode}:\n{out.stdout}{out.stderr}")
        return out

    def log(self, name: str, tail: int = 4000) -> str:
        return (self.logs / f"{name}.log").read_text()[-tail:]

    def stop(self) -> None:
        self.api.close()
        for proc in reversed(self._procs):  # the worker first, then the server
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(5)  # an idle worker sometimes ignores SIGTERM (Prefect 3.9)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    """One server + worker for the deployment and automation tests (a server start costs ~10 s)."""
    server = PrefectServer(DEPLOYMENT_FILE.parents[1], tmp_path_factory.mktemp("prefect-server"))
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def gcs():
    """A real GCS API: gcp-storage-emulator on a free port, reached through gcsfs (STORAGE_EMULATOR_HOST).

    Yields the gcsfs filesystem; each test module creates its own bucket.
    """
    port = free_port()
    emulator = Path(sys.executable).with_name("gcp-storage-emulator")
    process = subprocess.Popen(
        [str(emulator), "start", "--port", str(port), "--in-memory"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    saved = {k: os.environ.get(k) for k in ("STORAGE_EMULATOR_HOST", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT")}
    os.environ["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{port}"
    os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"  # else each gcsfs call waits out a gRPC timeout
    try:
        import gcsfs

        deadline = time.monotonic() + 30
        while True:
            try:
                fs = gcsfs.GCSFileSystem(skip_instance_cache=True)
                fs.ls("")
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)
        yield fs
    finally:
        process.terminate()
        process.wait(timeout=10)
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
