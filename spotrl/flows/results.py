"""Where Prefect persists task results: RUN/prefect-results, on local disk or on an object store.

Prefect takes a local `Path` as is, but any other storage only as a *saved* block (an unsaved one
raises TypeError when the task is configured). Both kinds are saved blocks here, under a name
derived from the location: the same run directory always maps to the same block, and saving it
again on resume overwrites it unchanged.
  gs://...  a `RemoteFileSystem` block (fsspec, so gcsfs);
  local     a `RunResultStorage` block: Prefect's `LocalFileSystem`, less its path resolution.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from prefect.exceptions import ObjectAlreadyExists
from prefect.filesystems import LocalFileSystem

from spotrl.storage.paths import AnyPath, RemotePath


class RunResultStorage(LocalFileSystem):
    """A local result directory whose keys are joined to it, not resolved against the disk.

    `LocalFileSystem` resolves the base path and the key with `Path.resolve()` on each of the five
    accesses a task run makes: ~35 `lstat` calls, each a point where Prefect's event threads take
    the GIL from the task engine. Measured: ~1 ms of the ~7-8 ms a task run costs the flow, on the
    critical path of every stage (benchmarks/README.md). The base path is resolved once, when the
    block is made; a key (a cache-key hash) that would leave it is refused, as Prefect does.
    """

    _block_type_name = "spotrl Run Result Storage"
    _block_type_slug = "spotrl-run-result-storage"

    def _resolve_path(self, path: str | None) -> Path:
        base = Path(self.basepath)
        if path is None:
            return base
        resolved = Path(os.path.normpath(base / path))
        if base not in resolved.parents:
            raise ValueError(f"Provided path {resolved} is outside of the base path {base}.")
        return resolved


def result_storage(path: AnyPath):
    """A value for a task's `result_storage` that persists under `path` (a saved block)."""
    if isinstance(path, RemotePath):
        from prefect.filesystems import RemoteFileSystem

        location, block = path.url, RemoteFileSystem(basepath=path.url)
    else:
        location = str(Path(path).expanduser().resolve())
        block = RunResultStorage(basepath=location)
    name = "spotrl-results-" + hashlib.sha256(location.encode()).hexdigest()[:16]
    for attempt in range(3):
        try:
            block.save(name, overwrite=True)
            break
        except ObjectAlreadyExists:
            # two flow runs starting together on a fresh server both register the block type; the
            # loser's save is refused, and succeeds once the type exists (seen with a 2-slot worker)
            if attempt == 2:
                raise
    return block
