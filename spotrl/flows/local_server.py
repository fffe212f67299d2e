"""A local Prefect API server for `spotrl train` that dies with the process that started it.

Without PREFECT_API_URL, Prefect starts a temporary ("ephemeral") server as a plain child process.
When `spotrl train` is SIGKILLed (the OOM killer, `kill -9`, a preemption without notice) that child
lives on, holding the SQLite database that the resumed run's own server then competes for. So the
CLI starts the same server itself, through a tiny launcher that asks Linux to SIGTERM it when its
parent dies (prctl PR_SET_PDEATHSIG survives exec), and points Prefect at it. With PREFECT_API_URL
set (a shared server), nothing is started.

    python -m spotrl.flows.local_server PARENT_PID -- COMMAND...   (the launcher)
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import os
import signal
import subprocess
import sys
import time
import uuid

from spotrl.ports import free_port

_PR_SET_PDEATHSIG = 1


def _server_command(port: int) -> list[str]:
    import prefect

    return [
        sys.executable,
        "-m",
        "uvicorn",
        "--app-dir",
        str(prefect.__module_path__.parent),
        "--factory",
        "prefect.server.api.server:create_app",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "error",
        "--lifespan",
        "on",
    ]


class LocalServerError(RuntimeError):
    """The private server did not start: the environment's fault (no port, an overloaded machine), not the run's."""


def _wait_healthy(process: subprocess.Popen, url: str, timeout: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise LocalServerError(f"the local Prefect server exited with code {process.returncode} while starting")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise LocalServerError(
        f"the local Prefect server at {url} did not answer in {timeout:.0f} s (is the machine overloaded?); "
        "run the same command again, or point PREFECT_API_URL at a running server"
    )


# Services a private server of one local flow run has no use for (schedules, deployments' late runs,
# workers' heartbeats, automations, clean-ups); each wakes up periodically on the cores the run
# trains on. The task-run recorder and event persister stay: they are what the UI shows.
_IDLE_SERVICES = (
    "SCHEDULER",
    "LATE_RUNS",
    "FOREMAN",
    "PAUSE_EXPIRATIONS",
    "REPOSSESSOR",
    "CLEANUP_RECONCILER",
    "TRIGGERS",
    "CANCELLATION_CLEANUP",
)

# The task-run recorder writes each task-run event in a transaction of its own by default (batch
# size 1): ~14 ms of server CPU per task run on these cores, more than the flow's own engine.
# Batched, the task runs reach the UI up to a second later at about a third of the cost. The event
# persister flushes every second too (its default, every 5 s or 20 events, would hold the server's
# stop up to 5 s: it is stopped once the last event is written, see `_wait_recorded`).
_BATCHING = {
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "100",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL": "1",
    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_BATCH_SIZE": "100",
    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_FLUSH_INTERVAL": "1",
}

# The server only records what the run did: at the lowest CPU priority it works in the gaps XLA
# leaves instead of preempting the training threads (no task waits on it, events are sent async).
# It starts at its parent's priority, though: the flow waits for its start (imports, migrations: a
# few CPU-seconds), which at niceness 19 on a busy machine took longer than any sane limit.
SERVER_NICENESS = 19


def lower_priority(pid: int, niceness: int) -> None:
    """Set the niceness of every thread of `pid` (Linux keeps it per thread; new threads inherit their creator's)."""
    tasks = f"/proc/{pid}/task"
    for _ in range(2):  # a thread started while the first pass ran is caught by the second
        for tid in os.listdir(tasks) if os.path.isdir(tasks) else [pid]:
            with contextlib.suppress(ProcessLookupError):
                os.setpriority(os.PRIO_PROCESS, int(tid), niceness)


@contextlib.contextmanager
def local_api_server(timeout: float = 120.0):
    """Point Prefect at a private server for the duration; yields the server's process (None if shared)."""
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    if PREFECT_API_URL.value():
        yield None
        return
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = {
        **_BATCHING,
        **os.environ,
        **get_current_settings().to_environment_variables(exclude_unset=True),
        "PREFECT_UI_ENABLED": "0",
        "PREFECT__SERVER_EPHEMERAL": "1",
        "PREFECT__SERVER_FINAL": "1",
        # its telemetry heartbeat writes a session row at start, racing the migrations ("database is locked")
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        **{f"PREFECT_SERVER_SERVICES_{name}_ENABLED": "false" for name in _IDLE_SERVICES},
    }
    command = [sys.executable, "-m", "spotrl.flows.local_server", str(os.getpid()), "--", *_server_command(port)]
    started = datetime.datetime.now(datetime.UTC)
    process = subprocess.Popen(command, env=env)
    try:
        _wait_healthy(process, url, timeout)
        lower_priority(process.pid, SERVER_NICENESS)
        with temporary_settings(updates={PREFECT_API_URL: url}):
            try:
                yield process
            finally:
                _drain_prefect_workers()
                _wait_recorded(url, started)
    finally:
        stop(process)


def _drain_prefect_workers() -> None:
    """Send queued logs and events before the server goes, instead of failing to at interpreter exit."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        try:
            worker.drain_all(timeout=5)
        except Exception:  # noqa: BLE001 - best effort: a worker that never started has nothing to send
            pass


# task-run states that are not final: a task run left in one after its flow ended was not recorded
_OPEN_STATES = ("SCHEDULED", "PENDING", "RUNNING", "PAUSED", "CANCELLING")


def _wait_recorded(
    url: str, since: datetime.datetime, settle: float = 2.5, settle_answers: int = 4, timeout: float = 30.0
) -> None:
    """Let the server write what it holds before it is stopped.

    Its task-run recorder and event persister write in batches, and stopping the server cancels a
    batch being written: SQLAlchemy logs the interrupted transaction with a traceback on the
    terminal, and task runs stay non-final in its database. Under load the niced server lags behind
    the flow by many batches, and answers slowly. The client has drained its queues, so the events
    are on the server; wait until the persister has written one more, sent now (it writes events in
    the order they arrive), and the task runs of this server's lifetime and the events have stopped
    changing for `settle` seconds (a few flush intervals) and `settle_answers` answers (a server
    that answers slowly flushes slowly too). Give up after `timeout` seconds without progress;
    what is still unwritten then gets one line, not a trace.
    """
    import httpx

    last_event = str(uuid.uuid4())
    stopping = {
        "id": last_event,
        "occurred": datetime.datetime.now(datetime.UTC).isoformat(),
        "event": "spotrl.local-server.stopping",
        "resource": {"prefect.resource.id": "spotrl.local-server"},
    }
    window = {"expected_start_time": {"after_": since.isoformat()}}
    queries = ({"task_runs": window}, {"task_runs": {**window, "state": {"type": {"any_": list(_OPEN_STATES)}}}})
    events, by_id = {"limit": 0}, {"filter": {"id": {"id": [last_event]}}, "limit": 0}  # their number only
    last, persisted, answers = None, False, 0
    stable_since = time.monotonic()
    deadline = stable_since + timeout
    try:
        with httpx.Client(base_url=url) as client:

            def ask(path: str, body):  # a late answer is no failure: wait for it as long as the deadline allows
                answer = client.post(path, json=body, timeout=max(deadline - time.monotonic(), 0.1))
                return answer.raise_for_status().json() if answer.content else None

            ask("/events", [stopping])
            while True:
                counts = (
                    *(ask("/task_runs/count", query) for query in queries),
                    ask("/events/filter", events)["total"],
                )
                found = persisted or ask("/events/filter", by_id)["total"] > 0
                now = time.monotonic()
                if counts != last or found != persisted:
                    last, persisted, answers, stable_since, deadline = counts, found, 0, now, now + timeout
                answers += 1
                if (persisted and now - stable_since >= settle and answers >= settle_answers) or now >= deadline:
                    break
                time.sleep(0.25)
    except httpx.TimeoutException:
        pass  # the deadline passed while the server was answering: told below, as any deadline
    except httpx.HTTPError as err:
        print(f"spotrl: warning: could not check what the local Prefect server recorded ({err})", file=sys.stderr)
        return
    if last is None:
        print(f"spotrl: warning: the local Prefect server did not answer in {timeout:.0f} s", file=sys.stderr)
        return
    if last[1]:
        print(
            f"spotrl: warning: {last[1]} of {last[0]} task runs were not in a final state when the local Prefect "
            "server stopped (their states in its database are stale)",
            file=sys.stderr,
        )
    if not persisted:
        print(
            f"spotrl: warning: the local Prefect server had not written all events after {timeout:.0f} s "
            "without progress; stopping it (the newest may be missing from its event feed)",
            file=sys.stderr,
        )


def stop(process: subprocess.Popen | None) -> None:
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _launch(parent_pid: int, command: list[str]) -> None:
    """Arrange SIGTERM on the parent's death, then become `command`."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:  # the parent died before the death signal was armed
        sys.exit(1)
    os.execv(command[0], command)


if __name__ == "__main__":
    _parent, _sep, *_command = sys.argv[1:]
    _launch(int(_parent), _command)
