"""Where Prefect persists task results: RUN/prefect-results, on local disk or on an object store.

Prefect takes a local `Path` as is, but any other storage only as a *saved* block (an unsaved one
raises TypeError when the task is configured). For a gs:// run directory we save a
`RemoteFileSystem` block (fsspec, so gcsfs) under a name derived from the URL: the same run
directory always maps to the same block, and saving it again on resume overwrites it unchanged.
"""

from __future__ import annotations

import hashlib

from spotrl.storage.paths import AnyPath, RemotePath


def result_storage(path: AnyPath):
    """A value for a task's `result_storage` that persists under `path`."""
    if not isinstance(path, RemotePath):
        return path
    from prefect.filesystems import RemoteFileSystem

    name = "spotrl-results-" + hashlib.sha256(path.url.encode()).hexdigest()[:16]
    block = RemoteFileSystem(basepath=path.url)
    block.save(name, overwrite=True)
    return block
