import numpy as np
import pandas as pd
import pytest

from spotrl.curation.batches import batch_indices
from spotrl.curation.schema import SchemaError, to_dataset, validate_rows
from spotrl.curation.store import load_split, save_splits
from spotrl.problems import arithmetic


def _arithmetic_splits(seed, train_size, eval_size):
    """The built-in arithmetic splits as the run stores them (validated `datasets.Dataset`s)."""
    train, held_out = arithmetic.make_splits(seed, train_size, eval_size)
    return to_dataset(train, "arithmetic/train"), to_dataset(held_out, "arithmetic/eval")


def _row(**kw):
    row = {"id": "a", "prompt": "1+1=", "answer": "2", "source": "test"}
    row.update(kw)
    return row


def test_schema_accepts_good_rows():
    ds = to_dataset(pd.DataFrame([_row(), _row(id="b")]), "good")
    assert ds.column_names == ["id", "prompt", "answer", "source"]


@pytest.mark.parametrize(
    "rows, field",
    [
        ([_row(prompt="")], "prompt"),
        ([_row(), _row()], "id"),  # duplicate ids
        ([_row(answer=3)], "answer"),  # wrong type
    ],
)
def test_schema_rejects_bad_row_naming_field(rows, field):
    with pytest.raises(SchemaError) as err:
        validate_rows(pd.DataFrame(rows), "bad.parquet")
    assert "bad.parquet" in str(err.value) and repr(field) in str(err.value)


def test_schema_rejects_unknown_column():
    with pytest.raises(SchemaError, match="extra"):
        validate_rows(pd.DataFrame([_row(extra="x")]), "bad")


def test_splits_are_deterministic_disjoint_and_correct():
    train, held_out = _arithmetic_splits(7, 500, 50)
    again, _ = _arithmetic_splits(7, 500, 50)
    assert train["prompt"] == again["prompt"]
    assert not set(train["prompt"]) & set(held_out["prompt"])
    assert len(set(train["prompt"])) == 500
    for prompt, answer in zip(train["prompt"], train["answer"]):
        a, b = prompt.rstrip("=").split("+")
        assert len(a) == len(b) == 4 and int(a) + int(b) == int(answer)
        assert 10 <= int(a) <= 9999 and 10 <= int(b) <= 9999
    other, _ = _arithmetic_splits(8, 500, 50)
    assert other["prompt"] != train["prompt"]


def test_completion_is_reversed_answer():
    assert arithmetic.completion_text("357") == "753"


def test_batches_walk_epochs_without_repeats():
    size, batch = 10, 4
    seen = np.concatenate([batch_indices(0, i, batch, size) for i in range(1, 6)])  # 20 rows = 2 epochs
    assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:20]) == list(range(10))
    assert not np.array_equal(seen[:10], seen[10:20])  # a new permutation per epoch
    np.testing.assert_array_equal(batch_indices(0, 3, batch, size), seen[8:12])  # addressable by iteration


def test_store_roundtrip_with_manifest(tmp_path):
    train, held_out = _arithmetic_splits(0, 100, 10)
    manifest = save_splits(tmp_path, {"train": train, "eval": held_out})
    assert manifest["splits"]["train"]["rows"] == 100
    assert load_split(tmp_path, "eval")["prompt"] == held_out["prompt"]
    assert save_splits(tmp_path, {"train": train, "eval": held_out})["sha256"] == manifest["sha256"]
