"""The run directory: its config, and the per-iteration records behind metrics.jsonl and eval.jsonl.

Records are written one file per iteration (atomic, idempotent) and the .jsonl files are rebuilt
from them, so a killed and resumed run never duplicates or loses a line.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from spotrl.flows.config import ConfigError, RunConfig, config_diff
from spotrl.storage.atomic import atomic_write_json, atomic_write_text


class RunDirError(RuntimeError):
    pass


def prepare(run_dir: str | Path, config: RunConfig) -> Path:
    """Create the run directory with config.yaml, or check that an existing one holds this config."""
    run_dir = Path(run_dir).resolve()
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
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    return run_dir


def read_config(run_dir: str | Path) -> RunConfig:
    path = Path(run_dir) / "config.yaml"
    if not path.exists():
        raise RunDirError(f"{run_dir} is not a run directory: {path} does not exist")
    try:
        return RunConfig.model_validate(yaml.safe_load(path.read_text()))
    except Exception as err:
        raise ConfigError(f"{path}: {err}") from None


def write_record(run_dir: Path, kind: str, iteration: int, record: dict) -> None:
    """Write RUN/<kind>/iter_N.json and rebuild RUN/<kind>.jsonl from all records, in order."""
    folder = run_dir / kind
    atomic_write_json(folder / f"iter_{iteration:06d}.json", record)
    lines = [json.dumps(json.loads(p.read_text()), sort_keys=True) for p in sorted(folder.glob("iter_*.json"))]
    atomic_write_text(run_dir / f"{kind}.jsonl", "".join(line + "\n" for line in lines))


def read_records(run_dir: str | Path, kind: str) -> list[dict]:
    path = Path(run_dir) / f"{kind}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
