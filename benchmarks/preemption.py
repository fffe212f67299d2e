"""Preemption cost: work redone per kill, and time from restart to the first new task.

Runs a small config uninterrupted, then the same config killed at several moments (inside rollout,
update, checkpoint writing, weight publishing, and at random) and resumed after each kill, all
against one local Prefect server. From Prefect's own task-run records it measures:

  redone_seconds   task time run twice: the part of the task each kill interrupted, plus any
                   finished task that ran again (its cache key completed in an earlier attempt)
  redone_fraction  redone_seconds / the uninterrupted run's wall time
  restart_to_first_new_task_s   launch of the resumed process -> start of its first task that is
                   not a cache hit (imports, connecting, resume scan, cache lookups)

It also times one restart with the CLI's private server (no PREFECT_API_URL), which adds the
server start, and runs the config once more with rollouts on a local Ray whose worker SIGKILLs
itself in the middle of a rollout shard (failpoint rollout.sample: sampled, not yet written). Ray
runs that shard again on another worker, inside the same flow run; from the task run's state
history it measures

  rollout_worker_kill.redone_s        the killed attempt's time: its first Running -> the kill
  rollout_worker_kill.retry_delay_s   the kill -> the shard Running again on another worker

and checks the weights digest against the uninterrupted run. Prints a table, then one JSON object
as the last line.

    python benchmarks/preemption.py [--iterations 8] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TINY = [
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.num_layers=2",
    "problem.train_size=2000",
    "problem.eval_size=40",
    "warmstart.max_steps=20",
    "rollout.prompts_per_iteration=8",
    "rollout.group_size=4",
    "rollout.shards=2",
    "algorithm.minibatches=2",
    "eval.n=4",
    "eval.k=2",
    "eval.prompts=16",
]


def _task_runs(client, run_dir: Path):
    """Per flow run of this run directory (oldest first): its task runs."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.sorting import FlowRunSort

    def every(read, **kwargs):  # the API pages at 200
        found, offset = [], 0
        while page := read(limit=200, offset=offset, **kwargs):
            found += page
            offset += len(page)
        return found

    flow_runs = [
        fr
        for fr in every(client.read_flow_runs, sort=FlowRunSort.EXPECTED_START_TIME_ASC)
        if fr.parameters.get("run_dir") == str(run_dir)
    ]
    return [
        (fr, every(client.read_task_runs, flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[fr.id]))))
        for fr in flow_runs
    ]


def _measure(runs, attempts) -> dict:
    completed_keys: set[str] = set()
    per_kill, restarts = [], []
    for (_flow_run, tasks), attempt in zip(runs, attempts):
        redone = 0.0
        for task in tasks:
            state = task.state.name if task.state else ""
            if state == "Completed" and task.cache_key in completed_keys:
                redone += task.total_run_time.total_seconds()  # finished before, ran again
            # the next attempt marks what the kill left Running as Crashed (flows/crashes.py)
            if state in ("Running", "Crashed") and attempt.killed_at and task.start_time:
                redone += max(0.0, attempt.killed_at - task.start_time.timestamp())  # cut short by the kill
        completed_keys |= {t.cache_key for t in tasks if t.state and t.state.name == "Completed" and t.cache_key}
        new = [t.start_time.timestamp() for t in tasks if t.start_time and t.state and t.state.name != "Cached"]
        if attempt is not attempts[0] and new:
            restarts.append(min(new) - attempt.started)
        if attempt.was_killed:
            per_kill.append({"kill": attempt.kill.describe(), "redone_s": round(redone, 3)})
        elif redone:
            per_kill.append({"kill": "(resume)", "redone_s": round(redone, 3)})
    return {"per_kill": per_kill, "restarts": restarts}


