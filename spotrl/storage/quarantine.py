"""Damaged artifacts are moved aside, never deleted: RUN/quarantine/<relative path>, with a log line.

A checkpoint, weight version or rollout shard that fails its checksum is evidence (a bad disk, a
bug, someone editing the run directory); the run continues from the last complete one and the
damaged copy stays inspectable.
"""

from __future__ import annotations

import time

from spotrl.storage.paths import AnyPath, as_path, move
from spotrl.storage.records import append_record, read_jsonl

QUARANTINE = "quarantine"


def quarantine(run_dir: AnyPath, path: AnyPath, reason: str) -> AnyPath:
    """Move `path` (file or directory inside `run_dir`) under RUN/quarantine/; returns the new path."""
    run_dir, path = as_path(run_dir), as_path(path)
    relative = path.resolve().relative_to(run_dir.resolve())
    dest = run_dir / QUARANTINE / relative
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
    append_record(run_dir / QUARANTINE / "log.jsonl", record)
    return dest


def quarantine_log(run_dir: AnyPath) -> list[dict]:
    path = as_path(run_dir) / QUARANTINE / "log.jsonl"
    return read_jsonl(path) if path.exists() else []
