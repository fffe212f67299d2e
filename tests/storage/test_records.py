"""Run records (spotrl/storage/records.py): one JSON object a line, the torn-line rule, per-iteration records."""

import json

import pytest
from support import make_bucket

from spotrl.storage.records import (
    RecordError,
    append_record,
    damaged_records,
    parse_json,
    parse_lines,
    read_jsonl,
    read_record,
    read_records,
    record_exists,
    write_jsonl,
    write_record,
)


def test_lines_are_read_in_order_and_blank_lines_skipped():
    assert parse_lines(b'{"a": 1}\n\n{"b": 2}\n  \n', "x.jsonl") == [{"a": 1}, {"b": 2}]
    assert parse_lines(b"", "x.jsonl") == []


@pytest.mark.parametrize(
    "tail",
    [b'{"iteration": 3, "los', b'{"iteration": 3, "loss": 0.5\n', b'{"name": "caf\xc3'],
    ids=["cut mid-line", "cut before the brace, newline written", "cut inside a UTF-8 character"],
)
def test_a_torn_last_line_is_skipped(tail):
    assert parse_lines(b'{"iteration": 1}\n{"iteration": 2}\n' + tail, "x.jsonl") == [
        {"iteration": 1},
        {"iteration": 2},
    ]


def test_a_damaged_line_before_the_last_is_an_error_naming_file_and_line():
    with pytest.raises(RecordError, match=r"^run/metrics\.jsonl:3: not a JSON line"):
        parse_lines(b'{"iteration": 1}\n\n{"iteration": 2\n{"iteration": 3}\n', "run/metrics.jsonl")


@pytest.mark.parametrize("line", [b"[1, 2]", b"7", b'"text"', b"null"])
def test_a_line_that_is_json_but_no_object_is_an_error_even_last(line):
    with pytest.raises(RecordError, match=r"^x\.jsonl:2: not a JSON object"):
        parse_lines(b'{"a": 1}\n' + line + b"\n", "x.jsonl")


def test_appended_records_read_back_and_a_torn_append_loses_only_itself(tmp_path):
    log = tmp_path / "quarantine" / "log.jsonl"
    append_record(log, {"path": "weights/v000002", "reason": "bad hash"})
    append_record(log, {"path": "checkpoints/iter_000002", "reason": "not sealed"})
    with open(log, "a") as f:
        f.write('{"path": "rollouts/iter_0')  # the process died mid-append
    assert [r["path"] for r in read_jsonl(log)] == ["weights/v000002", "checkpoints/iter_000002"]
    assert log.read_text().splitlines()[0] == json.dumps({"path": "weights/v000002", "reason": "bad hash"})


def test_a_missing_file_is_an_error_for_a_file_and_no_records_for_a_run_directory(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_jsonl(tmp_path / "metrics.jsonl")
    assert read_records(tmp_path, "metrics") == []


def test_written_lines_have_sorted_keys_and_replace_the_file(tmp_path):
    path = tmp_path / "eval.jsonl"
    write_jsonl(path, [{"b": 1, "a": 2}, {"c": [1, 2]}])
    write_jsonl(path, [{"b": 1, "a": 2}])
    assert path.read_text() == '{"a": 2, "b": 1}\n'


def test_per_iteration_records_rebuild_the_jsonl_in_iteration_order_idempotently(tmp_path):
    write_record(tmp_path, "metrics", 2, {"iteration": 2, "loss": 0.25})
    write_record(tmp_path, "metrics", 1, {"iteration": 1, "loss": 0.5})
    write_record(tmp_path, "metrics", 2, {"iteration": 2, "loss": 0.25})  # a resumed run writes it again
    assert read_records(tmp_path, "metrics") == [{"iteration": 1, "loss": 0.5}, {"iteration": 2, "loss": 0.25}]
    assert (tmp_path / "metrics.jsonl").read_text() == (
        '{"iteration": 1, "loss": 0.5}\n{"iteration": 2, "loss": 0.25}\n'
    )
    assert record_exists(tmp_path, "metrics", 1) and not record_exists(tmp_path, "metrics", 3)
    assert read_record(str(tmp_path), "metrics", 2) == {"iteration": 2, "loss": 0.25}
    assert (tmp_path / "metrics" / "iter_000001.json").exists()


def test_records_on_gcs(gcs):
    run = make_bucket(gcs, "records") + "/run"
    write_record(run, "eval", 0, {"iteration": 0, "pass_at_1": 0.1})
    write_record(run, "eval", 1, {"iteration": 1, "pass_at_1": 0.2})
    append_record(f"{run}/quarantine/log.jsonl", {"path": "a"})
    append_record(f"{run}/quarantine/log.jsonl", {"path": "b"})
    assert [r["pass_at_1"] for r in read_records(run, "eval")] == [0.1, 0.2]
    assert read_record(run, "eval", 1)["iteration"] == 1 and record_exists(run, "eval", 0)
    assert read_jsonl(f"{run}/quarantine/log.jsonl") == [{"path": "a"}, {"path": "b"}]


@pytest.mark.parametrize(
    "data, why",
    [
        (b"{torn", "not JSON"),
        (b"\xff\xfe{}", "not JSON .*UnicodeDecodeError"),
        (b"", "not JSON"),
        (b"[1]", "not a JSON object but list"),
        (b'{"a": 1}', "no b in it"),
    ],
)
def test_a_json_file_that_is_not_an_object_with_its_keys_is_an_error_naming_it(data, why):
    with pytest.raises(RecordError, match=f"^some/file.json: {why}"):
        parse_json(data, "some/file.json", keys=("a", "b"))
    assert parse_json(b'{"a": 1, "b": 2}', "x", keys=("a", "b")) == {"a": 1, "b": 2}


def test_damaged_per_iteration_records_are_listed_with_why(tmp_path):
    for iteration in (1, 2, 3):
        write_record(tmp_path, "metrics", iteration, {"iteration": iteration})
    damaged = tmp_path / "metrics" / "iter_000002.json"
    damaged.write_bytes(b"\x00\x00")
    assert list(damaged_records(tmp_path, "metrics")) == [damaged]
    assert damaged_records(tmp_path, "metrics")[damaged].startswith(f"{damaged}: not JSON")
    assert damaged_records(tmp_path, "eval") == {}
