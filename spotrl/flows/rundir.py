"""The run directory: its config, its lock, and the per-iteration records behind metrics.jsonl and eval.jsonl.

Records are written one file per iteration (atomic, idempotent) and the .jsonl files are rebuilt
from them, so a killed and resumed run never duplicates or loses a line; spotrl/storage/records.py
reads and writes them (the flows call them through this module).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket

import yaml

from spotrl.config import RunConfig, config_diff
from spotrl.configs import read_resolved_config
from spotrl.storage.atomic import atomic_write_text
from spotrl.storage.lease import LeaseHeld, object_lease
from spotrl.storage.paths import AnyPath, RemotePath, StorageError, as_path, check_reachable
from spotrl.storage.records import damaged_records as damaged_records  # the run directory's records, re-exported
from spotrl.storage.records import read_record as read_record
from spotrl.storage.records import read_records as read_records
from spotrl.storage.records import rebuild_jsonl
from spotrl.storage.records import record_exists as record_exists
from spotrl.storage.records import write_record as write_record


class RunDirError(RuntimeError):
    pass


def prepare(run_dir: str | AnyPath, config: RunConfig) -> AnyPath:
    """Create the run directory with config.yaml, or check that an existing one holds this config.

    A local directory or a URL (gs://bucket/prefix); an unusable store fails here, naming the path.
    """
    try:
        run_dir = as_path(run_dir).resolve()
        check_reachable(run_dir)
    except StorageError as err:
        raise RunDirError(str(err)) from None
    path = run_dir / "config.yaml"
    if path.exists():
        existing = read_config(run_dir)
        diff = config_diff(existing, config)
        if diff:
            raise RunDirError(
                f"{run_dir} holds a run with another config (differing keys: {', '.join(diff)}; in {path}); "
                "use another --run-dir, or the same config to resume"
            )
        return run_dir
    _check_recorded_config(run_dir, config)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # a full disk or a read-only one is the environment's (the CLI tells them apart)
        raise RunDirError(f"{run_dir}: cannot create the run directory: {err.strerror or err}") from err
    atomic_write_text(path, yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    return run_dir


def _check_recorded_config(run_dir: AnyPath, config: RunConfig) -> None:
    """Without config.yaml, the run's checkpoints and weight versions still say which config made
    them: refuse another one before config.yaml is written again (a resume under another config
    would silently train the rest of the run under it)."""
    from spotrl.storage.checkpoints import CheckpointStore  # orbax and JAX: only when config.yaml is missing
    from spotrl.storage.weights import WeightStore, WeightStoreError

    checkpoints = run_dir / "checkpoints"
    recorded = CheckpointStore(checkpoints).recorded_config() if checkpoints.exists() else None
    if recorded is not None:
        iteration, made_under = recorded
        try:
            diff = config_diff(RunConfig.model_validate(made_under), config)
        except ValueError:
            diff = ["(the recorded config no longer validates)"]
        if diff:
            raise RunDirError(
                f"{run_dir} holds a run with another config (differing keys: {', '.join(diff)}; recorded in "
                f"checkpoint {iteration}, config.yaml is missing); use another --run-dir, or the same config to resume"
            )
    weights = WeightStore(run_dir / "weights")
    for version in weights.versions():
        try:
            digest = weights.manifest(version).get("config_digest")
        except WeightStoreError:
            continue  # damaged: the resume moves it aside
        if digest not in (None, config.digest()):
            raise RunDirError(
                f"{weights.version_dir(version)} was published under another config (digest {digest}, this one is "
                f"{config.digest()}) and config.yaml is missing; use another --run-dir, or the run's config"
            )


def rebuild_records(run_dir: AnyPath) -> None:
    """metrics.jsonl and eval.jsonl made again from the per-iteration records (a damaged or missing
    .jsonl is a view that is rebuilt, never read by a resume)."""
    for kind in ("metrics", "eval"):
        rebuild_jsonl(run_dir, kind)


def read_config(run_dir: str | AnyPath) -> RunConfig:
    path = as_path(run_dir) / "config.yaml"
    if not path.exists():
        raise RunDirError(f"{run_dir} is not a run directory: {path} does not exist")
    return read_resolved_config(path)


@contextlib.contextmanager
def exclusive(run_dir: str | AnyPath):
    """Hold RUN/.lock while training: two processes writing one run directory would corrupt it.

    Locally an flock, so the kernel releases it when its holder dies, SIGKILL included: a killed run
    never leaves a stale lock behind. On an object store a lease object (storage/lease.py).
    """
    run_dir = as_path(run_dir)
    key = str(run_dir.resolve() if not isinstance(run_dir, RemotePath) else run_dir)
    if key in _HELD:  # this process holds it already (the CLI takes it before seeding, the flow again)
        yield
        return
    _HELD.add(key)
    try:
        with _locked(run_dir):
            yield
    finally:
        _HELD.discard(key)


_HELD: set[str] = set()  # run directories this process holds the lock of


@contextlib.contextmanager
def _locked(run_dir: AnyPath):
    if isinstance(run_dir, RemotePath):
        try:
            check_reachable(run_dir)  # a missing bucket is named, before a lease is tried on it
        except StorageError as err:
            raise RunDirError(str(err)) from None
        try:
            with object_lease(run_dir / ".lock"):
                yield
        except LeaseHeld as held:
            raise RunDirError(f"{run_dir} is being trained by {held}; wait for it to end or stop it first") from None
        return
    path = run_dir / ".lock"
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RunDirError(f"{run_dir}: cannot create the run directory: {err.strerror or err}") from err
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise RunDirError(f"{run_dir} is being trained by {holder}; wait for it to end or stop it first") from None
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
