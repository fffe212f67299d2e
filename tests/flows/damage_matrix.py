"""The damage matrix: every file of the run-directory contract (docs/running.md), and what a resume
decides when it is missing, truncated, garbage, or from elsewhere. Shared by the test
(tests/flows/test_resume.py) and docs/durability.md, which states its outcome.

"elsewhere" is a well-formed file of the same kind that belongs to something else: the same file of
another iteration or version, or, for what carries the run's identity (config.yaml, a whole
checkpoint, a whole weight version, the curated data), one made under another config (seed 1).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import safetensors.numpy

from spotrl.config import ConfigError, RunConfig
from spotrl.curation.rundata import prepare as curate_into
from spotrl.flows import rundir
from spotrl.flows.resume import find_resume_point
from spotrl.storage.checkpoints import CheckpointStore
from spotrl.storage.damaged import damaged_log
from spotrl.storage.records import read_json
from spotrl.storage.weights import WeightStore

LAST = 4  # the finished run's last iteration
DAMAGES = ("missing", "truncated", "garbage", "elsewhere")


@dataclasses.dataclass(frozen=True)
class Resumes:
    """The resume continues after `after`, having moved `aside` to RUN/quarantine/ (and curating again)."""

    after: int
    aside: tuple[str, ...] = ()
    recurate: bool = False


@dataclasses.dataclass(frozen=True)
class Refused:
    """Exit 2 with one line naming the file (`names`)."""

    names: str


CKPT, SEAL, VERSION = f"checkpoints/iter_{LAST:06d}", f"checkpoints/iter_{LAST:06d}.sealed.json", f"weights/v{LAST:06d}"
REDO_LAST = Resumes(LAST - 1, (CKPT, SEAL))  # the last iteration runs again
REPUBLISH = Resumes(LAST, (VERSION,))  # its weights are published again from the checkpoint
CURATE = Resumes(LAST, ("data",), recurate=True)  # made again from the sources and seed, hash checked
KEPT = Resumes(LAST)  # not read by a resume, or made again by it

MATRIX: dict[str, dict[str, Resumes | Refused]] = {
    "config.yaml": {
        "missing": KEPT,  # written again once the checkpoints' recorded config matches
        "truncated": Refused("config.yaml"),
        "garbage": Refused("config.yaml"),
        "elsewhere": Refused("differing keys: seed"),
    },
    f"metrics/iter_{LAST:06d}.json": {
        "missing": Resumes(LAST - 1),
        "truncated": Resumes(LAST - 1, (f"metrics/iter_{LAST:06d}.json",)),
        "garbage": Resumes(LAST - 1, (f"metrics/iter_{LAST:06d}.json",)),
        "elsewhere": KEPT,  # a record is the run's output, not state: another iteration's is not detected
    },
    f"eval/iter_{LAST:06d}.json": {
        "missing": Resumes(LAST - 1),
        "truncated": Resumes(LAST - 1, (f"eval/iter_{LAST:06d}.json",)),
        "garbage": Resumes(LAST - 1, (f"eval/iter_{LAST:06d}.json",)),
        "elsewhere": KEPT,
    },
    "metrics.jsonl": dict.fromkeys(DAMAGES, KEPT),  # rebuilt from metrics/ at every resume
    "eval.jsonl": dict.fromkeys(DAMAGES, KEPT),
    "data/train.parquet": {"missing": CURATE, "truncated": CURATE, "garbage": CURATE, "elsewhere": CURATE},
    "data/manifest.json": {"missing": CURATE, "truncated": CURATE, "garbage": CURATE, "elsewhere": CURATE},
    "data": {"missing": Resumes(LAST, recurate=True), "elsewhere": CURATE},  # another config's curated data
    CKPT: {
        "missing": Resumes(LAST - 1),  # its seal alone is no checkpoint: redone, and sealed again
        "truncated": REDO_LAST,  # its largest file
        "garbage": REDO_LAST,
        "elsewhere": Refused("differing keys: seed"),
    },
    SEAL: {"missing": Resumes(LAST - 1), "truncated": REDO_LAST, "garbage": REDO_LAST, "elsewhere": REDO_LAST},
    f"{VERSION}/model.safetensors": dict.fromkeys(DAMAGES, REPUBLISH),
    f"{VERSION}/manifest.json": {
        "missing": Resumes(LAST),  # a version without its manifest is incomplete: removed, published again
        "truncated": REPUBLISH,
        "garbage": REPUBLISH,
        "elsewhere": REPUBLISH,
    },
    VERSION: {"elsewhere": Refused("under another config")},
    "weights/LATEST": dict.fromkeys(DAMAGES, KEPT),  # set to the newest complete version
    f"lengths/iter_{LAST - 1:06d}.json": {
        "missing": KEPT,  # folded again from the scored shards
        "truncated": Resumes(LAST, (f"lengths/iter_{LAST - 1:06d}.json",)),
        "garbage": Resumes(LAST, (f"lengths/iter_{LAST - 1:06d}.json",)),
        "elsewhere": KEPT,
    },
    # an iteration's rollout shards are read only until it is complete; the interrupted iteration's
    # are checked against their content hash (test_altered_rollout_shard_of_the_interrupted_iteration...)
    f"rollouts/iter_{LAST:06d}": dict.fromkeys(DAMAGES, KEPT),
    "prefect-results": dict.fromkeys(("missing",), KEPT),  # cache misses: the tasks run again
    "tensorboard": dict.fromkeys(("missing",), KEPT),  # made again from the records
    "report": dict.fromkeys(("missing",), KEPT),  # made again at the end
}


def damage(run_dir: Path, name: str, how: str, other: Path) -> None:
    """Damage RUN/`name` as `how` says; `other` is a run directory of the same run under seed 1 (only
    config.yaml, data/, and the identity fields of checkpoints and weight versions are read from it)."""
    path = run_dir / name
    if path.is_dir() and how in ("truncated", "garbage"):
        path = max((p for p in path.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    if how == "missing":
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    elif how == "truncated":
        path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    elif how == "garbage":
        path.write_bytes(b"\x00\xffnot what was written\xfe")
    elif name in ("config.yaml", "data"):
        _replace(path, other / name)
    elif name == CKPT:  # a sealed checkpoint made under another config
        store = CheckpointStore(run_dir / "checkpoints")
        meta_file = store.path(LAST) / "meta" / "metadata"
        meta = read_json(meta_file)
        config = rundir.read_config(other)
        meta.update(config_digest=config.digest(), config=config.model_dump(mode="json"))
        meta_file.write_text(json.dumps(meta))
        store.seal(LAST)
    elif name == VERSION:  # a whole version published under another config
        manifest = path / "manifest.json"
        record = read_json(manifest)
        record["config_digest"] = rundir.read_config(other).digest()
        manifest.write_text(json.dumps(record))
    elif name.startswith("data/"):
        _replace(path, other / name)
    elif name.endswith(".safetensors"):  # well-formed, of other values
        safetensors.numpy.save_file({"embed": np.zeros((2, 2), np.float32)}, str(path))
    elif name.startswith("eval/"):  # the evaluation before it (iteration 0)
        _replace(path, run_dir / "eval" / "iter_000000.json")
    elif name == "weights/LATEST":  # a pointer at an older version
        path.write_text(f"{LAST - 1}\n")
    elif name.endswith(".jsonl"):  # the other view's lines
        _replace(path, run_dir / ("eval.jsonl" if name == "metrics.jsonl" else "metrics.jsonl"))
    else:  # the same file of the previous iteration or version
        _replace(path, run_dir / _previous(name))


def _previous(name: str) -> str:
    for tag, width in (("iter_", 6), ("v", 6)):
        head, sep, rest = name.partition(f"/{tag}" if tag == "v" else tag)
        if sep and rest[:width].isdigit():
            return f"{head}{sep}{int(rest[:width]) - 1:0{width}d}{rest[width:]}"
    raise ValueError(f"no iteration in {name}")


def _replace(path: Path, source: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    (shutil.copytree if source.is_dir() else shutil.copyfile)(source, path)


def decide(run_dir: Path, config: RunConfig) -> Resumes | Refused:
    """What a resume of `run_dir` under `config` decides (as the flow's first steps do)."""
    try:
        run_path = rundir.prepare(run_dir, config)
        stores = CheckpointStore(run_path / "checkpoints"), WeightStore(run_path / "weights")
        point = find_resume_point(run_path, config, *stores)
    except (rundir.RunDirError, ConfigError) as err:
        return Refused(str(err))
    rundir.rebuild_records(run_path)
    aside = tuple(sorted(entry["path"] for entry in damaged_log(run_path)))
    return Resumes(point.iteration, aside, point.recurate)


def other_run(config: RunConfig, where: Path) -> Path:
    """What another run (seed 1) contributes: its config.yaml and its curated data."""
    other = config.model_copy(update={"seed": 1})
    rundir.prepare(where, other)
    curate_into(other, where)
    return where
