"""Run-directory paths: a local `pathlib.Path`, or a `RemotePath` for an fsspec URL (gs:// through gcsfs).

`as_path` is the one place that decides which. `RemotePath` implements the part of the pathlib API
the run directory uses (`/`, exists, read/write, iterdir, glob, rglob, unlink, relative_to), so the
stores, the records and resume work unchanged on either; the few operations pathlib has no name for
(remove a tree, move, write a whole file atomically) are functions here that accept both.

Object stores have no rename and no flock. What replaces them: a single object PUT is atomic (a
reader sees the old object or the new one, never a part), and a write can be made conditional on
the object's generation (`put_if_generation`), which is how LATEST and the run lease move.

gcsfs's listing cache is off: the trainer, the rollout workers and a resumed process all write the
same prefix, and a stale listing would hide a version or a checkpoint.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import os
import shutil
from pathlib import Path, PurePosixPath
from urllib.parse import quote

import fsspec
import fsspec.asyn
import fsspec.exceptions


class StorageError(RuntimeError):
    pass


@functools.cache
def filesystem(protocol: str):
    return fsspec.filesystem(protocol, use_listings_cache=False)


class RemotePath:
    """A file or prefix in an object store, addressed by URL (`gs://bucket/a/b`)."""

    def __init__(self, url: str):
        protocol, sep, key = str(url).partition("://")
        if not sep or not key.strip("/"):
            raise StorageError(f"{url}: not a URL with a bucket (expected e.g. gs://bucket/prefix)")
        self.protocol, self.key = protocol, key.strip("/")

    # --- naming ------------------------------------------------------------------------------------
    @property
    def fs(self):
        return filesystem(self.protocol)

    @property
    def url(self) -> str:
        return f"{self.protocol}://{self.key}"

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"RemotePath({self.url!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, RemotePath) and other.url == self.url

    def __lt__(self, other: RemotePath) -> bool:
        return self.url < other.url

    def __hash__(self) -> int:
        return hash(self.url)

    def __truediv__(self, part) -> RemotePath:
        return RemotePath(f"{self.url}/{str(part).strip('/')}")

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> RemotePath:
        return RemotePath(f"{self.protocol}://{self.key.rsplit('/', 1)[0]}")

    @property
    def bucket(self) -> str:
        return self.key.split("/", 1)[0]

    def with_name(self, name: str) -> RemotePath:
        return self.parent / name

    def relative_to(self, other: RemotePath) -> PurePosixPath:
        if not self.key.startswith(other.key + "/"):
            raise ValueError(f"{self} is not under {other}")
        return PurePosixPath(self.key[len(other.key) + 1 :])

    def resolve(self) -> RemotePath:
        return self

    def _child(self, key: str) -> RemotePath:
        return RemotePath(f"{self.protocol}://{key}")

    # --- queries -----------------------------------------------------------------------------------
    def exists(self) -> bool:
        return self.fs.exists(self.key)

    def is_dir(self) -> bool:
        return self.fs.isdir(self.key)

    def is_file(self) -> bool:
        return self.fs.isfile(self.key)

    def iterdir(self) -> list[RemotePath]:
        if not self.fs.exists(self.key):
            return []
        return [
            self._child(k.rstrip("/")) for k in sorted(self.fs.ls(self.key, detail=False)) if k.rstrip("/") != self.key
        ]

    def glob(self, pattern: str) -> list[RemotePath]:
        return [self._child(k) for k in sorted(self.fs.glob(f"{self.key}/{pattern}"))]

    def rglob(self, pattern: str) -> list[RemotePath]:
        """Files under this prefix whose name matches (object stores have files only)."""
        return [p for p in files_under(self) if fnmatch.fnmatch(p.name, pattern)]

    # --- contents ----------------------------------------------------------------------------------
    def read_bytes(self) -> bytes:
        return self.fs.cat_file(self.key)

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def write_bytes(self, data: bytes) -> None:
        self.fs.pipe_file(self.key, data)  # one PUT: the object appears whole or not at all

    def write_text(self, text: str) -> None:
        self.write_bytes(text.encode())

    def open(self, mode: str = "rb", **kwargs):
        """As pathlib's: text modes take encoding= (and newline=), read with universal newlines."""
        return self.fs.open(self.key, mode, **kwargs)

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Nothing to do: a prefix exists as soon as an object is written under it."""

    def unlink(self, missing_ok: bool = False) -> None:
        try:
            self.fs.rm_file(self.key)
        except FileNotFoundError:
            if not missing_ok:
                raise


AnyPath = Path | RemotePath


def is_url(path) -> bool:
    text = str(path)
    return "://" in text and not text.startswith("file://")


def as_path(path: str | os.PathLike | RemotePath) -> AnyPath:
    if isinstance(path, (Path, RemotePath)):
        return path
    if is_url(path):
        return RemotePath(str(path))
    return Path(str(path).removeprefix("file://"))


def files_under(path: AnyPath) -> list[AnyPath]:
    """Every file below `path`, sorted ([] when it does not exist)."""
    if isinstance(path, RemotePath):
        return [path._child(k) for k in sorted(path.fs.find(path.key))] if path.fs.exists(path.key) else []
    return sorted(f for f in path.rglob("*") if f.is_file()) if path.exists() else []


def remove(path: AnyPath) -> None:
    """Delete a file or a whole tree."""
    if isinstance(path, RemotePath):
        path.fs.rm(path.key, recursive=True)
    elif path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()


def move(source: AnyPath, dest: AnyPath) -> None:
    """Rename (local) or copy-then-delete (object store: there is no rename)."""
    if isinstance(source, RemotePath):
        source.fs.mv(source.key, dest.key, recursive=True)
    else:
        os.rename(source, dest)


def append_line(path: AnyPath, line: str) -> None:
    """Append one line to a small log file (an object store rewrites the object whole)."""
    if isinstance(path, RemotePath):
        old = path.read_bytes() if path.exists() else b""
        path.write_bytes(old + line.encode() + b"\n")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as log:
        log.write(line + "\n")


def check_reachable(path: AnyPath, timeout: float = 20.0) -> None:
    """Fail before any work when a remote run directory cannot be used: no bucket, no network, no access.

    Bounded: gcsfs retries a refused connection for about a minute before it gives up.
    """
    if not isinstance(path, RemotePath):
        return
    fs = path.fs
    try:
        if getattr(fs, "async_impl", False):
            found = fsspec.asyn.sync(fs.loop, fs._exists, path.bucket, timeout=timeout)
        else:
            found = fs.exists(path.bucket)
    except fsspec.exceptions.FSTimeoutError:
        raise StorageError(f"{path}: storage not reachable: no answer within {timeout:g} s") from None
    except Exception as err:  # noqa: BLE001 - unreachable endpoint, no credentials, no permission
        raise StorageError(f"{path}: storage not reachable: {type(err).__name__}: {err}") from err
    if not found:
        raise StorageError(f"{path}: bucket gs://{path.bucket} does not exist (create it first)")


def upload_tree(local: Path, remote: RemotePath, last: str) -> None:
    """Copy a local directory to `remote`, the file `last` (a commit marker) after all the others."""
    files = sorted(f for f in local.rglob("*") if f.is_file())
    marker = local / last
    first = [f for f in files if f != marker]
    remote.fs.put([str(f) for f in first], [f"{remote.key}/{f.relative_to(local).as_posix()}" for f in first])
    remote.fs.put_file(str(marker), f"{remote.key}/{last}")


def download_tree(remote: RemotePath, local: Path) -> None:
    files = files_under(remote)
    for f in files:
        (local / f.relative_to(remote)).parent.mkdir(parents=True, exist_ok=True)
    remote.fs.get([f.key for f in files], [str(local / f.relative_to(remote)) for f in files])


# --- conditional writes (generation preconditions) -------------------------------------------------
def generation(path: RemotePath) -> int:
    """The object's generation, 0 when it does not exist (the precondition "create only")."""
    try:
        return int(path.fs.info(path.key)["generation"])
    except FileNotFoundError:
        return 0


def put_if_generation(path: RemotePath, data: bytes, expected: int) -> int | None:
    """Write `data` only if the object's generation is still `expected` (0: only if absent).

    Returns the new generation, or None when someone else changed the object first (HTTP 412): the
    caller re-reads and decides again. This is GCS's compare-and-swap.
    """
    fs = path.fs
    try:
        _, body = fs.call(
            "POST",
            f"{fs._location}/upload/storage/v1/b/{quote(path.bucket, safe='')}/o",
            uploadType="media",
            name=path.key.split("/", 1)[1],
            ifGenerationMatch=str(expected),
            data=data,
            headers={"Content-Type": "application/octet-stream"},
        )
    except FileExistsError:  # gcsfs's name for 412 Precondition Failed
        return None
    return int(json.loads(body)["generation"])


def delete_if_generation(path: RemotePath, expected: int) -> bool:
    try:
        path.fs.call("DELETE", "b/{}/o/{}", path.bucket, path.key.split("/", 1)[1], ifGenerationMatch=str(expected))
    except (FileExistsError, FileNotFoundError):
        return False
    return True
