"""Damaged artifacts are detected, quarantined and skipped; the resumed run still ends bit-for-bit.

Each case copies a finished run, damages it the way a kill or a bad disk would, and resumes it
in this process against the session's Prefect server.
"""

import json
import shutil

import pytest
from support import TINY_OVERRIDES

from spotrl.chaos import strip_timing
from spotrl.configs import build_config
from spotrl.flows import rundir
from spotrl.flows.resume import find_resume_point
from spotrl.storage.checkpoints import CheckpointStore
from spotrl.storage.damaged import damaged_log
from spotrl.storage.records import read_jsonl
from spotrl.storage.weights import WeightStore
from spotrl.tasks.context import get_context

pytestmark = pytest.mark.slow  # end to end: whole runs, damaged and resumed

ITERATIONS = 4


@pytest.fixture(scope="module")
def config():
    return build_config(
        None, [o for o in TINY_OVERRIDES if not o.startswith("iterations=")] + [f"iterations={ITERATIONS}"]
    )


@pytest.fixture(scope="module")
def finished(prefect_harness, config, tmp_path_factory):
    from spotrl.flows.train import train

    run_dir = tmp_path_factory.mktemp("finished") / "run"
    train(config=config, run_dir=str(run_dir))
    return run_dir


def _copy(finished, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir, ignore=shutil.ignore_patterns(".lock"))
    return run_dir


def _resume(run_dir, config):
    from spotrl.flows.train import train

    get_context.cache_clear()  # a new process: nothing in memory, everything from the run directory
    return train(config=config, run_dir=str(run_dir))


def _assert_same(run_dir, finished):
    assert WeightStore(run_dir / "weights").verified_digest() == WeightStore(finished / "weights").verified_digest()
    for name in ("metrics.jsonl", "eval.jsonl"):
        assert [strip_timing(r) for r in read_jsonl(run_dir / name)] == [
            strip_timing(r) for r in read_jsonl(finished / name)
        ]


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_truncated_newest_checkpoint_is_quarantined_and_redone(finished, config, tmp_path):
    run_dir = _copy(finished, tmp_path)
    store = CheckpointStore(run_dir / "checkpoints")
    newest = store.sealed_iterations()[-1]
    assert newest == ITERATIONS
    biggest = max((p for p in store.path(newest).rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    _truncate(biggest)
    # metrics of the last iteration are lost too (killed before they were written): it must be redone
    (run_dir / "metrics" / f"iter_{newest:06d}.json").unlink()

    point = find_resume_point(run_dir, config, store, WeightStore(run_dir / "weights"))
    assert point.iteration == newest - 1 and point.refresh
    assert any("checksum mismatch" in note for note in point.notes)
    assert [entry["path"] for entry in damaged_log(run_dir)] == [
        f"checkpoints/iter_{newest:06d}",
        f"checkpoints/iter_{newest:06d}.sealed.json",
    ]
    assert (run_dir / "quarantine" / "checkpoints" / f"iter_{newest:06d}").is_dir()

    _resume(run_dir, config)
    _assert_same(run_dir, finished)
    store.verify(newest)  # redone and sealed again


def test_half_written_weight_version_is_skipped_and_republished(finished, config, tmp_path):
    run_dir = _copy(finished, tmp_path)
    weights = WeightStore(run_dir / "weights")
    newest = weights.latest()
    # a publish killed mid-write leaves a temporary directory; a damaged disk leaves a short file
    leftover = run_dir / "weights" / f".tmp-v{newest + 1:06d}-abc"
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"\0" * 10)
    _truncate(weights.version_dir(newest) / "model.safetensors")

    point = find_resume_point(run_dir, config, CheckpointStore(run_dir / "checkpoints"), weights)
    assert point.iteration == newest and point.weights is None  # its checkpoint is fine: republish only
    assert not leftover.exists()
    assert any(f"weights/v{newest:06d}" in note for note in point.notes)
    assert weights.latest() == newest - 1  # LATEST never points at a version that is gone

    _resume(run_dir, config)
    _assert_same(run_dir, finished)
    assert weights.latest() == newest


def test_altered_rollout_shard_of_the_interrupted_iteration_is_regenerated(finished, config, tmp_path):
    run_dir = _copy(finished, tmp_path)
    # as if killed during iteration ITERATIONS: its checkpoint and records are not there yet
    store = CheckpointStore(run_dir / "checkpoints")
    shutil.rmtree(store.path(ITERATIONS))
    store.seal_path(ITERATIONS).unlink()
    for kind in ("metrics", "eval"):
        (run_dir / kind / f"iter_{ITERATIONS:06d}.json").unlink()
    shard = sorted((run_dir / "rollouts" / f"iter_{ITERATIONS:06d}").glob("rollouts_000.*.parquet"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped bit: still a parseable file, but not the one written
    shard.write_bytes(bytes(data))

    point = find_resume_point(run_dir, config, store, WeightStore(run_dir / "weights"))
    assert point.iteration == ITERATIONS - 1 and point.refresh
    assert [e["path"] for e in damaged_log(run_dir)] == [str(shard.relative_to(run_dir))]

    _resume(run_dir, config)
    _assert_same(run_dir, finished)
    assert shard.exists()  # regenerated, byte for byte (its name is its content hash)


def test_changed_random_streams_are_refused(finished, config, tmp_path, monkeypatch):
    from spotrl.flows import resume

    run_dir = _copy(finished, tmp_path)
    monkeypatch.setattr(resume, "next_iteration_streams", lambda seed, it: {"changed": True})
    with pytest.raises(rundir.RunDirError, match="random streams recorded"):
        find_resume_point(run_dir, config, CheckpointStore(run_dir / "checkpoints"), WeightStore(run_dir / "weights"))


def test_checkpoint_metadata_holds_the_whole_run_state(finished, config):
    store = CheckpointStore(finished / "checkpoints")
    meta = store.metadata(ITERATIONS)
    r = config.rollout
    assert meta["iteration"] == ITERATIONS and meta["seed"] == config.seed
    assert meta["data_cursor"] == ITERATIONS * r.prompts_per_iteration
    assert meta["data_sha256"] == json.loads((finished / "data" / "manifest.json").read_text())["sha256"]
    assert meta["rollout_weights_versions"] == [[i, [i - 1]] for i in range(1, ITERATIONS + 1)]
    steps = sum(m["optimizer_steps"] for m in read_jsonl(finished / "metrics.jsonl"))
    assert meta["optimizer_steps"] == steps == ITERATIONS * config.algorithm.minibatches * config.algorithm.epochs
    assert meta["rng"]["iteration"] == ITERATIONS + 1 and len(meta["rng"]["rollout"]) == 2


def test_a_run_directory_is_trained_by_one_process_at_a_time(tmp_path):
    with rundir.exclusive(tmp_path):
        with pytest.raises(rundir.RunDirError, match=f"being trained by pid {__import__('os').getpid()}"):
            with rundir.exclusive(tmp_path):
                pass
    with rundir.exclusive(tmp_path):  # released on exit
        pass
