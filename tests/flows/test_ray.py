"""Rollout shards fanned out over a real local Ray (prefect-ray) give the same run as the thread pool,
even when a Ray worker is SIGKILLed in the middle of a shard.

Each run is a `spotrl train` process of its own, so Ray never starts inside the test process (Ray's
threads next to JAX's in pytest's long-lived process are what we do not want to share a crash with).
"""

import os

import pytest
from support import LEARNING_OVERRIDES

from spotrl.chaos import Kill, run_attempt, strip_timing
from spotrl.storage.records import read_jsonl
from spotrl.storage.weights import WeightStore

pytestmark = pytest.mark.slow  # end to end: whole runs on Ray


def test_ray_fan_out_matches_the_thread_pool_even_when_a_worker_dies(prefect_harness, tmp_path):
    from prefect.settings import PREFECT_API_URL

    # the Ray run: the first worker to finish sampling a shard SIGKILLs itself before writing it
    killed = tmp_path / "killed-pid"
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "SPOTRL_KILL_ONCE": str(killed)}
    # one source of old logprobs for both (auto takes the sampler's on threads, recomputes for Ray workers)
    overrides = LEARNING_OVERRIDES + [
        "iterations=1",
        "rollout.shards=2",
        "eval.prompts=8",
        "algorithm.old_logprobs=recompute",
    ]
    runs, drivers = {}, {}
    for runner in ("threads", "ray"):
        attempt = run_attempt(
            tmp_path / runner,
            overrides + [f"rollout.task_runner={runner}"],
            Kill(failpoint="rollout.sample@1") if runner == "ray" else None,
            env=env,
            on_line=lambda process, line, r=runner: drivers.setdefault(r, process.pid),
        )
        assert attempt.returncode == 0, attempt.output
        runs[runner] = read_jsonl(tmp_path / runner / "metrics.jsonl")
    digests = {r: WeightStore(tmp_path / r / "weights").verified_digest() for r in runs}
    assert digests["ray"] == digests["threads"]
    assert [strip_timing(m) for m in runs["ray"]] == [strip_timing(m) for m in runs["threads"]]
    pids = {r: {int(w.rsplit(":", 1)[1]) for m in runs[r] for w in m["timing"]["rollout_workers"]} for r in runs}
    assert pids["threads"] == {drivers["threads"]}  # the flow's own process
    assert pids["ray"] and drivers["ray"] not in pids["ray"]  # the shards ran in Ray worker processes
    # a worker died mid-shard (the flow kept running: one attempt, returncode 0); Ray ran that shard
    # again on another worker
    assert int(killed.read_text()) not in pids["ray"]
