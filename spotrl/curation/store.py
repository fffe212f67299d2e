"""The curated dataset of a run: train/eval parquet files and a manifest with their content hash."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import datasets
import pandas as pd

from spotrl.curation.schema import validate_rows
from spotrl.storage.atomic import atomic_write_json
from spotrl.storage.parquet import CorruptFileError, read_frame, write_frame
from spotrl.storage.paths import as_path

SPLITS = ("train", "eval")


def frame_hash(frame: pd.DataFrame) -> str:
    h = hashlib.sha256()
    columns = ["id", "prompt", "answer", "source"] + (["target"] if "target" in frame.columns else [])
    for row in frame[columns].itertuples(index=False):
        h.update(json.dumps(list(row)).encode())
    return h.hexdigest()


def save_splits(root: str | Path, splits: dict[str, datasets.Dataset]) -> dict:
    """Write each split and then the manifest (the commit marker); returns the manifest."""
    root = as_path(root)
    manifest = {"splits": {}}
    for name, ds in splits.items():
        frame = ds.to_pandas()
        write_frame(root / f"{name}.parquet", frame)
        manifest["splits"][name] = {"rows": len(frame), "sha256": frame_hash(frame)}
    manifest["sha256"] = hashlib.sha256(json.dumps(manifest["splits"], sort_keys=True).encode()).hexdigest()
    atomic_write_json(root / "manifest.json", manifest)
    return manifest


def load_split(root: str | Path, name: str) -> datasets.Dataset:
    """A split, refused unless its rows hash to what the manifest recorded (nothing corrupt is read)."""
    path = as_path(root) / f"{name}.parquet"
    manifest_path = as_path(root) / "manifest.json"
    if not manifest_path.exists():
        raise CorruptFileError(f"{manifest_path}: missing; the curated data of this run is incomplete")
    frame = read_frame(path)
    expected = json.loads(manifest_path.read_text())["splits"][name]["sha256"]
    if frame_hash(frame) != expected:
        raise CorruptFileError(f"{path}: rows do not hash to the sha256 recorded in {manifest_path}")
    frame = validate_rows(frame, str(path))
    return datasets.Dataset.from_pandas(frame, preserve_index=False)


def damaged_splits(root: str | Path) -> str | None:
    """Why the curated data under `root` cannot be used, or None when every split verifies."""
    try:
        for name in json.loads((as_path(root) / "manifest.json").read_text())["splits"]:
            load_split(root, name)
    except FileNotFoundError as err:
        return f"missing file: {err.filename or err}"
    except Exception as err:  # noqa: BLE001 - any unreadable or mismatching split makes the data unusable
        return str(err)
    return None
