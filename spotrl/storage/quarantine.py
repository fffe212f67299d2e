"""Damaged artifacts are moved aside, never deleted: RUN/quarantine/<relative path>, with a log line.

A checkpoint, weight version or rollout shard that fails its checksum is evidence (a bad disk, a
bug, someone editing the run directory); the run continues from the last complete one and the
damaged copy stays inspectable.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

QUARANTINE = "quarantine"


def quarantine(run_dir: Path, path: Path, reason: str) -> Path:
    """Move `path` (file or directory inside `run_dir`) under RUN/quarantine/; returns the new path."""
    relative = Path(path).resolve().relative_to(Path(run_dir).resolve())
    dest = Path(run_dir) / QUARANTINE / relative
    n = 0
    while dest.exists():
        n += 1
        dest = dest.with_name(f"{relative.name}.{n}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.rename(path, dest)
    record = {"path": str(relative), "moved_to": str(dest.relative_to(run_dir)), "reason": reason, "unix_time": time.time()}
    with open(Path(run_dir) / QUARANTINE / "log.jsonl", "a") as log:
        log.write(json.dumps(record) + "\n")
    return dest


def quarantine_log(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / QUARANTINE / "log.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
