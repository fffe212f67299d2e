"""Kill `spotrl train` at many moments, resume each time, and end bit-for-bit where an uninterrupted run ends.

Real processes, real SIGKILL and SIGTERM, a real Prefect server (the session harness; one test uses
the CLI's private server to check that nothing is left behind).
"""

import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support import TINY_OVERRIDES

from spotrl.chaos import Kill, run_attempt, standard_kills, strip_timing, train_command
from spotrl.flows.preemption import EXIT_PREEMPTED
from spotrl.storage.checkpoints import CheckpointStore
from spotrl.storage.failures import EXIT_ENVIRONMENT
from spotrl.storage.records import read_jsonl
from spotrl.storage.weights import WeightStore

pytestmark = pytest.mark.slow  # end to end: kills and resumes of whole runs

ITERATIONS = 8
OVERRIDES = [o for o in TINY_OVERRIDES if not o.startswith("iterations=")] + [
    f"iterations={ITERATIONS}",
    "eval.every=4",
    # the smoke preset earns no reward here: the entropy bonus makes every update change the weights,
    # so "the same digest" says something about the resumed updates
    "algorithm.entropy_coef=0.01",
]


@pytest.fixture(scope="module")
def server_env(prefect_harness):
    from prefect.settings import PREFECT_API_URL

    return {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}


@pytest.fixture(scope="module")
def private_server_env():
    return {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}


