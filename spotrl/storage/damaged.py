"""Damaged artifacts are moved aside, never deleted: RUN/quarantine/<relative path>, with a log line.

A checkpoint, weight version or rollout shard that fails its checksum is evidence (a bad disk, a
bug, someone editing the run directory); the run continues from the last complete one and the
damaged copy stays inspectable.

Not curation's quarantine: RUN/quarantine.parquet holds the input rows curation could not use
(spotrl/curation/rundata.py). The directory keeps the name existing run directories have.
"""

from __future__ import annotations

import time

from spotrl.storage.paths import AnyPath, as_path, move
from spotrl.storage.records import append_record, read_jsonl

DAMAGED_DIR = "quarantine"  # RUN/quarantine/


def move_aside(run_dir: AnyPath, path: AnyPath, reason: str) -> AnyPath:
    """Move `path` (file or directory inside `run_dir`) under RUN/quarantine/; returns the new path."""
    run_dir, path = as_path(run_dir), as_path(path)
    relative = path.resolve().relative_to(run_dir.resolve())
    dest = run_dir / DAMAGED_DIR / relative
    n = 0
    while dest.exists():
        n += 1
        dest = dest.with_name(f"{relative.name}.{n}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    move(path, dest)
    record = {
        "path": str(relative),
        "moved_to": str(dest.relative_to(run_dir)),
        "reason": reason,
        "unix_time": time.time(),
    }
    append_record(run_dir / DAMAGED_DIR / "log.jsonl", record)
    return dest


def damaged_log(run_dir: AnyPath) -> list[dict]:
    """The records of what `move_aside` moved, oldest first."""
    path = as_path(run_dir) / DAMAGED_DIR / "log.jsonl"
    return read_jsonl(path) if path.exists() else []
