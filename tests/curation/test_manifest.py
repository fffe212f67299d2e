"""curation/manifest.py: the one row hash and the one dataset writer, for run splits and curated data."""

import json

import numpy as np
import pandas as pd

from spotrl.curation.manifest import rows_sha256, write_dataset
from spotrl.curation.schema import to_dataset
from spotrl.curation.store import load_split, prompt_columns, save_splits


def _rows(targets):
    return pd.DataFrame(
        {
            "id": [f"r{i}" for i in range(len(targets))],
            "prompt": ["p"] * len(targets),
            "answer": ["a"] * len(targets),
            "source": ["s"] * len(targets),
            "target": targets,
        }
    )


def test_a_missing_value_hashes_the_same_as_none_or_nan():
    with_none, with_nan = _rows(["x", None]), _rows(["x", np.nan])
    assert rows_sha256(with_none, prompt_columns(with_none)) == rows_sha256(with_nan, prompt_columns(with_nan))
    assert rows_sha256(with_none, prompt_columns(with_none)) != rows_sha256(
        _rows(["x", "y"]), prompt_columns(with_none)
    )


def test_the_hash_covers_only_the_given_columns_in_order():
    frame = _rows(["x", "y"])
    assert rows_sha256(frame.assign(extra=1), ["id", "prompt"]) == rows_sha256(frame, ["id", "prompt"])
    assert rows_sha256(frame, ["id", "prompt"]) != rows_sha256(frame, ["prompt", "id"])


def test_a_split_with_a_missing_target_reads_back(tmp_path):
    split = to_dataset(_rows(["x", None]), "with a missing target")
    save_splits(tmp_path, {"train": split})
    assert load_split(tmp_path, "train")["target"] == ["x", None]


def test_write_dataset_manifest(tmp_path):
    frame = _rows(["x", "y"])
    manifest = write_dataset(
        tmp_path,
        {"train": frame},
        prompt_columns,
        fields={"format": "f"},
        files={"extra": frame.head(1)},
        summary={"kept": 2},
    )
    assert json.loads((tmp_path / "manifest.json").read_text()) == manifest
    assert manifest["format"] == "f" and manifest["splits"]["train"]["rows"] == 2
    assert manifest["splits"]["train"]["sha256"] == rows_sha256(frame, prompt_columns(frame))
    assert manifest["extra"]["rows"] == 1 and manifest["summary"] == {"kept": 2, "sha256": manifest["sha256"]}
    assert (tmp_path / "train.parquet").exists() and (tmp_path / "extra.parquet").exists()


def test_a_split_hashed_before_the_unification_still_verifies(tmp_path):
    """Run data manifests used to hash a missing target (NaN once read) as JSON NaN."""
    split = to_dataset(_rows(["x", None]), "with a missing target")
    save_splits(tmp_path, {"train": split})
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    frame = split.to_pandas()
    legacy = rows_sha256(frame, prompt_columns(frame), nan_as_null=False)
    assert legacy != manifest["splits"]["train"]["sha256"]
    manifest["splits"]["train"]["sha256"] = legacy
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    assert load_split(tmp_path, "train")["target"] == ["x", None]
