"""Atomic, idempotent writes: locally a temporary sibling, fsync, then `os.replace`; on an object
store one PUT (an object appears whole or not at all)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from spotrl.storage.paths import RemotePath, as_path


def atomic_write_bytes(path: str | Path | RemotePath, data: bytes) -> None:
    path = as_path(path)
    if isinstance(path, RemotePath):
        path.write_bytes(data)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def sha256_file(path: str | Path | RemotePath, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with as_path(path).open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
