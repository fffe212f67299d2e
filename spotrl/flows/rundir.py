"""The run directory: its config, and the per-iteration records behind metrics.jsonl and eval.jsonl.

Records are written one file per iteration (atomic, idempotent) and the .jsonl files are rebuilt
from them, so a killed and resumed run never duplicates or loses a line.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket

import yaml

from spotrl.config import ConfigError, RunConfig, config_diff
from spotrl.storage.atomic import atomic_write_json, atomic_write_text
from spotrl.storage.lease import LeaseHeld, object_lease
from spotrl.storage.paths import AnyPath, RemotePath, StorageError, as_path, check_reachable


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
                f"{run_dir} holds a run with another config (differing keys: {', '.join(diff)}); "
                "use another --run-dir, or the same config to resume"
            )
        return run_dir
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # a full disk or a read-only one is the environment's (the CLI tells them apart)
        raise RunDirError(f"{run_dir}: cannot create the run directory: {err.strerror or err}") from err
    atomic_write_text(path, yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    return run_dir


def read_config(run_dir: str | AnyPath) -> RunConfig:
    path = as_path(run_dir) / "config.yaml"
    if not path.exists():
        raise RunDirError(f"{run_dir} is not a run directory: {path} does not exist")
    try:
        return RunConfig.model_validate(yaml.safe_load(path.read_text()))
    except Exception as err:
        raise ConfigError(f"{path}: {err}") from None


def write_record(run_dir: AnyPath, kind: str, iteration: int, record: dict) -> None:
    """Write RUN/<kind>/iter_N.json and rebuild RUN/<kind>.jsonl from all records, in order."""
    run_dir = as_path(run_dir)
    folder = run_dir / kind
    atomic_write_json(folder / f"iter_{iteration:06d}.json", record)
    lines = [json.dumps(json.loads(p.read_text()), sort_keys=True) for p in sorted(folder.glob("iter_*.json"))]
    atomic_write_text(run_dir / f"{kind}.jsonl", "".join(line + "\n" for line in lines))


def record_exists(run_dir: str | AnyPath, kind: str, iteration: int) -> bool:
    return (as_path(run_dir) / kind / f"iter_{iteration:06d}.json").exists()


def read_record(run_dir: str | AnyPath, kind: str, iteration: int) -> dict:
    return json.loads((as_path(run_dir) / kind / f"iter_{iteration:06d}.json").read_text())


def read_records(run_dir: str | AnyPath, kind: str) -> list[dict]:
    path = as_path(run_dir) / f"{kind}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@contextlib.contextmanager
def exclusive(run_dir: str | AnyPath):
    """Hold RUN/.lock while training: two processes writing one run directory would corrupt it.

    Locally an flock, so the kernel releases it when its holder dies, SIGKILL included: a killed run
    never leaves a stale lock behind. On an object store a lease object (storage/lease.py).
    """
    run_dir = as_path(run_dir)
    if isinstance(run_dir, RemotePath):
        try:
            with object_lease(run_dir / ".lock"):
                yield
        except LeaseHeld as held:
            raise RunDirError(f"{run_dir} is being trained by {held}; wait for it to end or stop it first") from None
        return
    path = run_dir / ".lock"
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
