"""Damaged artifacts are detected, quarantined and skipped; the resumed run still ends bit-for-bit.

Each case copies a finished run, damages it the way a kill or a bad disk would, and resumes it
in this process against the session's Prefect server.
"""

import json
import shutil
import socket
import subprocess
import sys

import damage_matrix  # tests/flows/damage_matrix.py
import pytest
from support import TINY_OVERRIDES

from spotrl.chaos import strip_timing
from spotrl.cli.main import main
from spotrl.configs import build_config
from spotrl.flows import rundir
from spotrl.flows.resume import find_resume_point, seed_from_warm_start
from spotrl.storage.checkpoints import CheckpointStore
from spotrl.storage.damaged import damaged_log
from spotrl.storage.records import read_jsonl
from spotrl.storage.weights import WeightStore
from spotrl.tasks.context import get_context

pytestmark = pytest.mark.slow  # end to end: whole runs, damaged and resumed

ITERATIONS = 4
# the smoke preset earns no reward in 4 iterations: the entropy bonus makes every update move the
# weights, so "ends at the uninterrupted run's digest" is not true of any run that never changes them
CHANGES = [f"iterations={ITERATIONS}", "algorithm.entropy_coef=0.01"]
TRAIN = ["train", "--config", "smoke", *(arg for change in CHANGES for arg in ("--set", change))]


@pytest.fixture(scope="module")
def config():
    return build_config(None, [o for o in TINY_OVERRIDES if not o.startswith("iterations=")] + CHANGES)


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
    versions = WeightStore(finished / "weights")
    assert len({versions.digest(v) for v in versions.versions()}) > 1  # the run's updates change the weights
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


