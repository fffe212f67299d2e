"""Sources: real JSONL/JSON/Parquet/CSV files and saved `datasets` directories (local and gs://),
mapped into the canonical schema; bad rows quarantined with the row number and the field named."""

import gzip
import json
from pathlib import Path

import datasets
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import make_bucket

from spotrl.curation.canonical import canonicalize
from spotrl.curation.schema import CANONICAL_COLUMNS, canonical_failures
from spotrl.curation.sources import SourceError, SourceSpec, default_name, parse_source_arg, read_source

ROWS = [
    {"qid": 10, "question": "What is 2 + 3?", "solution": 5, "level": 1},
    {"qid": 11, "question": "What is 7 * 6?", "solution": "42", "level": 2},
]


def _canonical(spec):
    raw = read_source(spec)
    return raw, *canonicalize(raw)


def _write_jsonl(path: Path, rows, extra_lines=()):
    path.write_text("\n".join([json.dumps(r) for r in rows] + list(extra_lines)) + "\n")
    return path


MAP = {"qid": "id", "question": "prompt", "solution": "answer"}


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz", "json", "parquet", "csv", "datasets", "datasetdict"])
def test_every_format_maps_to_the_same_canonical_rows(tmp_path, fmt):
    frame = pd.DataFrame(ROWS)
    if fmt == "jsonl":
        path = _write_jsonl(tmp_path / "math.jsonl", ROWS)
    elif fmt == "jsonl.gz":
        path = tmp_path / "math.jsonl.gz"
        path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in ROWS).encode()))
    elif fmt == "json":
        path = tmp_path / "math.json"
        path.write_text(json.dumps(ROWS))
    elif fmt == "parquet":
        path = tmp_path / "math.parquet"
        pq.write_table(pa.Table.from_pylist([{**r, "solution": str(r["solution"])} for r in ROWS]), path)
    elif fmt == "csv":
        path = tmp_path / "math.csv"
        frame.to_csv(path, index=False)
    elif fmt == "datasets":
        path = tmp_path / "math"
        datasets.Dataset.from_list([{**r, "solution": str(r["solution"])} for r in ROWS]).save_to_disk(str(path))
    else:
        path = tmp_path / "math"
        ds = datasets.Dataset.from_list([{**r, "solution": str(r["solution"])} for r in ROWS])
        datasets.DatasetDict({"train": ds, "test": ds.select([0])}).save_to_disk(str(path))
    raw, good, bad, kinds = _canonical(SourceSpec("math", str(path), MAP))
    assert raw.format == {"jsonl.gz": "jsonl", "datasetdict": "datasets"}.get(fmt, fmt)
    assert bad.empty and not kinds
    assert list(good.columns) == list(CANONICAL_COLUMNS)
    assert good["id"].tolist() == ["math/10", "math/11"]
    assert good["prompt"].tolist() == ["What is 2 + 3?", "What is 7 * 6?"]
    assert good["answer"].tolist() == ["5", "42"]  # an integer answer becomes its text
    assert (
        [json.loads(m) for m in good["metadata"]] == [{"level": "1"}, {"level": "2"}]
        if fmt == "csv"
        else [{"level": 1}, {"level": 2}]
    )
    assert good["source"].unique().tolist() == ["math"] and good["tests"].isna().all()


def test_datasetdict_split_is_chosen(tmp_path):
    ds = datasets.Dataset.from_list([{"prompt": f"p{i}", "answer": str(i)} for i in range(3)])
    datasets.DatasetDict({"train": ds, "test": ds.select([0])}).save_to_disk(str(tmp_path / "d"))
    assert len(read_source(SourceSpec("d", str(tmp_path / "d"), split="test")).records) == 1
    datasets.DatasetDict({"a": ds, "b": ds}).save_to_disk(str(tmp_path / "e"))
    with pytest.raises(SourceError, match="splits"):
        read_source(SourceSpec("e", str(tmp_path / "e")))


