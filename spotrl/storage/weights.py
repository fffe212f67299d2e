"""The weight store (parameter server): versioned, checksummed, published with an atomic LATEST flip.

The root is a local directory or any fsspec URL (`gs://bucket/prefix` through gcsfs; tests use a
local GCS emulator through STORAGE_EMULATOR_HOST). Layout under the root:

    v000003/model.safetensors   the parameters, flat names
    v000003/manifest.json       version, sha256 and size of the file; written last: the commit marker
    LATEST                      the newest complete version number, replaced atomically
    leases/<holder>-v000003.json   a worker holds version 3 until the lease expires

A version without its manifest was killed mid-write: it is invisible to readers and rewritten by
the next publish. A single object (or a local file through os.replace) is replaced atomically, so
LATEST never shows a partial value, and it only moves forward: on an object store the flip is a
compare-and-swap on LATEST's generation, so of two publishers racing, the one that read a LATEST
that has meanwhile changed loses its write, reads again, and only writes if it is still newer.
Retention keeps the newest `keep`
versions, the pinned ones (a KL reference), and any version under an unexpired lease.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path

import fsspec
import numpy as np
from fsspec.implementations.local import LocalFileSystem
from safetensors.numpy import load as load_bytes
from safetensors.numpy import save as save_bytes

from spotrl.faults import failpoint
from spotrl.storage.atomic import atomic_write_bytes
from spotrl.storage.paths import RemotePath, filesystem, generation, put_if_generation
from spotrl.storage.pytrees import flatten, unflatten_like
from spotrl.storage.records import RecordError, parse_json

WEIGHTS_FILE = "model.safetensors"
MANIFEST = "manifest.json"
_VERSION = re.compile(r"^v(\d{6})$")


class WeightStoreError(RuntimeError):
    pass


class WeightStore:
    def __init__(
        self, root: str | Path, keep: int = 3, pinned: tuple[int, ...] = (), storage_options: dict | None = None
    ):
        self.url = str(root)
        if storage_options:
            self.fs, self.path = fsspec.core.url_to_fs(self.url, **storage_options)
        else:  # the run directory's filesystem (no listing cache: other processes write here too)
            protocol, path = fsspec.core.split_protocol(self.url)
            self.fs = filesystem(protocol or "file")
            self.path = self.fs._strip_protocol(self.url)
        self.local = isinstance(self.fs, LocalFileSystem)
        self.root = Path(self.path) if self.local else self.url
        self.keep = keep
        self.pinned = set(pinned)  # versions never collected (a KL reference policy)

    # --- paths -----------------------------------------------------------------------------------
    def _p(self, *parts: str) -> str:
        return "/".join([self.path.rstrip("/"), *parts])

    def version_dir(self, version: int) -> Path | str:
        name = f"v{version:06d}"
        return self.root / name if self.local else f"{self.url.rstrip('/')}/{name}"

    def _where(self, *parts: str) -> str:
        return str(Path(self.path, *parts)) if self.local else "/".join([self.url.rstrip("/"), *parts])

    # --- I/O with errors that name the path ------------------------------------------------------
    def _read(self, *parts: str) -> bytes:
        try:
            return self.fs.cat_file(self._p(*parts))
        except FileNotFoundError:
            raise
        except Exception as err:  # noqa: BLE001 - unreachable store, no permission, network
            raise WeightStoreError(f"{self._where(*parts)}: cannot read: {type(err).__name__}: {err}") from err

    def _write(self, data: bytes, *parts: str) -> None:
        try:
            if self.local:
                atomic_write_bytes(self._p(*parts), data)
            else:
                self.fs.pipe_file(self._p(*parts), data)  # an object appears whole or not at all
        except Exception as err:  # noqa: BLE001
            raise WeightStoreError(f"{self._where(*parts)}: cannot write: {type(err).__name__}: {err}") from err

    def _listing(self) -> list[str]:
        """Every file under the root, relative to it ([] when the root does not exist yet)."""
        try:
            found = self.fs.find(self.path) if self.fs.exists(self.path) else []
        except Exception as err:  # noqa: BLE001
            raise WeightStoreError(f"{self.url}: cannot list: {type(err).__name__}: {err}") from err
        base = self.path.rstrip("/") + "/"
        return [f[len(base) :] for f in (str(x) for x in found) if f.startswith(base)]

    # --- versions --------------------------------------------------------------------------------
    def _version_files(self) -> dict[int, set[str]]:
        files: dict[int, set[str]] = {}
        for rel in self._listing():
            head, _, rest = rel.partition("/")
            if (m := _VERSION.match(head)) and rest:
                files.setdefault(int(m.group(1)), set()).add(rest)
        return files

    def versions(self) -> list[int]:
        return sorted(v for v, names in self._version_files().items() if MANIFEST in names)

    def incomplete(self) -> list[Path | str]:
        """Version directories without a manifest: writes killed before their commit."""
        return [self.version_dir(v) for v, names in sorted(self._version_files().items()) if MANIFEST not in names]

    def leftovers(self) -> list[Path]:
        """Temporaries of older local publishes (write-then-rename) killed before the rename."""
        return sorted(self.root.glob(".tmp-v*")) if self.local and self.root.exists() else []

    def remove(self, version_dir: Path | str) -> None:
        self.fs.rm(str(version_dir), recursive=True)

    def pointer(self) -> int | None:
        """What LATEST says; None when it is missing or not a version number (damaged: only the
        publisher's own writes make it, so a reader must not trust garbage there)."""
        try:
            text = self._read("LATEST")
        except FileNotFoundError:
            return None
        try:
            return int(text.decode().strip())
        except ValueError:  # UnicodeDecodeError is a ValueError too
            return None

    def pointer_damaged(self) -> bool:
        return self.pointer() is None and self.fs.exists(self._p("LATEST"))

    def latest(self) -> int | None:
        """The newest published version: LATEST, or the newest complete version when LATEST is
        missing or damaged (a manifest is written last, so a version that has one is complete)."""
        pointer = self.pointer()
        return pointer if pointer is not None else max(self.versions(), default=None)

    def publish(self, version: int, params: dict, extra: dict | None = None) -> dict:
        """Write `params` (a nested dict of arrays) as `version` and point LATEST at it. Idempotent."""
        if version not in self.versions():
            failpoint("publish.write", version)
            flat = {k: np.ascontiguousarray(np.asarray(v)) for k, v in flatten(params).items()}
            data = save_bytes(flat)
            name = f"v{version:06d}"
            self._write(data, name, WEIGHTS_FILE)
            manifest = {
                "version": version,
                "sha256": hashlib.sha256(data).hexdigest(),
                "bytes": len(data),
                "tensors": len(flat),
                **(extra or {}),
            }
            self._write((json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode(), name, MANIFEST)
        failpoint("publish.flip", version)
        self._advance_latest(version)
        manifest = self.manifest(version)
        self.collect_garbage()
        return manifest

    def _advance_latest(self, version: int) -> None:
        """Point LATEST at `version` unless it already points at a version as new or newer."""
        if self.local:  # one trainer per run directory (RUN/.lock): os.replace is enough
            current = self.pointer()
            if current is None or version > current:
                self._write(f"{version}\n".encode(), "LATEST")
            return
        latest = RemotePath(self._where("LATEST"))
        for _ in range(100):
            seen = generation(latest)
            current = self.pointer() if seen else None
            if current is not None and current >= version:
                return
            try:
                if put_if_generation(latest, f"{version}\n".encode(), seen) is not None:
                    return
            except Exception as err:  # noqa: BLE001
                raise WeightStoreError(f"{latest}: cannot write: {type(err).__name__}: {err}") from err
            # another publisher changed LATEST after we read it: read again and decide again
        raise WeightStoreError(f"{latest}: lost the compare-and-swap 100 times in a row; is something rewriting it?")

    def manifest(self, version: int) -> dict:
        where = self._where(f"v{version:06d}", MANIFEST)
        try:
            manifest = parse_json(self._read(f"v{version:06d}", MANIFEST), where, keys=("version", "sha256"))
        except FileNotFoundError:
            raise WeightStoreError(f"weight version {version} not found at {where}") from None
        except RecordError as err:
            raise WeightStoreError(f"damaged manifest: {err}") from None
        if manifest["version"] != version:
            raise WeightStoreError(f"damaged manifest: {where}: it is version {manifest['version']}'s")
        return manifest

    def ref(self, version: int) -> dict:
        """The reference the flow passes around for a published version (a Prefect cache-key input)."""
        return {"uri": str(self.version_dir(version)), "version": version, "sha256": self.manifest(version)["sha256"]}

    def _verified_bytes(self, version: int) -> bytes:
        expected = self.manifest(version)["sha256"]
        try:
            data = self._read(f"v{version:06d}", WEIGHTS_FILE)
        except FileNotFoundError:
            raise WeightStoreError(f"{self._where(f'v{version:06d}', WEIGHTS_FILE)}: missing") from None
        if hashlib.sha256(data).hexdigest() != expected:
            raise WeightStoreError(
                f"{self._where(f'v{version:06d}', WEIGHTS_FILE)}: checksum mismatch with its manifest"
            )
        return data

    def digest(self, version: int | None = None) -> str:
        """The recorded sha256 of a version's weights file (default: LATEST)."""
        return self.manifest(self.resolve(version))["sha256"]

    def verified_digest(self, version: int | None = None) -> str:
        """The sha256 of a version's weights file, checked against its manifest."""
        return hashlib.sha256(self._verified_bytes(self.resolve(version))).hexdigest()

    def load(self, version: int | None, template: dict) -> dict:
        """Read and verify a version; returns a nested dict shaped like `template`."""
        version = self.resolve(version)
        tensors = load_bytes(self._verified_bytes(version))
        return unflatten_like(template, tensors, source=self._where(f"v{version:06d}", WEIGHTS_FILE))

    def wait_for(self, version: int, timeout: float, poll: float = 0.5) -> None:
        """Block until `version` is published, at most `timeout` seconds (a worker ahead of the trainer)."""
        deadline = time.monotonic() + timeout
        while version not in self.versions():
            if time.monotonic() >= deadline:
                raise WeightStoreError(
                    f"{self.url}: weight version {version} not published after {timeout:g} s "
                    f"(newest: {self.latest()}); is the trainer running?"
                )
            time.sleep(poll)

    def resolve(self, version: int | None) -> int:
        if version is None:
            version = self.latest()
            if version is None:
                raise WeightStoreError(f"no published weights under {self.url}")
        return version

    def repoint(self, version: int | None) -> None:
        """Recovery only: point LATEST at `version` (possibly backwards, after newer ones were moved aside)."""
        if version is None:
            if self.fs.exists(self._p("LATEST")):
                self.fs.rm(self._p("LATEST"))
        else:
            self._write(f"{version}\n".encode(), "LATEST")

    # --- leases and retention --------------------------------------------------------------------
    def hold(self, version: int, holder: str, ttl_seconds: float = 600.0) -> None:
        """Record that `holder` (a worker) uses `version`: retention keeps it until the lease expires."""
        lease = {"version": version, "holder": holder, "expires_unix": time.time() + ttl_seconds}
        self._write(json.dumps(lease).encode(), "leases", _lease_name(holder, version))

    def release(self, version: int, holder: str) -> None:
        path = self._p("leases", _lease_name(holder, version))
        if self.fs.exists(path):
            self.fs.rm(path)

    def held(self) -> set[int]:
        """Versions under an unexpired lease (expired lease files are removed)."""
        now, held = time.time(), set()
        for rel in self._listing():
            if not rel.startswith("leases/"):
                continue
            try:
                lease = json.loads(self._read(rel))
            except (FileNotFoundError, ValueError):
                continue  # released meanwhile, or a lease killed mid-write (local)
            if lease["expires_unix"] > now:
                held.add(lease["version"])
            else:
                self.fs.rm(self._p(rel))
        return held

    def collect_garbage(self) -> None:
        """Delete complete versions older than the newest `keep`, except pinned and leased ones."""
        old = [v for v in self.versions()[: -self.keep] if v not in self.pinned]
        if old:
            held = self.held()
            for version in old:
                if version not in held:
                    self.fs.rm(self._p(f"v{version:06d}"), recursive=True)


def _lease_name(holder: str, version: int) -> str:
    """A lease's file name: the holder (a worker id, host:pid) with ':' made safe for any filesystem."""
    return f"{holder.replace(':', '-')}-v{version:06d}.json"
