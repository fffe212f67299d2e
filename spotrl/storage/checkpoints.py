"""Train-state checkpoints with orbax: arrays through StandardSave, run metadata as JSON.

One directory per iteration, `iter_000005/`. orbax writes it under a temporary name and commits it
by rename; we then *seal* it: `iter_000005.sealed.json` lists the sha256 of every file. Only sealed
checkpoints are restored, and a restore verifies the checksums first, so neither a checkpoint killed
mid-write nor a corrupted one is ever read. The metadata holds everything that is not an array and
decides the future of the run: iteration, weights version, data cursor, seed.
"""

from __future__ import annotations

import hashlib
import json
import re

import jax
import orbax.checkpoint as ocp

from spotrl.faults import failpoint
from spotrl.storage.atomic import atomic_write_json, sha256_file
from spotrl.storage.paths import AnyPath, RemotePath, as_path, files_under, remove, tensorstore_follows_emulator

_NAME = re.compile(r"^iter_(\d{6})$")


class CheckpointError(RuntimeError):
    pass


class CheckpointStore:
    def __init__(self, root: str | AnyPath, keep: int = 3):
        # a gs:// root is written by orbax itself (tensorstore's GCS driver; it has no rename there,
        # so it commits with commit_success.txt, which `committed` checks on either kind of root)
        self.root = as_path(root)
        if isinstance(self.root, RemotePath):
            tensorstore_follows_emulator()
        self.keep = keep
        self._checkpointer = ocp.Checkpointer(ocp.CompositeCheckpointHandler())

    def path(self, iteration: int) -> AnyPath:
        return self.root / f"iter_{iteration:06d}"

    def seal_path(self, iteration: int) -> AnyPath:
        return self.root / f"iter_{iteration:06d}.sealed.json"

    def committed(self, iteration: int) -> bool:
        return (self.path(iteration) / "commit_success.txt").exists()

    def sealed_iterations(self) -> list[int]:
        if not self.root.exists():
            return []
        found = [int(m.group(1)) for p in self.root.iterdir() if (m := _NAME.match(p.name))]
        return sorted(i for i in found if self.seal_path(i).exists())

    def leftovers(self) -> list[AnyPath]:
        """orbax temporaries of saves that were killed before their commit rename."""
        if not self.root.exists():
            return []
        return sorted(p for p in self.root.iterdir() if ".orbax-checkpoint-tmp" in p.name)

    def ref(self, iteration: int) -> dict:
        """The reference the flow passes around for a sealed checkpoint (a Prefect cache-key input)."""
        seal = json.loads(self.seal_path(iteration).read_text())
        return {"uri": str(self.path(iteration)), "iteration": iteration, "sha256": seal["sha256"]}

    def metadata(self, iteration: int) -> dict:
        """The JSON metadata of a committed checkpoint, without reading its arrays."""
        return json.loads((self.path(iteration) / "meta" / "metadata").read_text())

    def save(self, iteration: int, state, metadata: dict) -> AnyPath:
        """Save a pytree of arrays and a JSON-able dict; idempotent for a committed iteration."""
        path = self.path(iteration)
        if not self.committed(iteration):
            self.root.mkdir(parents=True, exist_ok=True)
            failpoint("checkpoint.save", iteration)
            self._checkpointer.save(
                str(path),
                ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(metadata)),
                force=True,
            )
        return path

    def _checksums(self, iteration: int) -> dict[str, str]:
        path = self.path(iteration)
        return {str(f.relative_to(path)): sha256_file(f) for f in files_under(path)}

    def seal(self, iteration: int) -> dict:
        """Record the checksums of a committed checkpoint; returns the seal."""
        if not self.committed(iteration):
            raise CheckpointError(f"{self.path(iteration)}: not committed by orbax, cannot seal")
        files = self._checksums(iteration)
        digest = sha256_file_list(files)
        failpoint("checkpoint.seal", iteration)
        seal = {"iteration": iteration, "files": files, "sha256": digest}
        atomic_write_json(self.seal_path(iteration), seal)
        return seal

    def verify(self, iteration: int) -> None:
        seal_path = self.seal_path(iteration)
        if not seal_path.exists():
            raise CheckpointError(f"{self.path(iteration)}: not sealed")
        expected = json.loads(seal_path.read_text())["files"]
        actual = self._checksums(iteration)
        bad = sorted(k for k in expected.keys() | actual.keys() if expected.get(k) != actual.get(k))
        if bad:
            raise CheckpointError(f"{self.path(iteration)}: checksum mismatch in {bad[:5]}")

    def restore(self, iteration: int, template) -> tuple[object, dict]:
        """The state shaped like `template` (a pytree of arrays or ShapeDtypeStructs) and the metadata."""
        self.verify(iteration)
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
        restored = self._checkpointer.restore(
            str(self.path(iteration)),
            ocp.args.Composite(state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()),
        )
        # orbax returns containers as plain tuples/dicts: put the template's structure back
        state = jax.tree.unflatten(jax.tree.structure(template), jax.tree.leaves(restored.state))
        return state, dict(restored.meta)

    def prune(self) -> None:
        """Keep the newest `keep` sealed checkpoints."""
        for iteration in self.sealed_iterations()[: -self.keep]:
            self.seal_path(iteration).unlink(missing_ok=True)
            if self.path(iteration).exists():
                remove(self.path(iteration))


def sha256_file_list(files: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
