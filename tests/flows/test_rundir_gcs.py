"""The whole run directory on gs:// (a real GCS API: the local emulator, through gcsfs and tensorstore).

A short training writes everything to the bucket (config, data, rollouts, orbax checkpoints, weight
versions, records, Prefect results) and nothing locally; a resume finds its tasks in the Prefect
results on gs:// (cache hits); the weights end bit for bit equal to a local run of the same config.
"""

import contextlib
import io
import json
import os
import socket
import subprocess
import time

import numpy as np
import pytest
from support import TINY_OVERRIDES, make_bucket

from spotrl.chaos import strip_timing
from spotrl.cli.main import main as cli_main
from spotrl.configs import build_config
from spotrl.flows import rundir
from spotrl.storage.checkpoints import CheckpointError, CheckpointStore
from spotrl.storage.damaged import damaged_log
from spotrl.storage.paths import RemotePath, generation
from spotrl.storage.weights import WeightStore
from spotrl.tasks.context import get_context

BUCKET = "spotrl-rundir"


@pytest.fixture(scope="module")
def bucket(gcs):
    return make_bucket(gcs, BUCKET)


@pytest.fixture(scope="module")
def moving_config():
    """The tiny config, plus an entropy bonus: the tiny policy earns no reward yet, and without a
    gradient from somewhere every weight version would equal the warm start, and equal digests
    would prove nothing."""
    return build_config(None, TINY_OVERRIDES + ["algorithm.entropy_coef=0.01"])


def _train(config, run_dir: str):
    from spotrl.flows.train import train

    get_context.cache_clear()  # as in a new process: nothing in memory, everything from the run directory
    return train(config=config, run_dir=run_dir)


@pytest.mark.slow
def test_training_on_gcs_writes_nothing_locally_resumes_and_matches_local(
    prefect_harness, moving_config, bucket, gcs, tmp_path, monkeypatch
):
    tiny_config = moving_config
    monkeypatch.chdir(tmp_path / ".")  # a relative path or a gs: folder created by mistake would land here
    run_url = f"{bucket}/runs/tiny"
    result = _train(tiny_config, run_url)
    assert result["run_dir"] == run_url
    assert list(tmp_path.iterdir()) == []

    key = run_url.removeprefix("gs://")
    gcs.invalidate_cache()  # the fixture's gcsfs caches listings; this process wrote through another instance
    files = set(gcs.find(key))
    expected = [
        "config.yaml",
        "metrics.jsonl",
        "eval.jsonl",
        "metrics/iter_000002.json",
        "eval/iter_000002.json",
        "data/manifest.json",
        "data/train.parquet",
        "checkpoints/iter_000002.sealed.json",
        "checkpoints/iter_000002/commit_success.txt",
        "weights/LATEST",
        "weights/v000002/manifest.json",
        "weights/v000002/model.safetensors",
    ]
    assert [name for name in expected if f"{key}/{name}" not in files] == []
    assert f"{key}/.lock" not in files  # the lease is released at the end
    for kind in ("rollouts", "scored"):
        assert (
            len([f for f in files if f.startswith(f"{key}/rollouts/iter_000002/{kind}_")]) == tiny_config.rollout.shards
        )
    assert gcs.cat_file(f"{key}/weights/LATEST") == b"2\n"
    assert len([f for f in files if f.startswith(f"{key}/prefect-results/")]) >= 10
    metrics = rundir.read_records(run_url, "metrics")
    assert [m["iteration"] for m in metrics] == [1, 2]

    # a kill after iteration 2 published its weights, before its records: resume redoes iteration 2,
    # every one of its tasks a cache hit read from the Prefect results on gs://
    for name in ("metrics/iter_000002.json", "eval/iter_000002.json"):
        gcs.rm_file(f"{key}/{name}")

    # A task that ran again would write its result object again (a new generation); a cache hit
    # only reads it. So: every result object unchanged, none added, and no checkpoint or weights rewritten.
    def generations(*prefixes):
        gcs.invalidate_cache()
        return {
            f: gcs.info(f)["generation"] for f in gcs.find(key) if f.startswith(tuple(f"{key}/{p}" for p in prefixes))
        }

    before = generations("prefect-results/", "checkpoints/", "weights/v")
    _train(tiny_config, run_url)
    assert generations("prefect-results/", "checkpoints/", "weights/v") == before
    assert [strip_timing(m) for m in rundir.read_records(run_url, "metrics")] == [strip_timing(m) for m in metrics]

    local = tmp_path / "local"
    _train(tiny_config, str(local))
    remote = WeightStore(f"{run_url}/weights")
    assert remote.verified_digest(2) != remote.verified_digest(0)  # RL moved the weights
    assert remote.verified_digest() == WeightStore(local / "weights").verified_digest()

    # a damaged weight version on gs:// is moved to RUN/quarantine/ there and published again
    gcs.pipe_file(f"{key}/weights/v000002/model.safetensors", b"bitrot")
    _train(tiny_config, run_url)
    assert [entry["path"] for entry in damaged_log(run_url)] == ["weights/v000002"]
    assert RemotePath(f"{run_url}/quarantine/weights/v000002/model.safetensors").read_bytes() == b"bitrot"
    assert remote.verified_digest() == WeightStore(local / "weights").verified_digest()
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert cli_main(["digest", "--run-dir", run_url]) == 0
    assert out.getvalue().strip() == remote.verified_digest()
    assert [strip_timing(m) for m in rundir.read_records(local, "metrics")] == [strip_timing(m) for m in metrics]


