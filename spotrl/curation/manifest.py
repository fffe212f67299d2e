"""The curated dataset on disk: split parquet files, the quarantine, the removed rows and a manifest.

The manifest is written last (the commit marker) and records the content hash of each split (as
`store.frame_hash` does, over every canonical column) and the hash of the inputs (source contents,
mappings, options), so a re-run with the same inputs finds the dataset up to date and a Prefect task
can key its cache on `inputs_sha256`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pandas as pd

from spotrl.storage.paths import as_path
from spotrl.curation.schema import CANONICAL_COLUMNS
from spotrl.storage.atomic import atomic_write_json
from spotrl.storage.parquet import CorruptFileError, read_frame, write_frame

FORMAT = "spotrl.curated/1"
CURATION_VERSION = 1  # bump when the same inputs would now curate differently


def canonical_hash(frame: pd.DataFrame, columns=CANONICAL_COLUMNS) -> str:
    h = hashlib.sha256()
    for row in frame[list(columns)].itertuples(index=False):
        h.update(json.dumps([None if v is None or (isinstance(v, float) and v != v) else v for v in row]).encode())
    return h.hexdigest()


def inputs_hash(sources: list[dict], eval_sources: list[dict], options: dict) -> str:
    blob = json.dumps({"version": CURATION_VERSION, "sources": sources, "eval": eval_sources, "options": options},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def write_curated(out: str | Path, splits: dict[str, pd.DataFrame], quarantine: pd.DataFrame,
                  removed: pd.DataFrame, summary: dict, inputs: dict, inputs_sha256: str) -> dict:
    out = as_path(out)
    manifest = {"format": FORMAT, "splits": {}, "inputs_sha256": inputs_sha256, "inputs": inputs}
    for name, frame in splits.items():
        frame = frame[list(CANONICAL_COLUMNS)].astype(object)
        write_frame(out / f"{name}.parquet", frame)
        manifest["splits"][name] = {"rows": len(frame), "sha256": canonical_hash(frame)}
    manifest["sha256"] = hashlib.sha256(json.dumps(manifest["splits"], sort_keys=True).encode()).hexdigest()
    manifest["quarantine"] = {"rows": len(quarantine), "file_sha256": write_frame(out / "quarantine.parquet", quarantine)}
    manifest["removed"] = {"rows": len(removed), "file_sha256": write_frame(out / "removed.parquet", removed)}
    manifest["summary"] = {**summary, "sha256": manifest["sha256"]}
    atomic_write_json(out / "manifest.json", manifest)
    return manifest


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
    if canonical_hash(frame) != manifest["splits"][name]["sha256"]:
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
