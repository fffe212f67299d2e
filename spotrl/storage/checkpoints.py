"""Train-state checkpoints with orbax: arrays through StandardSave, run metadata as JSON.

One directory per iteration, `iter_000005/`. orbax writes it under a temporary name and commits it
by rename (and writes commit_success.txt, which `committed` checks); we then *seal* it:
`iter_000005.sealed.json` lists the sha256 of every file. Only sealed
checkpoints are restored, and a restore verifies the checksums first, so neither a checkpoint killed
mid-write nor a corrupted one is ever read. The metadata holds everything that is not an array and
decides the future of the run: iteration, weights version, data cursor, seed.

On an object store (gs://) orbax saves into a local staging directory, which is uploaded with
commit_success.txt last, and a restore downloads and checks the files before orbax reads them. orbax
can write gs:// itself (tensorstore's GCS driver, pointed at an emulator by TENSORSTORE_GCS_HTTP_URL),
but against gcp-storage-emulator its OCDBT manifest writes fail now and then ("Malformed
StorageGeneration"; the emulator ignores the generation preconditions OCDBT's manifest relies on),
and without OCDBT a save is 2.7x slower. Staging keeps one tested path for every object store, with
the same seal: the checksums are computed on the uploaded objects, so the seal also proves the upload.

A trainer over several processes (spotrl/distributed.py): every process calls `save` and `restore`
with the same arguments (orbax synchronises them; each process writes and reads the shards on its own
devices, process 0 the metadata and the commit), so the run directory must be storage every host
sees. On an object store orbax then writes gs:// itself (tensorstore), without staging: a local
staging directory would only hold this process's shards. That path is not exercised by the tests
(the emulator's caveat above). Sealing and pruning are process 0's alone (the checkpoint stage).

A small state on one device is saved *packed*: one flat array per dtype (item `packed/` instead of
`state/`), cut back into the template's leaves on restore. orbax's cost grows with the number of
arrays, not their bytes: the default run's 88 arrays (3.6 MB) took ~4x as long to save as the same
bytes in two. A large or sharded state keeps one array per leaf (each process writes its own shards,
and packing would copy a big state once more in host memory). The directory says which layout it holds.

A packed state can also be saved *in the background* (`save(..., background=True)`): the host copy is
taken at once (the caller may then donate the device buffers), the write runs on this store's own
thread, one save after another, and `wait(iteration)` returns when it has committed (raising its
error, if it failed; the next `wait` then writes again). Nothing reads an uncommitted save, so a kill
mid-write loses only that iteration, as with a synchronous save.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import re
import shutil
import tempfile
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from spotrl import distributed
from spotrl.faults import failpoint
from spotrl.storage.atomic import atomic_write_json, sha256_file
from spotrl.storage.paths import AnyPath, RemotePath, as_path, download_tree, files_under, remove, upload_tree
from spotrl.storage.records import RecordError, read_json

_NAME = re.compile(r"^iter_(\d{6})$")
COMMIT_MARKER = "commit_success.txt"  # orbax writes it last into a committed checkpoint
PACK_BELOW_BYTES = 256 << 20  # a state under this, on one device, is saved packed (see the module's docstring)


class CheckpointError(RuntimeError):
    pass


class CheckpointStore:
    def __init__(self, root: str | AnyPath, keep: int = 3):
        self.root = as_path(root)
        self.remote = isinstance(self.root, RemotePath)
        # staging through a local copy works for one process only (see the module's docstring)
        self.staged = self.remote and distributed.process_count() == 1
        self.keep = keep
        self._checkpointer = ocp.Checkpointer(ocp.CompositeCheckpointHandler())
        # background saves, one after another, with a checkpointer of their own (both made on first use)
        self._writer: concurrent.futures.ThreadPoolExecutor | None = None
        self._background_checkpointer: ocp.Checkpointer | None = None
        self._pending: dict[int, tuple] = {}  # iteration -> (write, its future or None: write again on wait)

    def path(self, iteration: int) -> AnyPath:
        return self.root / f"iter_{iteration:06d}"

    def seal_path(self, iteration: int) -> AnyPath:
        return self.root / f"iter_{iteration:06d}.sealed.json"

    def committed(self, iteration: int) -> bool:
        return (self.path(iteration) / COMMIT_MARKER).exists()

    def sealed(self, iteration: int) -> bool:
        return self.seal_path(iteration).exists()

    def sealed_iterations(self) -> list[int]:
        if not self.root.exists():
            return []
        found = [int(m.group(1)) for p in self.root.iterdir() if (m := _NAME.match(p.name))]
        return sorted(i for i in found if self.sealed(i))

    def leftovers(self) -> list[AnyPath]:
        """orbax temporaries of saves that were killed before their commit rename."""
        if not self.root.exists():
            return []
        return sorted(p for p in self.root.iterdir() if ".orbax-checkpoint-tmp" in p.name)

    def ref(self, iteration: int) -> dict:
        """The reference the flow passes around for a sealed checkpoint (a Prefect cache-key input)."""
        seal = self._seal(iteration)
        return {"uri": str(self.path(iteration)), "iteration": iteration, "sha256": seal["sha256"]}

    def _seal(self, iteration: int) -> dict:
        try:
            return read_json(self.seal_path(iteration), keys=("files", "sha256"))
        except FileNotFoundError:
            raise CheckpointError(f"{self.path(iteration)}: not sealed") from None
        except RecordError as err:
            raise CheckpointError(f"damaged seal: {err}") from None

    def metadata(self, iteration: int) -> dict:
        """The JSON metadata of a committed checkpoint, without reading its arrays."""
        try:
            return read_json(self.path(iteration) / "meta" / "metadata")
        except (FileNotFoundError, RecordError) as err:
            raise CheckpointError(f"{self.path(iteration)}: its metadata cannot be read: {err}") from None

    def recorded_config(self) -> tuple[int, dict] | None:
        """The config the newest sealed checkpoint that records one was made under, with its iteration."""
        for iteration in reversed(self.sealed_iterations()):
            with contextlib.suppress(CheckpointError):
                if "config" in (meta := self.metadata(iteration)):
                    return iteration, meta["config"]
        return None

    def save(self, iteration: int, state, metadata: dict, *, background: bool = False) -> AnyPath:
        """Save a pytree of arrays and a JSON-able dict; idempotent for a committed iteration.

        background: write on this store's thread when the state is packable (else at once); the
        state's values are copied to the host before this returns. `wait(iteration)` joins it."""
        path = self.path(iteration)
        if self.committed(iteration) or iteration in self._pending:
            return path
        self.root.mkdir(parents=True, exist_ok=True)
        arrays = {"packed": pack(state)} if packable(state) else {"state": state}
        if not (background and "packed" in arrays):
            self._write(iteration, arrays, metadata, self._checkpointer)
            return path
        if self._writer is None:
            self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="spotrl-checkpoint")
            self._background_checkpointer = ocp.Checkpointer(ocp.CompositeCheckpointHandler())

        def write():
            self._write(iteration, arrays, metadata, self._background_checkpointer)

        self._pending[iteration] = (write, self._writer.submit(write))
        return path

    def wait(self, iteration: int) -> None:
        """Return when the background save of `iteration`, if there is one, has committed."""
        if iteration not in self._pending:
            return
        write, future = self._pending[iteration]
        try:
            future.result() if future is not None else write()
        except BaseException:
            self._pending[iteration] = (write, None)  # a retry of the caller writes again, in its own thread
            raise
        del self._pending[iteration]

    def _write(self, iteration: int, arrays: dict, metadata: dict, checkpointer: ocp.Checkpointer) -> None:
        path = self.path(iteration)
        failpoint("checkpoint.save", iteration)
        with self._staged(path) as local:
            checkpointer.save(
                local,
                ocp.args.Composite(
                    **{item: ocp.args.StandardSave(tree) for item, tree in arrays.items()},
                    meta=ocp.args.JsonSave(metadata),
                ),
                force=True,
            )
            if self.staged:
                upload_tree(local, path, last=COMMIT_MARKER)

    @contextlib.contextmanager
    def _staged(self, path: AnyPath):
        """Where orbax reads or writes `path`: itself when local, a temporary local copy when remote
        (the URL itself when several processes share the checkpoint)."""
        if not self.staged:
            yield path if not self.remote else str(path)
            return
        staging = Path(tempfile.mkdtemp(prefix="spotrl-checkpoint-"))
        try:
            yield staging / path.name
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _checksums_at(self, path: AnyPath) -> dict[str, str]:
        return {str(f.relative_to(path)): sha256_file(f) for f in files_under(path)}

    def _checksums(self, iteration: int) -> dict[str, str]:
        return self._checksums_at(self.path(iteration))

    def seal(self, iteration: int) -> dict:
        """Record the checksums of a committed checkpoint (a background save of it committed first);
        returns the seal."""
        self.wait(iteration)
        if not self.committed(iteration):
            raise CheckpointError(f"{self.path(iteration)}: not committed by orbax, cannot seal")
        files = self._checksums(iteration)
        digest = sha256_file_list(files)
        failpoint("checkpoint.seal", iteration)
        seal = {"iteration": iteration, "files": files, "sha256": digest}
        atomic_write_json(self.seal_path(iteration), seal)
        return seal

    def verify(self, iteration: int, copy: AnyPath | None = None) -> None:
        """Check the files (or a downloaded `copy` of them) against the seal."""
        expected = self._seal(iteration)["files"]
        if not isinstance(expected, dict):
            raise CheckpointError(f"damaged seal: {self.seal_path(iteration)}: its files are not a mapping")
        actual = self._checksums_at(copy if copy is not None else self.path(iteration))
        bad = sorted(k for k in expected.keys() | actual.keys() if expected.get(k) != actual.get(k))
        if bad:
            raise CheckpointError(f"{self.path(iteration)}: checksum mismatch in {bad[:5]}")

    def restore(self, iteration: int, template) -> tuple[object, dict]:
        """The state shaped like `template` (a pytree of arrays or ShapeDtypeStructs) and the metadata."""
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
        with self._staged(self.path(iteration)) as local:
            if self.staged:
                download_tree(self.path(iteration), local)
            self.verify(iteration, copy=local if self.staged else None)  # the bytes checked are the bytes orbax reads
            packed = (as_path(local) / "packed").exists()
            item = "packed" if packed else "state"
            wanted = packed_shapes(abstract) if packed else abstract
            if packed:  # orbax would cut or pad an array restored to another shape: refuse instead
                stored = ocp.StandardCheckpointHandler().metadata(epath.Path(str(local)) / "packed").tree
                found = {name: tuple(array.shape) for name, array in stored.items()}
                expected = {name: spec.shape for name, spec in wanted.items()}
                if found != expected:
                    raise CheckpointError(
                        f"{self.path(iteration)}: holds {found} values per dtype, the state it is restored into "
                        f"{expected} (another model or optimizer?)"
                    )
            restored = self._checkpointer.restore(
                local,
                ocp.args.Composite(**{item: ocp.args.StandardRestore(wanted)}, meta=ocp.args.JsonRestore()),
            )
        if packed:
            return unpack(restored.packed, template), dict(restored.meta)
        # orbax returns containers as plain tuples/dicts: put the template's structure back
        state = jax.tree.unflatten(jax.tree.structure(template), jax.tree.leaves(restored.state))
        return state, dict(restored.meta)

    def prune(self) -> None:
        """Keep the newest `keep` sealed checkpoints, and iteration 0: the warm start, which a run that
        is extended or another run started from this one's warm start (`--warm-start-from`) reads."""
        for iteration in self.sealed_iterations()[: -self.keep]:
            if iteration == 0:
                continue
            self.seal_path(iteration).unlink(missing_ok=True)
            if self.path(iteration).exists():
                remove(self.path(iteration))