def test_bad_rows_are_quarantined_with_row_and_field(tmp_path):
    lines = [
        json.dumps({"id": "a", "prompt": "Add 1 and 1.", "answer": "2"}),  # row 0: good
        json.dumps({"id": "b", "prompt": "", "answer": "2"}),  # row 1: empty prompt
        "{not json",  # row 2
        "",  # row 3: blank, skipped
        json.dumps({"id": "c", "prompt": "Only a prompt."}),  # row 4: neither answer nor tests
        json.dumps({"id": "a", "prompt": "Same id again.", "answer": "1"}),  # row 5: duplicate id
        json.dumps({"id": "d", "prompt": ["a", "list"], "answer": "1"}),  # row 6: prompt not text
        json.dumps({"id": "e", "prompt": "Write f.", "tests": "assert f( =="}),  # row 7: tests not Python
        json.dumps([1, 2]),  # row 8: not an object
        json.dumps({"id": "f", "prompt": "Write g.", "tests": ["assert g() == 1", "assert g() != 2"]}),  # row 9: good
        json.dumps({"id": "g", "prompt": "Is it?", "answer": True}),  # row 10: a bool is not an answer
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    raw, good, bad, kinds = _canonical(SourceSpec("mixed", str(path)))
    assert raw.rows_read == 10
    assert good["id"].tolist() == ["mixed/a", "mixed/f"]
    assert good["tests"].tolist()[1] == "assert g() == 1\nassert g() != 2"
    reasons = dict(zip(bad["row"], bad["reason"]))
    assert sorted(reasons) == [1, 2, 4, 5, 6, 7, 8, 10]
    assert reasons[1] == "row 1: field 'prompt': empty or not text"
    assert reasons[2].startswith("row 2: line is not valid JSON")
    assert reasons[4] == "row 4: field 'answer/tests': missing (a row needs an answer or tests)"
    assert reasons[5] == "row 5: field 'id': duplicate id"
    assert reasons[6] == "row 6: field 'prompt': empty or not text"
    assert reasons[7] == "row 7: field 'tests': not Python with an assert statement"
    assert reasons[8] == "row 8: line is not a JSON object (list)"
    assert "field 'answer'" in reasons[10]
    assert dict(zip(bad["row"], bad["fields"]))[5] == "id"
    assert json.loads(dict(zip(bad["row"], bad["record"]))[1]) == {"id": "b", "prompt": "", "answer": "2"}
    assert dict(zip(bad["row"], bad["record"]))[2] == "{not json"
    assert kinds == {
        "prompt: empty or not text": 2,
        "line is not valid JSON": 1,
        "answer/tests: missing": 2,
        "id: duplicate id": 1,
        "tests: not Python with an assert statement": 1,
        "line is not a JSON object": 1,
        "answer: empty or not text": 1,
    }


def test_csv_rows_with_the_wrong_number_of_fields(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text('prompt,answer\n"Say, hi",hi\nonly-one-field\n"a","b","c"\n,missing prompt\n')
    raw, good, bad, _ = _canonical(SourceSpec("t", str(path)))
    assert good["prompt"].tolist() == ["Say, hi"] and good["id"].tolist() == ["t/0"]  # no id column: the row
    assert bad["row"].tolist() == [1, 2, 3]
    assert "wrong number of fields (1, the header has 2)" in bad["reason"][0]
    assert "field 'prompt'" in bad["reason"][2]


@pytest.mark.parametrize(
    "mapping, message",
    [
        ({"questoin": "prompt"}, "no column 'questoin'"),
        ({"question": "body"}, "cannot map 'question' to 'body'"),
        ({"question": "prompt", "qid": "prompt"}, "both"),
        ({"qid": "id"}, "no prompt column"),
        ({"question": "prompt", "solution": "id"}, "neither an answer nor a tests column"),
    ],
)
def test_mapping_errors_name_the_problem(tmp_path, mapping, message):
    path = _write_jsonl(tmp_path / "m.jsonl", ROWS)
    with pytest.raises(SourceError, match=message):
        _canonical(SourceSpec("m", str(path), mapping))


def test_unreadable_sources(tmp_path):
    with pytest.raises(SourceError, match="does not exist"):
        read_source(SourceSpec("x", str(tmp_path / "nope.jsonl")))
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(SourceError, match="unknown format"):
        read_source(SourceSpec("x", str(tmp_path / "x.txt")))
    (tmp_path / "x.parquet").write_text("not parquet")
    with pytest.raises(SourceError, match="not a readable Parquet"):
        read_source(SourceSpec("x", str(tmp_path / "x.parquet")))


def test_source_names():
    assert parse_source_arg("gsm8k=/data/train.jsonl") == ("gsm8k", "/data/train.jsonl")
    assert parse_source_arg("/data/train.jsonl.gz") == ("train", "/data/train.jsonl.gz")
    assert parse_source_arg("gs://bucket/dir/mbpp.parquet") == ("mbpp", "gs://bucket/dir/mbpp.parquet")
    assert parse_source_arg("/data/part=1/x.csv") == ("x", "/data/part=1/x.csv")
    assert default_name("/data/saved_ds/") == "saved_ds"


def test_content_hash_follows_the_bytes(tmp_path):
    path = _write_jsonl(tmp_path / "h.jsonl", ROWS)
    first = read_source(SourceSpec("h", str(path), MAP)).sha256
    assert read_source(SourceSpec("h", str(path), MAP)).sha256 == first
    _write_jsonl(path, ROWS[:1])
    assert read_source(SourceSpec("h", str(path), MAP)).sha256 != first


def test_canonical_schema_reports_each_failure():
    frame = pd.DataFrame(
        {
            c: pd.Series(v, dtype=object)
            for c, v in {
                "id": ["s/a", "s/a", None],
                "prompt": ["p", "q", "r"],
                "answer": ["1", "2", "3"],
                "tests": [None, None, None],
                "source": ["s", "s", "s"],
                "metadata": ["{}", "[]", "{}"],
            }.items()
        }
    )
    found = {(row, field, problem) for row, field, problem, _ in canonical_failures(frame)}
    assert found == {(1, "id", "duplicate id"), (2, "id", "missing"), (1, "metadata", "not a JSON object")}


# ------------------------------------------------------------------------------------------ gs://

BUCKET = "spotrl-curation-test"


def test_sources_read_from_gcs(gcs):
    make_bucket(gcs, BUCKET)
    with gcs.open(f"{BUCKET}/math.jsonl", "wb") as f:
        f.write("".join(json.dumps(r) + "\n" for r in ROWS).encode() + b"{broken\n")
    with gcs.open(f"{BUCKET}/math.parquet", "wb") as f:
        pq.write_table(pa.Table.from_pylist([{**r, "solution": str(r["solution"])} for r in ROWS]), f)
    gcs.invalidate_cache()
    raw, good, bad, _ = _canonical(SourceSpec("math", f"gs://{BUCKET}/math.jsonl", MAP))
    assert good["id"].tolist() == ["math/10", "math/11"] and bad["row"].tolist() == [2]
    _, good_pq, _, _ = _canonical(SourceSpec("math", f"gs://{BUCKET}/math.parquet", MAP))
    assert good_pq["prompt"].tolist() == good["prompt"].tolist()
    with pytest.raises(SourceError, match="does not exist"):
        read_source(SourceSpec("x", f"gs://{BUCKET}/missing.jsonl"))