def _rollout_worker_kill(client_factory, home: Path, overrides: list[str], env: dict, iteration: int) -> dict:
    """A Ray run whose rollout worker dies mid-shard at `iteration`: the work redone (see the docstring)."""
    from spotrl.chaos import Kill, run_attempt

    killed = home / "ray-killed-pid"
    run_dir = home / "ray-kill"
    attempt = run_attempt(
        run_dir,
        overrides + ["rollout.task_runner=ray"],
        Kill(failpoint=f"rollout.sample@{iteration}"),
        env={**env, "SPOTRL_KILL_ONCE": str(killed)},
    )
    assert attempt.returncode == 0, attempt.output  # the flow itself never died
    killed_at = killed.stat().st_mtime  # written just before the SIGKILL
    with client_factory() as client:
        (_flow_run, tasks), *later = _task_runs(client, run_dir)
        assert not later, "one flow run: the kill cost no restart"
        retried = []
        for task in tasks:
            if not task.name.startswith(f"rollout-i{iteration:04d}"):
                continue
            running = [s.timestamp.timestamp() for s in client.read_task_run_states(task.id) if s.name == "Running"]
            if len(running) > 1:
                retried.append((task.name, running))
    assert len(retried) == 1, retried  # only the killed worker's shard ran twice
    name, running = retried[0]
    return {
        "shard": name,
        "redone_s": round(killed_at - running[0], 3),
        "retry_delay_s": round(running[1] - killed_at, 3),
        "run_dir": run_dir,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="spotrl-bench-preemption-"))
    from spotrl.flows.testing import harness_server, isolate_prefect

    isolate_prefect(home / "prefect")
    from prefect.client.orchestration import get_client

    from spotrl.chaos import Kill, run_attempt, standard_kills, strip_timing
    from spotrl.storage.records import read_jsonl

    overrides = TINY + [f"iterations={args.iterations}"]
    with harness_server() as api_url:
        env = {**os.environ, "PREFECT_API_URL": api_url}
        baseline_dir, chaos_dir = home / "baseline", home / "chaos"
        baseline = run_attempt(baseline_dir, overrides, env=env)
        assert baseline.returncode == 0, baseline.output
        baseline_seconds = baseline.ended - baseline.started

        attempts = [
            run_attempt(chaos_dir, overrides, kill, env=env) for kill in standard_kills(args.iterations, args.seed)
        ]
        attempts.append(run_attempt(chaos_dir, overrides, env=env))
        assert attempts[-1].returncode == 0, attempts[-1].output
        with get_client(sync_client=True) as client:
            measured = _measure(_task_runs(client, chaos_dir), attempts)
            base_tasks = _task_runs(client, baseline_dir)[0][1]
        baseline_task_seconds = sum(t.total_run_time.total_seconds() for t in base_tasks)
        ray_kill = _rollout_worker_kill(lambda: get_client(sync_client=True), home, overrides, env, 2)

    # one more kill and resume with the CLI's private server (what `spotrl train` does by default)
    private_env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    private_dir = home / "private"
    run_attempt(private_dir, overrides, Kill(after_line="iteration    2/"), env=private_env)
    first_iteration = {}
    resumed = run_attempt(
        private_dir,
        overrides,
        env=private_env,
        on_line=lambda process, line: (
            first_iteration.setdefault("t", time.time()) if line.startswith("iteration") else None
        ),
    )
    assert resumed.returncode == 0, resumed.output

    from spotrl.storage.weights import WeightStore

    digests_equal = (
        WeightStore(chaos_dir / "weights").verified_digest() == WeightStore(baseline_dir / "weights").verified_digest()
    )
    metrics_equal = [strip_timing(r) for r in read_jsonl(chaos_dir / "metrics.jsonl")] == [
        strip_timing(r) for r in read_jsonl(baseline_dir / "metrics.jsonl")
    ]
    baseline_digest = WeightStore(baseline_dir / "weights").verified_digest()
    ray_kill["digest_equal"] = WeightStore(ray_kill.pop("run_dir") / "weights").verified_digest() == baseline_digest
    kills = [k for k in measured["per_kill"] if k["kill"] != "(resume)"]
    redone = sum(k["redone_s"] for k in measured["per_kill"])
    figures = {
        "iterations": args.iterations,
        "kills": len(kills),
        "digests_equal": digests_equal,
        "metrics_equal_without_timing": metrics_equal,
        "uninterrupted_seconds": round(baseline_seconds, 2),
        "uninterrupted_task_seconds": round(baseline_task_seconds, 3),
        "redone_seconds": round(redone, 3),
        "redone_fraction": round(redone / baseline_seconds, 4),
        "redone_seconds_per_kill_median": round(statistics.median(k["redone_s"] for k in kills), 3) if kills else None,
        "restart_to_first_new_task_s_median": round(statistics.median(measured["restarts"]), 2),
        "restart_to_first_new_task_s_max": round(max(measured["restarts"]), 2),
        "private_server_restart_to_first_iteration_s": round(first_iteration["t"] - resumed.started, 2),
        "rollout_worker_kill": ray_kill,
    }
    print(f"{'kill':<48} redone (s)")
    for k in measured["per_kill"]:
        print(f"{k['kill']:<48} {k['redone_s']:.3f}")
    for key, value in figures.items():
        print(f"{key:<48} {value}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
