"""The curated dataset of a run: train/eval parquet files and a manifest with their content hash."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import datasets
import pandas as pd

from spotrl.curation.schema import validate_rows
from spotrl.storage.atomic import atomic_write_json
from spotrl.storage.parquet import read_frame, write_frame

SPLITS = ("train", "eval")


def frame_hash(frame: pd.DataFrame) -> str:
    h = hashlib.sha256()
    for row in frame[["id", "prompt", "answer", "source"]].itertuples(index=False):
        h.update(json.dumps(list(row)).encode())
    return h.hexdigest()


def save_splits(root: str | Path, splits: dict[str, datasets.Dataset]) -> dict:
    """Write each split and then the manifest (the commit marker); returns the manifest."""
    root = Path(root)
    manifest = {"splits": {}}
    for name, ds in splits.items():
        frame = ds.to_pandas()
        write_frame(root / f"{name}.parquet", frame)
        manifest["splits"][name] = {"rows": len(frame), "sha256": frame_hash(frame)}
    manifest["sha256"] = hashlib.sha256(json.dumps(manifest["splits"], sort_keys=True).encode()).hexdigest()
    atomic_write_json(root / "manifest.json", manifest)
    return manifest


def load_split(root: str | Path, name: str) -> datasets.Dataset:
    path = Path(root) / f"{name}.parquet"
    frame = validate_rows(read_frame(path), str(path))
    return datasets.Dataset.from_pandas(frame, preserve_index=False)