def test_checkpoint_on_gcs_round_trips_and_refuses_damage(bucket, gcs):
    store = CheckpointStore(f"{bucket}/ckpt", keep=1)
    state = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.float32)}
    store.save(1, state, {"iteration": 1})
    assert store.committed(1) and store.sealed_iterations() == []
    seal = store.seal(1)
    assert store.sealed_iterations() == [1] and store.ref(1)["sha256"] == seal["sha256"]
    key = f"{BUCKET}/ckpt/iter_000001"
    assert {f"{key}/{name}" for name in seal["files"]} == set(gcs.find(key))
    restored, meta = store.restore(1, state)
    np.testing.assert_array_equal(restored["w"], state["w"])
    assert meta == {"iteration": 1}
    damaged = next(f for f in seal["files"] if "/d/" in f)
    gcs.pipe_file(f"{key}/{damaged}", b"bitrot")
    with pytest.raises(CheckpointError, match=rf"gs://{key}: checksum mismatch in \['{damaged}'\]"):
        store.restore(1, state)
    store.save(2, state, {"iteration": 2})
    store.seal(2)
    store.prune()
    assert store.sealed_iterations() == [2] and not RemotePath(f"gs://{key}").exists()


def test_missing_bucket_fails_before_any_work_naming_the_path(gcs, tiny_config):
    with pytest.raises(
        rundir.RunDirError, match=r"gs://spotrl-no-such-bucket/run: bucket gs://spotrl-no-such-bucket does not exist"
    ):
        rundir.prepare("gs://spotrl-no-such-bucket/run", tiny_config)
    with pytest.raises(rundir.RunDirError, match="gs://: not a URL with a bucket"):
        rundir.prepare("gs://", tiny_config)


def test_run_lease_on_gcs_excludes_a_second_trainer_and_outlives_no_one(bucket, gcs, tmp_path):
    run = f"{bucket}/lease/run"
    lock = RemotePath(f"{run}/.lock")
    with rundir.exclusive(run):
        holder = json.loads(lock.read_bytes())
        assert holder["pid"] == os.getpid() and holder["expires_unix"] > time.time()
        with rundir.exclusive(run):  # this process again (`spotrl train`, then its flow): the same lease
            assert json.loads(lock.read_bytes()) == holder
    assert not lock.exists()

    # a second trainer: another live process on this host holds it
    live = subprocess.Popen(["sleep", "60"])
    try:
        lease = {"holder": f"pid {live.pid} on {socket.gethostname()}", "pid": live.pid, "host": socket.gethostname()}
        lock.write_bytes(json.dumps({**lease, "expires_unix": time.time() + 600}).encode())
        with pytest.raises(rundir.RunDirError, match=f"{run} is being trained by pid {live.pid} on "):
            with rundir.exclusive(run):
                pass
    finally:
        live.kill()
        live.wait()

    # SIGKILLed on this host: its pid is gone, so the lease is taken over at once
    dead = subprocess.Popen(["true"])
    dead.wait()
    lock.write_bytes(
        json.dumps(
            {
                "holder": f"pid {dead.pid}",
                "pid": dead.pid,
                "host": os.uname().nodename,
                "expires_unix": time.time() + 600,
            }
        ).encode()
    )
    with rundir.exclusive(run):
        assert json.loads(lock.read_bytes())["pid"] == os.getpid()

    # another host's lease holds until it expires
    other = {"holder": "pid 1 on elsewhere", "pid": 1, "host": "elsewhere", "expires_unix": time.time() + 600}
    lock.write_bytes(json.dumps(other).encode())
    with pytest.raises(rundir.RunDirError, match=r"pid 1 on elsewhere \(lease .*\.lock, expires in 600 s"):
        with rundir.exclusive(run):
            pass
    lock.write_bytes(json.dumps({**other, "expires_unix": time.time() - 1}).encode())
    with rundir.exclusive(run):
        assert json.loads(lock.read_bytes())["host"] != "elsewhere"


def test_latest_only_moves_forward_with_two_publishers(bucket):
    import numpy as np

    root = f"{bucket}/two-publishers/weights"
    a, b = WeightStore(root, keep=10), WeightStore(root, keep=10)
    params = {"w": np.arange(4, dtype=np.float32)}
    b.publish(5, params)
    a.publish(4, params)  # A is behind: its version is written, LATEST stays at B's newer one
    assert a.latest() == b.latest() == 5 and a.versions() == [4, 5]
    a.publish(6, params)
    assert b.latest() == 6
    latest = RemotePath(f"{root}/LATEST")
    assert generation(latest) > 0 and generation(RemotePath(f"{root}/NOTHING")) == 0
