"""Rollout shards fanned out over a real local Ray (prefect-ray) give the same run as the thread pool."""

import os

import pytest

from spotrl.chaos import read_jsonl, strip_timing
from spotrl.flows.config import build_config
from spotrl.storage.weights import WeightStore
from test_algorithms import BASE




def test_ray_fan_out_matches_the_thread_pool(prefect_harness, tmp_path):
    from spotrl.flows.train import train

    overrides = BASE + ["iterations=1", "rollout.shards=2", "eval.prompts=8"]
    runs = {}
    for runner in ("threads", "ray"):
        config = build_config(None, overrides + [f"rollout.task_runner={runner}"])
        train(config=config, run_dir=str(tmp_path / runner))
        runs[runner] = read_jsonl(tmp_path / runner / "metrics.jsonl")
    digests = {r: WeightStore(tmp_path / r / "weights").verified_digest() for r in runs}
    assert digests["ray"] == digests["threads"]
    assert [strip_timing(m) for m in runs["ray"]] == [strip_timing(m) for m in runs["threads"]]
    me = f"{os.uname().nodename}:{os.getpid()}"
    assert all(w == me for m in runs["threads"] for w in m["timing"]["rollout_workers"])
    ray_workers = {w for m in runs["ray"] for w in m["timing"]["rollout_workers"]}
    assert ray_workers and me not in ray_workers  # the shards ran in Ray worker processes