def packable(state) -> bool:
    """A state small enough to pack, whose arrays all live whole on one device of a single process."""
    leaves = jax.tree.leaves(state)
    if distributed.process_count() > 1 or sum(leaf.nbytes for leaf in leaves) >= PACK_BELOW_BYTES:
        return False
    return all(not isinstance(leaf, jax.Array) or len(leaf.sharding.device_set) == 1 for leaf in leaves)


def pack(state) -> dict[str, np.ndarray]:
    """The state's leaves, in tree order, as one flat host array per dtype."""
    parts: dict[str, list[np.ndarray]] = {}
    for leaf in jax.device_get(jax.tree.leaves(state)):
        parts.setdefault(np.dtype(leaf.dtype).name, []).append(np.ravel(leaf))
    return {dtype: np.concatenate(arrays) for dtype, arrays in parts.items()}


def packed_shapes(template) -> dict[str, jax.ShapeDtypeStruct]:
    """The shapes `pack` gives a state shaped like `template` (arrays or ShapeDtypeStructs)."""
    sizes: dict[str, int] = {}
    for leaf in jax.tree.leaves(template):
        name = np.dtype(leaf.dtype).name
        sizes[name] = sizes.get(name, 0) + int(np.prod(leaf.shape))
    return {name: jax.ShapeDtypeStruct((size,), np.dtype(name)) for name, size in sizes.items()}


def unpack(packed: dict, template):
    """`pack`'s arrays cut back into a state shaped like `template`, on its leaves' devices (`restore` has
    checked that they hold exactly its values per dtype)."""
    flat = {name: np.asarray(array) for name, array in packed.items()}
    offsets = dict.fromkeys(flat, 0)
    leaves = []
    for leaf in jax.tree.leaves(template):
        name, size = np.dtype(leaf.dtype).name, int(np.prod(leaf.shape))
        value = flat[name][offsets[name] : offsets[name] + size].reshape(leaf.shape)
        offsets[name] += size
        sharding = getattr(leaf, "sharding", None)
        leaves.append(jax.device_put(value, sharding) if sharding is not None else jax.numpy.asarray(value))
    return jax.tree.unflatten(jax.tree.structure(template), leaves)


def sha256_file_list(files: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
