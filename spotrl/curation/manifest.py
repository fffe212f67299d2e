"""Datasets on disk: split parquet files and a manifest with their content hashes, written last.

`write_dataset` is the one writer: the curated dataset (`write_curated`: canonical splits, the
quarantine, the removed rows, the summary and the hash of the inputs, so a re-run with the same
inputs finds the dataset up to date and a Prefect task can key its cache on `inputs_sha256`) and a
run's prompt splits (store.py) both go through it, and `rows_sha256` is the one row hash.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from spotrl.curation.schema import CANONICAL_COLUMNS
from spotrl.storage.atomic import atomic_write_json
from spotrl.storage.parquet import CorruptFileError, read_frame, write_frame
from spotrl.storage.paths import as_path

FORMAT = "spotrl.curated/1"
CURATION_VERSION = 1  # bump when the same inputs would now curate differently


def rows_sha256(frame: pd.DataFrame, columns: Sequence[str], *, nan_as_null: bool = True) -> str:
    """sha256 over the rows' values in `columns`, one JSON list per row, in order. A missing value
    hashes as null whether it is None or NaN (parquet and pandas give back either).

    `nan_as_null=False` is the hash run data manifests recorded before this one (NaN as JSON NaN):
    only to verify the splits of a run directory written then (store.load_split).
    """
    h = hashlib.sha256()
    for row in frame[list(columns)].itertuples(index=False):
        if nan_as_null:
            row = [None if v is None or (isinstance(v, float) and v != v) else v for v in row]
        h.update(json.dumps(list(row)).encode())
    return h.hexdigest()


def canonical_columns(frame: pd.DataFrame) -> Sequence[str]:
    return CANONICAL_COLUMNS


def write_dataset(
    root: str | Path,
    splits: dict[str, pd.DataFrame],
    columns: Callable[[pd.DataFrame], Sequence[str]],
    fields: dict | None = None,
    files: dict[str, pd.DataFrame] | None = None,
    summary: dict | None = None,
) -> dict:
    """Write each split as NAME.parquet, each of `files` as NAME.parquet, then manifest.json (the
    commit marker): `fields`, per split its rows and `rows_sha256` over `columns(frame)`, `sha256`
    over the splits' entries (the dataset's content hash), per file its rows and file sha256, and
    `summary` with that sha256. Returns the manifest."""
    root = as_path(root)
    manifest = {**(fields or {}), "splits": {}}
    for name, frame in splits.items():
        write_frame(root / f"{name}.parquet", frame)
        manifest["splits"][name] = {"rows": len(frame), "sha256": rows_sha256(frame, columns(frame))}
    manifest["sha256"] = hashlib.sha256(json.dumps(manifest["splits"], sort_keys=True).encode()).hexdigest()
    for name, frame in (files or {}).items():
        manifest[name] = {"rows": len(frame), "file_sha256": write_frame(root / f"{name}.parquet", frame)}
    if summary is not None:
        manifest["summary"] = {**summary, "sha256": manifest["sha256"]}
    atomic_write_json(root / "manifest.json", manifest)
    return manifest


def inputs_hash(sources: list[dict], eval_sources: list[dict], options: dict) -> str:
    blob = json.dumps(
        {"version": CURATION_VERSION, "sources": sources, "eval": eval_sources, "options": options},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def write_curated(
    out: str | Path,
    splits: dict[str, pd.DataFrame],
    quarantine: pd.DataFrame,
    removed: pd.DataFrame,
    summary: dict,
    inputs: dict,
    inputs_sha256: str,
) -> dict:
    splits = {name: frame[list(CANONICAL_COLUMNS)].astype(object) for name, frame in splits.items()}
    return write_dataset(
        out,
        splits,
        canonical_columns,
        fields={"format": FORMAT, "inputs_sha256": inputs_sha256, "inputs": inputs},
        files={"quarantine": quarantine, "removed": removed},
        summary=summary,
    )


def read_manifest(out: str | Path) -> dict | None:
    try:
        return json.loads((as_path(out) / "manifest.json").read_text())
    except (FileNotFoundError, ValueError):
        return None


def load_curated(out: str | Path, name: str) -> pd.DataFrame:
    """A split, refused unless its rows hash to what the manifest recorded."""
    manifest = read_manifest(out)
    if manifest is None or manifest.get("format") != FORMAT:
        raise CorruptFileError(f"{as_path(out) / 'manifest.json'}: missing or not a curated-dataset manifest")
    if name not in manifest["splits"]:
        raise KeyError(f"no split {name!r} in {out} (splits: {sorted(manifest['splits'])})")
    path = as_path(out) / f"{name}.parquet"
    frame = read_frame(path)
    if rows_sha256(frame, CANONICAL_COLUMNS) != manifest["splits"][name]["sha256"]:
        raise CorruptFileError(f"{path}: rows do not hash to the sha256 recorded in the manifest")
    return frame


def up_to_date(out: str | Path, inputs_sha256: str) -> dict | None:
    """The manifest when `out` already holds a verified curation of exactly these inputs."""
    manifest = read_manifest(out)
    if manifest is None or manifest.get("inputs_sha256") != inputs_sha256:
        return None
    try:
        for name in manifest["splits"]:
            load_curated(out, name)
    except (OSError, CorruptFileError, KeyError, ValueError):
        return None
    return manifest
