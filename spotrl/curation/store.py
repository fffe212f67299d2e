"""The curated dataset of a run: train/eval parquet files and a manifest with their content hash."""

from __future__ import annotations

from pathlib import Path

import datasets
import pandas as pd

from spotrl.curation.manifest import rows_sha256, write_dataset
from spotrl.curation.schema import validate_rows
from spotrl.storage.parquet import CorruptFileError, read_frame
from spotrl.storage.paths import as_path
from spotrl.storage.records import RecordError, read_json

SPLITS = ("train", "eval")


def prompt_columns(frame: pd.DataFrame) -> list[str]:
    """The columns a prompt split's hash covers: id, prompt, answer, source, and target where present."""
    return ["id", "prompt", "answer", "source"] + (["target"] if "target" in frame.columns else [])


def save_splits(root: str | Path, splits: dict[str, datasets.Dataset]) -> dict:
    """Write each split and then the manifest (the commit marker); returns the manifest."""
    return write_dataset(root, {name: ds.to_pandas() for name, ds in splits.items()}, prompt_columns)


def load_split(root: str | Path, name: str) -> datasets.Dataset:
    """A split, refused unless its rows hash to what the manifest recorded (nothing corrupt is read)."""
    path = as_path(root) / f"{name}.parquet"
    manifest_path = as_path(root) / "manifest.json"
    if not manifest_path.exists():
        raise CorruptFileError(f"{manifest_path}: missing; the curated data of this run is incomplete")
    frame = read_frame(path)
    try:
        expected = read_json(manifest_path, keys=("splits",))["splits"][name]["sha256"]
    except (RecordError, KeyError, TypeError) as err:
        raise CorruptFileError(f"{manifest_path}: damaged ({err})") from None
    columns = prompt_columns(frame)
    # a run directory written before the hashes were unified recorded NaN as NaN: it still verifies
    if expected not in (rows_sha256(frame, columns), rows_sha256(frame, columns, nan_as_null=False)):
        raise CorruptFileError(f"{path}: rows do not hash to the sha256 recorded in {manifest_path}")
    frame = validate_rows(frame, str(path))
    return datasets.Dataset.from_pandas(frame, preserve_index=False)


def data_sha256(root: str | Path) -> str | None:
    """The content hash the manifest records for all splits; None when there is no manifest."""
    try:
        return read_json(as_path(root) / "manifest.json", keys=("sha256",))["sha256"]
    except FileNotFoundError:
        return None


def damaged_splits(root: str | Path) -> str | None:
    """Why the curated data under `root` cannot be used, or None when every split verifies."""
    try:
        for name in read_json(as_path(root) / "manifest.json", keys=("splits",))["splits"]:
            load_split(root, name)
    except FileNotFoundError as err:
        return f"missing file: {err.filename or err}"
    except Exception as err:  # noqa: BLE001 - any unreadable or mismatching split makes the data unusable
        return str(err)
    return None