def _hold_lock(run_dir):
    """Another process holding RUN/.lock (as a training run does) until the returned process is killed."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from spotrl.flows import rundir\n"
            "with rundir.exclusive(sys.argv[1]):\n    print('held', flush=True); time.sleep(600)",
            str(run_dir),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_run_directory_is_trained_by_one_process_at_a_time(tmp_path):
    holder = _hold_lock(tmp_path)
    try:
        with pytest.raises(rundir.RunDirError, match=f"being trained by pid {holder.pid} on"):
            with rundir.exclusive(tmp_path):
                pass
    finally:
        holder.kill()
        holder.wait()
    with rundir.exclusive(tmp_path):  # released when its holder died
        with rundir.exclusive(tmp_path):  # and this process may take it again inside (the CLI, then the flow)
            pass


def test_a_second_warm_started_run_on_a_busy_directory_is_refused_before_it_seeds(finished, tmp_path, capsys):
    run_dir = tmp_path / "new"
    holder = _hold_lock(run_dir)  # the first `train --warm-start-from` on this new directory
    try:
        code = main([*TRAIN, "--warm-start-from", str(finished), "--run-dir", str(run_dir)])
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err.strip()
    busy = f"{run_dir} is being trained by pid {holder.pid} on {socket.gethostname()}; wait for it to end"
    assert code == 2 and err == f"spotrl: error: {busy} or stop it first"
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]  # nothing seeded, nothing written


def test_a_finished_run_longer_than_checkpoint_keep_still_seeds_a_warm_start(finished, config, tmp_path):
    assert ITERATIONS > config.checkpoint.keep
    assert CheckpointStore(finished / "checkpoints").sealed_iterations()[0] == 0  # the warm start is never pruned
    run_dir = tmp_path / "new"
    seed_from_warm_start(run_dir, config, finished)
    point = find_resume_point(
        run_dir, config, CheckpointStore(run_dir / "checkpoints"), WeightStore(run_dir / "weights")
    )
    assert point.iteration == 0 and point.weights is not None


def test_a_resume_under_another_config_is_refused_whatever_files_are_missing(finished, config, tmp_path, capsys):
    run_dir = _copy(finished, tmp_path)
    (run_dir / "config.yaml").unlink()
    code = main([*TRAIN, "--set", "optimizer.learning_rate=0.001", "--run-dir", str(run_dir)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "differing keys: optimizer.learning_rate; recorded in checkpoint 4, config.yaml is missing" in err[0]
    assert not (run_dir / "config.yaml").exists()  # nothing written

    other = config.model_copy(update={"seed": 1})
    shutil.rmtree(run_dir / "checkpoints")  # the weight versions still say which config made them
    with pytest.raises(rundir.RunDirError, match=r"weights/v0000\d\d was published under another config"):
        rundir.prepare(run_dir, other)
    copy = _copy(finished, tmp_path / "b")
    with pytest.raises(rundir.RunDirError, match=r"iter_000004 was made under another config .*differing keys: seed"):
        find_resume_point(copy, other, CheckpointStore(copy / "checkpoints"), WeightStore(copy / "weights"))

    rundir.prepare(run_dir, config)  # the run's own config: config.yaml is written again
    assert rundir.read_config(run_dir) == config


def test_a_damaged_curated_split_is_made_again_and_the_run_resumes_after_its_last_checkpoint(
    finished, config, tmp_path
):
    run_dir = _copy(finished, tmp_path)
    _interrupt_last_iteration(run_dir)
    split = run_dir / "data" / "train.parquet"
    data = bytearray(split.read_bytes())
    data[len(data) // 2] ^= 0x01
    split.write_bytes(bytes(data))
    seals = {i: CheckpointStore(run_dir / "checkpoints").seal_path(i).stat().st_mtime_ns for i in (0, ITERATIONS - 1)}

    _resume(run_dir, config)
    _assert_same(run_dir, finished)
    assert [e["path"] for e in damaged_log(run_dir)] == ["data"]
    assert (run_dir / "data" / "manifest.json").read_bytes() == (finished / "data" / "manifest.json").read_bytes()
    assert {
        i: CheckpointStore(run_dir / "checkpoints").seal_path(i).stat().st_mtime_ns for i in seals
    } == seals  # not redone


def test_garbage_in_latest_a_seal_and_a_manifest_is_set_right_by_one_rerun(finished, config, tmp_path, capsys):
    run_dir = _copy(finished, tmp_path)
    (run_dir / "weights" / "LATEST").write_bytes(b"\xff\xfegarbage")
    assert main(["digest", "--run-dir", str(run_dir)]) == 0  # readers take the newest version on disk
    assert capsys.readouterr().out.strip() == WeightStore(finished / "weights").verified_digest()
    assert main(["eval", "--run-dir", str(run_dir)]) == 0
    assert capsys.readouterr().out.startswith(f"weights v{ITERATIONS}: pass@1 ")

    store = CheckpointStore(run_dir / "checkpoints")
    store.seal_path(ITERATIONS).write_text("{garbage")
    WeightStore(run_dir / "weights").version_dir(ITERATIONS).joinpath("manifest.json").write_bytes(b"")
    _resume(run_dir, config)
    _assert_same(run_dir, finished)
    assert sorted(e["path"] for e in damaged_log(run_dir)) == [
        f"checkpoints/iter_{ITERATIONS:06d}",
        f"checkpoints/iter_{ITERATIONS:06d}.sealed.json",
        f"weights/v{ITERATIONS:06d}",
    ]
    assert (run_dir / "weights" / "LATEST").read_text() == f"{ITERATIONS}\n"
    store.verify(ITERATIONS)


def _interrupt_last_iteration(run_dir):
    """As if killed during the last iteration: its checkpoint, weight version and records are not there."""
    store = CheckpointStore(run_dir / "checkpoints")
    shutil.rmtree(store.path(ITERATIONS))
    store.seal_path(ITERATIONS).unlink()
    weights = WeightStore(run_dir / "weights")
    shutil.rmtree(weights.version_dir(ITERATIONS))
    weights.repoint(ITERATIONS - 1)
    for kind in ("metrics", "eval"):
        (run_dir / kind / f"iter_{ITERATIONS:06d}.json").unlink()


@pytest.fixture(scope="module")
def other(config, tmp_path_factory):
    return damage_matrix.other_run(config, tmp_path_factory.mktemp("other") / "run")


CELLS = [(name, how) for name, row in damage_matrix.MATRIX.items() for how in row]


@pytest.mark.parametrize("name, how", CELLS, ids=[f"{name}-{how}" for name, how in CELLS])
def test_damage_matrix_what_a_resume_decides(finished, other, config, tmp_path, name, how):
    assert damage_matrix.LAST == ITERATIONS
    run_dir = _copy(finished, tmp_path)
    damage_matrix.damage(run_dir, name, how, other)
    decided = damage_matrix.decide(run_dir, config)
    expected = damage_matrix.MATRIX[name][how]
    if isinstance(expected, damage_matrix.Refused):
        assert isinstance(decided, damage_matrix.Refused) and expected.names in decided.names, decided
        # the CLI prints it after "spotrl: error: " and exits 2; a config that does not validate adds
        # one line per offending key
        assert expected.names in decided.names.splitlines()[0] and "Traceback" not in decided.names
        return
    assert decided == expected
    assert rundir.read_config(run_dir) == config  # config.yaml is there (written again when it was missing)
    for kind in ("metrics", "eval"):  # the views are rebuilt from the per-iteration records
        records = [json.loads(p.read_text()) for p in sorted((run_dir / kind).glob("iter_*.json"))]
        assert read_jsonl(run_dir / f"{kind}.jsonl") == records
    weights = WeightStore(run_dir / "weights")
    assert weights.pointer() == max(weights.versions())  # LATEST names the newest complete version