@pytest.fixture(scope="module")
def baseline(server_env, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("baseline")
    attempt = run_attempt(run_dir, OVERRIDES, env=server_env)
    assert attempt.returncode == 0, attempt.output
    versions = WeightStore(run_dir / "weights")
    assert len({versions.digest(v) for v in versions.versions()}) > 1  # the updates change the weights
    return run_dir


def _same_run(run_dir: Path, baseline: Path) -> None:
    assert WeightStore(run_dir / "weights").verified_digest() == WeightStore(baseline / "weights").verified_digest()
    for name in ("metrics.jsonl", "eval.jsonl"):
        ours, theirs = read_jsonl(run_dir / name), read_jsonl(baseline / name)
        assert len(ours) == len(theirs) > 0
        assert [strip_timing(r) for r in ours] == [strip_timing(r) for r in theirs]


def test_strip_timing_drops_exactly_timing_fields():
    record = {
        "iteration": 3,
        "seconds": 1.0,
        "tokens_per_s": 9.0,
        "eval_time": 2,
        "timing": {"a": 1},
        "loss": 0.5,
        "nested": {"update_seconds": 1, "kl": 0.1},
    }
    assert strip_timing(record) == {"iteration": 3, "loss": 0.5, "nested": {"kl": 0.1}}


def test_chaos_kills_then_resume_ends_bit_for_bit(baseline, server_env, tmp_path):
    run_dir = tmp_path / "chaos"
    attempts = [run_attempt(run_dir, OVERRIDES, kill, env=server_env) for kill in standard_kills(ITERATIONS, seed=3)]
    for attempt in attempts:
        assert attempt.returncode in (-signal.SIGKILL, 0), attempt.output
    failpoint_kills = [a for a in attempts if a.kill.failpoint]
    assert all(a.was_killed for a in failpoint_kills), [a.kill.describe() for a in failpoint_kills if not a.was_killed]
    assert sum(a.was_killed for a in attempts) >= len(failpoint_kills) + 1
    final = run_attempt(run_dir, OVERRIDES, env=server_env)
    assert final.returncode == 0, final.output
    # every resumed attempt continued from a complete iteration and never went backwards
    resumed = [
        int(line.split()[3])
        for a in attempts[1:] + [final]
        for line in a.output.splitlines()
        if line.startswith("resuming after iteration")
    ]
    assert resumed == sorted(resumed) and len(resumed) >= len(attempts) - 1
    _same_run(run_dir, baseline)
    _nothing_left_open(run_dir, runs=len(attempts) + 1)
    _each_point_once(run_dir)


def _each_point_once(run_dir: Path) -> None:
    """TensorBoard got every iteration and evaluation exactly once across the kills and resumes."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    points = [
        (value.tag, event.step)
        for path in sorted((run_dir / "tensorboard").glob("events.out.tfevents.*"))
        for event in EventFileLoader(str(path)).Load()
        for value in event.summary.value
    ]
    assert len(points) == len(set(points)), sorted(p for p in set(points) if points.count(p) > 1)
    steps = sorted(step for tag, step in points if tag == "train/reward_mean")
    assert steps == [m["iteration"] for m in read_jsonl(run_dir / "metrics.jsonl")] == list(range(1, ITERATIONS + 1))
    evals = sorted(step for tag, step in points if tag == "eval/pass_at_1")
    assert evals == [e["iteration"] for e in read_jsonl(run_dir / "eval.jsonl")]


def _nothing_left_open(run_dir: Path, runs: int) -> None:
    """Every flow run on `run_dir` and every task run of them is final: each resume closed what its
    SIGKILLed predecessors left Running (flows/crashes.py)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas import filters

    with get_client(sync_client=True) as client:
        flow_runs = [
            r
            for r in client.read_flow_runs(
                flow_run_filter=filters.FlowRunFilter(name=filters.FlowRunFilterName(like_=str(run_dir))), limit=200
            )
            if r.parameters.get("run_dir") == str(run_dir)
        ]
        task_runs = client.read_task_runs(
            flow_run_filter=filters.FlowRunFilter(id=filters.FlowRunFilterId(any_=[r.id for r in flow_runs])),
            limit=200,
        )
    assert len(flow_runs) == runs
    assert sorted(r.state.name for r in flow_runs) == ["Completed"] + ["Crashed"] * (runs - 1)
    assert {t.state.type.value for t in task_runs} <= {"COMPLETED", "CRASHED"}, [
        (t.name, t.state.name) for t in task_runs if not t.state.is_final()
    ]


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc to find child processes")
def test_sigterm_checkpoints_exits_preempted_and_resumes(baseline, server_env, private_server_env, tmp_path):
    run_dir = tmp_path / "sigterm"
    server_pids = []

    def preempt(process, line):
        if line.startswith("iteration    3/") and not server_pids:
            server_pids.extend(_children(process.pid))
            process.send_signal(signal.SIGTERM)

    attempt = run_attempt(run_dir, OVERRIDES, env=private_server_env, on_line=preempt)
    assert attempt.returncode == EXIT_PREEMPTED, attempt.output
    assert "preempted by SIGTERM" in attempt.output
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    sealed = CheckpointStore(run_dir / "checkpoints").sealed_iterations()
    assert 3 <= metrics[-1]["iteration"] <= sealed[-1] < ITERATIONS  # stopped early, after a checkpoint
    assert server_pids and all(_gone(pid, within=10) for pid in server_pids)

    resumed = run_attempt(run_dir, OVERRIDES, env=server_env)
    assert resumed.returncode == 0, resumed.output
    assert f"resuming after iteration {metrics[-1]['iteration']}" in resumed.output
    _same_run(run_dir, baseline)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc to find child processes")
def test_sigkill_leaves_no_process_behind(private_server_env, tmp_path):
    children = []

    def record(process, line):
        if line.startswith("iteration    1/") and not children:
            children.extend(_children(process.pid))

    kill = Kill(after_line="iteration    1/", delay=0.0)
    attempt = run_attempt(tmp_path / "run", OVERRIDES, kill, env=private_server_env, on_line=record)
    assert attempt.was_killed
    assert children, "the CLI should have started its private Prefect server"
    assert all(_gone(pid, within=10) for pid in children)


def _private_mounts() -> list[str] | None:
    """A command prefix that runs its command in a private mount namespace (so a test may mount a tmpfs)."""
    for prefix in (["unshare", "-m"], ["unshare", "-rm"]):
        try:
            probe = subprocess.run([*prefix, "sh", "-c", "mount -t tmpfs tmpfs /mnt"], capture_output=True)
        except FileNotFoundError:
            return None
        if probe.returncode == 0:
            return prefix
    return None


@pytest.mark.skipif(_private_mounts() is None, reason="needs unshare and mount to make a small filesystem")
def test_a_full_disk_then_a_read_only_one_end_with_one_line_and_the_rerun_ends_bit_for_bit(
    baseline, private_server_env, tmp_path
):
    """The run directory on a tmpfs too small for the run: one line, exit 74, nothing committed damaged;
    then the same directory read-only: the same; then room again: the rerun ends where the baseline ends."""
    used_kib = int(subprocess.run(["du", "-sk", str(baseline)], capture_output=True, text=True).stdout.split()[0])
    run, out = tmp_path / "run", tmp_path / "out"
    run.mkdir()
    out.mkdir()
    train = shlex.join(train_command(run, OVERRIDES))
    script = f"""
        mount -t tmpfs -o size={used_kib * 6 // 10}k tmpfs {run}
        {train} > {out}/full.log 2>&1; echo $? > {out}/full.rc
        cp -a {run} {out}/after-full
        mount -o remount,ro {run}
        {train} > {out}/read-only.log 2>&1; echo $? > {out}/read-only.rc
        mount -o remount,rw,size=256m {run}
        {train} > {out}/roomy.log 2>&1; echo $? > {out}/roomy.rc
        cp -a {run} {out}/final
    """
    subprocess.run([*_private_mounts(), "bash", "-c", script], env=private_server_env, check=True, timeout=900)

    def ended(name: str, code: int, what: str) -> str:
        log = (out / f"{name}.log").read_text()
        assert int((out / f"{name}.rc").read_text()) == code, log
        assert log.splitlines()[-1].startswith(f"spotrl: error: {what}: "), log
        assert log.count("spotrl: error") == 1 and not {"Traceback", "ERROR", "Event loop"} & set(log.split()), log
        return log

    full = ended("full", EXIT_ENVIRONMENT, "no space left on device")
    assert f"Free space under {run}" in full and "then run the same command again" in full
    ended("read-only", EXIT_ENVIRONMENT, "read-only file system")

    # what had committed when the disk filled is whole: sealed checkpoints and the published weights verify
    checkpoints = CheckpointStore(out / "after-full" / "checkpoints")
    for iteration in checkpoints.sealed_iterations():
        checkpoints.verify(iteration)
    weights = WeightStore(out / "after-full" / "weights")
    assert weights.latest() is not None and weights.verified_digest()

    roomy = (out / "roomy.log").read_text()
    assert int((out / "roomy.rc").read_text()) == 0, roomy
    assert "resuming after iteration" in roomy
    _same_run(out / "final", baseline)
