"""sync_tensorboard: every numeric metric as a TensorBoard scalar, exactly once per (tag, step), read back
with TensorBoard's own EventAccumulator."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from spotrl.reporting import flatten
from spotrl.reporting import tensorboard as tb


def metric(i: int) -> dict:
    return {
        "iteration": i,
        "reward_mean": 0.1 * i,
        "shaped_reward_mean": 0.1 * i - 0.01,
        "loss": 1.0 / i,
        "clip_frac": 0.01 * i,
        "entropy": 2.0 - 0.05 * i,
        "staleness": i % 2,
        "tokens_per_s": 1000.0 + i,
        "seconds": 1.5,
        "rollout_weights_versions": [i - 1],  # a list: left out
        "note": "text",  # a string: left out
        "preempted": False,  # a bool: left out
        "timing": {"rollout_seconds": 0.5, "update_seconds": 0.75, "rollout_workers": ["vm:1"]},
    }


def evaluation(i: int) -> dict:
    return {"iteration": i, "weights_version": i, "pass_at_1": 0.05 * i, "pass_at_k": 0.1 * i, "k": 2}


def append(run_dir: Path, kind: str, records: list[dict]) -> None:
    with open(run_dir / f"{kind}.jsonl", "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


TRAIN_TAGS = len(tb.record_scalars(metric(1), "train"))
EVAL_TAGS = len(tb.record_scalars(evaluation(1), "eval"))


def make_run(run_dir: Path, iterations, evals=()) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    append(run_dir, "metrics", [metric(i) for i in iterations])
    append(run_dir, "eval", [evaluation(i) for i in evals])
    return run_dir


def expected(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """(step, value) per tag, straight from the .jsonl files."""
    out: dict[str, list[tuple[int, float]]] = {}
    for kind, group in (("metrics", "train"), ("eval", "eval")):
        path = run_dir / f"{kind}.jsonl"
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            record = json.loads(line)
            for key, value in flatten(record).items():
                if key != "iteration":
                    out.setdefault(f"{group}/{key}", []).append((record["iteration"], value))
    return out


def read_back(tb_dir: Path) -> dict[str, list[tuple[int, float]]]:
    accumulator = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def assert_equal_to_records(run_dir: Path) -> None:
    want, got = expected(run_dir), read_back(run_dir / "tensorboard")
    assert sorted(got) == sorted(want)
    for tag, points in want.items():
        assert [s for s, _ in got[tag]] == [s for s, _ in points], tag  # each step once, in order
        assert [v for _, v in got[tag]] == pytest.approx([v for _, v in points], rel=1e-6), tag


@pytest.fixture(autouse=True)
def fresh_cache():
    tb.reset()
    yield
    tb.reset()


def test_scalars_read_back_equal_the_records(tmp_path):
    run_dir = make_run(tmp_path / "run", range(1, 6), evals=(0, 3))
    points = tb.sync_tensorboard(run_dir)
    assert points == sum(len(v) for v in expected(run_dir).values())
    assert_equal_to_records(run_dir)
    tags = read_back(run_dir / "tensorboard")
    assert "train/timing/rollout_seconds" in tags and "eval/pass_at_1" in tags
    assert not any(t.endswith(("note", "preempted", "rollout_weights_versions", "iteration")) for t in tags)


def test_a_second_sync_writes_nothing(tmp_path):
    run_dir = make_run(tmp_path / "run", range(1, 4), evals=(0,))
    assert tb.sync_tensorboard(run_dir) > 0
    sizes = {p: p.stat().st_size for p in (run_dir / "tensorboard").iterdir()}
    assert tb.sync_tensorboard(run_dir) == 0
    assert {p: p.stat().st_size for p in (run_dir / "tensorboard").iterdir()} == sizes


def test_each_new_iteration_is_appended_once(tmp_path):
    run_dir = make_run(tmp_path / "run", [1])
    for i in range(2, 6):
        assert tb.sync_tensorboard(run_dir) > 0
        append(run_dir, "metrics", [metric(i)])
        if i % 2 == 0:
            append(run_dir, "eval", [evaluation(i)])
    tb.sync_tensorboard(run_dir)
    assert len(list((run_dir / "tensorboard").iterdir())) == 1  # one cached writer, one file
    assert_equal_to_records(run_dir)


def test_a_resume_never_duplicates_a_step(tmp_path):
    run_dir = make_run(tmp_path / "run", range(1, 4), evals=(0, 2))
    tb.sync_tensorboard(run_dir)
    tb.reset()  # as a new process: the watermarks come from the event files
    assert tb.sync_tensorboard(run_dir) == 0
    append(run_dir, "metrics", [metric(4), metric(5)])
    append(run_dir, "eval", [evaluation(4)])
    assert (
        tb.sync_tensorboard(run_dir) == sum(len(v) for v in expected(run_dir).values()) - 3 * TRAIN_TAGS - 2 * EVAL_TAGS
    )
    # a really new process (the event files of two writers in the directory)
    code = f"from spotrl.reporting.tensorboard import sync_tensorboard; print(sync_tensorboard({str(run_dir)!r}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "0"
    assert_equal_to_records(run_dir)


def test_a_torn_event_record_is_written_again_not_duplicated(tmp_path):
    run_dir = make_run(tmp_path / "run", range(1, 4), evals=(0, 3))
    tb.sync_tensorboard(run_dir)
    tb.reset()
    (event_file,) = (run_dir / "tensorboard").iterdir()
    data = event_file.read_bytes()
    event_file.write_bytes(data[:-7])  # a kill in the middle of the last record (eval, step 3)
    events, intact = tb.parse_events(event_file.read_bytes())
    assert intact < len(data) - 7 and events[-1].step == 0  # the torn record is not counted: eval 0 is the last intact
    append(run_dir, "metrics", [metric(4)])
    tb.sync_tensorboard(run_dir)  # writes eval step 3 again, and iteration 4
    assert_equal_to_records(run_dir)
    tb.reset()
    assert tb.sync_tensorboard(run_dir) == 0


def test_a_new_event_file_sorts_after_the_existing_ones():
    old = "events.out.tfevents.1700000005.host.1.aaaaaaaa"
    assert tb.next_event_file_name([], 1700000000.7, "h", "2.b") == "events.out.tfevents.1700000000.h.2.b"
    new = tb.next_event_file_name([old, "other"], 1700000005.2, "host", "0.0")  # the same second, a smaller suffix
    assert new == "events.out.tfevents.1700000006.host.0.0" and sorted([new, old])[-1] == new


def test_resumes_in_the_same_second_keep_steps_in_order(tmp_path):
    run_dir = make_run(tmp_path / "run", [1])
    for i in range(2, 8):  # each a new writer, all within a second or two
        tb.sync_tensorboard(run_dir)
        tb.reset()
        append(run_dir, "metrics", [metric(i)])
    tb.sync_tensorboard(run_dir)
    names = [p.name for p in (run_dir / "tensorboard").iterdir()]
    assert len(set(names)) == 7
    assert_equal_to_records(run_dir)


def test_garbage_and_empty_event_files_are_read_as_holding_nothing(tmp_path):
    assert tb.parse_events(b"") == ([], 0)
    assert tb.parse_events(b"\x00" * 5) == ([], 0)
    assert tb.parse_events(b"\xff" * 64) == ([], 0)  # a bad length checksum


def test_records_without_iteration_and_a_tag_that_appears_later(tmp_path):
    run_dir = make_run(tmp_path / "run", [1, 2])
    append(run_dir, "metrics", [{"reward_mean": 0.5}])  # no iteration: skipped
    tb.sync_tensorboard(run_dir)
    append(run_dir, "metrics", [{**metric(3), "importance_ratio_max": 1.5}])
    tb.sync_tensorboard(run_dir)
    got = read_back(run_dir / "tensorboard")
    assert got["train/importance_ratio_max"] == [(3, 1.5)]
    assert [s for s, _ in got["train/reward_mean"]] == [1, 2, 3]


def test_a_run_without_records_writes_no_event_file(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert tb.sync_tensorboard(run_dir) == 0
    assert not (run_dir / "tensorboard").exists()


def test_gs_run_directory_uploads_the_event_file(gcs, tmp_path):
    from support import make_bucket

    from spotrl.storage.paths import as_path

    url = make_bucket(gcs, "spotrl-reporting-tb") + "/run"
    remote = as_path(url)
    remote_metrics = [metric(i) for i in range(1, 4)]
    (remote / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in remote_metrics))
    assert tb.sync_tensorboard(url) == 3 * TRAIN_TAGS
    assert tb.sync_tensorboard(url) == 0
    tb.reset()
    assert tb.sync_tensorboard(url) == 0  # the watermarks come from the uploaded file
    local = tmp_path / "copy"
    make_run(local, range(1, 4))
    (local / "tensorboard").mkdir()
    for path in (remote / "tensorboard").iterdir():
        (local / "tensorboard" / path.name).write_bytes(path.read_bytes())
    assert_equal_to_records(local)
