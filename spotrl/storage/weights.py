"""The weight store (parameter server): versioned, checksummed, published with an atomic LATEST flip.

Layout under the store root:
    v000003/model.safetensors   the parameters, flat names
    v000003/manifest.json       version, sha256 and size of the file, the step that produced it
    LATEST                      the newest complete version number, replaced atomically

A version directory is written under a temporary name and renamed into place complete, so a
reader never sees a partial version; LATEST only moves forward and only after the rename.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from spotrl.faults import failpoint
from spotrl.storage.atomic import atomic_write_json, atomic_write_text, sha256_file
from spotrl.storage.pytrees import flatten, unflatten_like

WEIGHTS_FILE = "model.safetensors"
MANIFEST = "manifest.json"


class WeightStoreError(RuntimeError):
    pass


class WeightStore:
    def __init__(self, root: str | Path, keep: int = 3, pinned: tuple[int, ...] = ()):
        self.root = Path(root)
        self.keep = keep
        self.pinned = set(pinned)  # versions never collected (a KL reference policy)

    def version_dir(self, version: int) -> Path:
        return self.root / f"v{version:06d}"

    def latest(self) -> int | None:
        pointer = self.root / "LATEST"
        if not pointer.exists():
            return None
        return int(pointer.read_text().strip())

    def versions(self) -> list[int]:
        if not self.root.exists():
            return []
        return sorted(int(p.name[1:]) for p in self.root.glob("v[0-9]*") if (p / MANIFEST).exists())

    def publish(self, version: int, params: dict, extra: dict | None = None) -> dict:
        """Write `params` (a nested dict of arrays) as `version` and point LATEST at it. Idempotent."""
        final = self.version_dir(version)
        if not (final / MANIFEST).exists():
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=self.root, prefix=f".tmp-v{version:06d}-"))
            try:
                failpoint("publish.write", version)
                flat = {k: np.ascontiguousarray(np.asarray(v)) for k, v in flatten(params).items()}
                save_file(flat, str(tmp / WEIGHTS_FILE))
                manifest = {
                    "version": version,
                    "sha256": sha256_file(tmp / WEIGHTS_FILE),
                    "bytes": (tmp / WEIGHTS_FILE).stat().st_size,
                    "tensors": len(flat),
                    **(extra or {}),
                }
                atomic_write_json(tmp / MANIFEST, manifest)
                if final.exists():  # a version killed before its manifest: never complete, replace it
                    shutil.rmtree(final)
                os.rename(tmp, final)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        failpoint("publish.flip", version)
        current = self.latest()
        if current is None or version > current:
            atomic_write_text(self.root / "LATEST", f"{version}\n")
        self.collect_garbage()
        return self.manifest(version)

    def ref(self, version: int) -> dict:
        """The reference the flow passes around for a published version (a Prefect cache-key input)."""
        return {"uri": str(self.version_dir(version)), "version": version, "sha256": self.manifest(version)["sha256"]}

    def leftovers(self) -> list[Path]:
        """Temporary directories of publishes that were killed before their rename."""
        return sorted(self.root.glob(".tmp-v*")) if self.root.exists() else []

    def repoint(self, version: int | None) -> None:
        """Recovery only: point LATEST at `version` (possibly backwards, after quarantining newer ones)."""
        if version is None:
            (self.root / "LATEST").unlink(missing_ok=True)
        else:
            atomic_write_text(self.root / "LATEST", f"{version}\n")

    def manifest(self, version: int) -> dict:
        path = self.version_dir(version) / MANIFEST
        if not path.exists():
            raise WeightStoreError(f"weight version {version} not found at {path}")
        return json.loads(path.read_text())

    def digest(self, version: int | None = None) -> str:
        """The recorded sha256 of a version's weights file (default: LATEST)."""
        return self.manifest(self.resolve(version))["sha256"]

    def verified_digest(self, version: int | None = None) -> str:
        """The sha256 of a version's weights file, checked against its manifest."""
        version = self.resolve(version)
        path = self.version_dir(version) / WEIGHTS_FILE
        actual = sha256_file(path)
        if actual != self.manifest(version)["sha256"]:
            raise WeightStoreError(f"{path}: checksum mismatch with its manifest")
        return actual

    def load(self, version: int | None, template: dict) -> dict:
        """Read and verify a version; returns a nested dict shaped like `template`."""
        version = self.resolve(version)
        self.verified_digest(version)
        path = self.version_dir(version) / WEIGHTS_FILE
        return unflatten_like(template, load_file(str(path)), source=str(path))

    def collect_garbage(self) -> None:
        """Delete complete versions older than the newest `keep`."""
        for version in self.versions()[: -self.keep]:
            if version in self.pinned:
                continue
            shutil.rmtree(self.version_dir(version), ignore_errors=True)

    def resolve(self, version: int | None) -> int:
        if version is None:
            version = self.latest()
            if version is None:
                raise WeightStoreError(f"no published weights under {self.root}")
        return version
