"""Where a run resumes: the newest iteration whose every output is complete and verifies.

A kill can land anywhere. On restart the flow does not replay the whole history through Prefect's
cache (that would need every old weight version and break on any code change); it finds the newest
iteration N whose sealed checkpoint verifies, whose weight version verifies and whose metrics and
evaluation records exist, rebuilds the references the tasks of N passed on, and continues at N + 1.
The tasks of N + 1 that finished before the kill are Prefect cache hits; the one that was running
runs again.

Anything damaged (a checksum mismatch, a truncated file) is moved to RUN/quarantine/ and reported;
temporaries of writes that never committed are removed. If something newer than N was damaged,
the cached results of the later tasks may point at it, so those tasks run again (`refresh`):
everything is deterministic, so they produce the same bytes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
from pathlib import Path

from spotrl.config import RunConfig, config_diff
from spotrl.curation.store import damaged_splits, data_sha256
from spotrl.flows import rundir
from spotrl.rl.iteration_update import made_under
from spotrl.rng import next_iteration_streams
from spotrl.storage.checkpoints import CheckpointError, CheckpointStore
from spotrl.storage.damaged import DAMAGED_DIR, move_aside
from spotrl.storage.paths import AnyPath, as_path, remove
from spotrl.storage.rollouts import damaged_shards
from spotrl.storage.weights import WeightStore, WeightStoreError


@dataclasses.dataclass
class ResumePoint:
    iteration: int | None = None  # the last complete iteration (0: the warm start); None: start afresh
    checkpoint: dict | None = None  # the sealed checkpoint reference of that iteration
    weights: dict | None = None  # its published weight version, None when it must be republished
    refresh: bool = False  # later tasks must not trust their cached results
    recurate: bool = False  # the curated data was damaged: it is regenerated, and must hash to data_sha256
    data_sha256: str | None = None  # the curated data the resume checkpoint was trained on
    notes: list[str] = dataclasses.field(default_factory=list)  # what was moved aside or removed, and why


def eval_due(config: RunConfig, iteration: int) -> bool:
    every = config.eval.every
    return iteration in (0, config.iterations) or bool(every and iteration % every == 0)


def _records_complete(run_dir: AnyPath, config: RunConfig, iteration: int) -> bool:
    if iteration > 0 and not rundir.record_exists(run_dir, "metrics", iteration):
        return False
    return not eval_due(config, iteration) or rundir.record_exists(run_dir, "eval", iteration)


def _remove_leftovers(run_dir: AnyPath, checkpoints: CheckpointStore, weights: WeightStore, notes: list[str]) -> None:
    """Temporaries of writes killed before their commit: incomplete by construction, never read."""
    temporaries = [p for p in run_dir.rglob(".*.tmp-*") if DAMAGED_DIR not in p.relative_to(run_dir).parts]
    for path in checkpoints.leftovers() + weights.leftovers() + temporaries:
        if not path.exists():
            continue  # it was inside a leftover directory removed just before
        remove(path)
        notes.append(f"removed {path.relative_to(run_dir)} (a write that stopped before it committed)")


def find_resume_point(
    run_dir: AnyPath, config: RunConfig, checkpoints: CheckpointStore, weights: WeightStore
) -> ResumePoint:
    point = ResumePoint()
    notes = point.notes
    _remove_leftovers(run_dir, checkpoints, weights, notes)

    def set_aside(path: AnyPath, reason: str) -> None:
        move_aside(run_dir, path, reason)
        notes.append(f"quarantined {path.relative_to(run_dir)}: {reason}")

    data_dir = run_dir / "data"
    if data_dir.exists() and (why := damaged_splits(data_dir)):
        set_aside(data_dir, why)
        point.recurate = True
    for kind in ("metrics", "eval", "lengths"):
        for path, reason in rundir.damaged_records(run_dir, kind).items():
            # a metrics or eval record: its iteration is then incomplete and runs again; a lengths
            # record is folded again from the scored shards (rollout/shards.py)
            set_aside(path, reason)

    damaged_after = None  # the oldest iteration newer than the resume point with a damaged artifact
    for iteration in reversed(checkpoints.sealed_iterations()):
        try:
            checkpoints.verify(iteration)
        except CheckpointError as err:
            set_aside(checkpoints.path(iteration), str(err))
            set_aside(checkpoints.seal_path(iteration), "seal of a quarantined checkpoint")
            damaged_after = iteration
            continue
        meta = checkpoints.metadata(iteration)
        check_made_under(config, meta, checkpoints.path(iteration))
        if _records_complete(run_dir, config, iteration):
            point.iteration = iteration
            point.checkpoint = checkpoints.ref(iteration)
            point.data_sha256 = meta.get("data_sha256")
            break

    if not point.recurate:
        found = data_sha256(data_dir)
        if found is None:  # a curate result cached before the data went must not be trusted
            point.recurate = True
            if point.iteration is not None:
                notes.append("RUN/data is missing: it is curated again")
        elif point.data_sha256 and found != point.data_sha256:
            set_aside(data_dir, f"its rows (sha256 {found[:12]}) are not the ones this run trained on")
            point.recurate = True

    after = -1 if point.iteration is None else point.iteration
    for path, reason in damaged_shards(run_dir / "rollouts", after).items():
        set_aside(path, reason)
        damaged_after = _oldest(damaged_after, path_iteration(path))
    for version in weights.versions():
        if version < after:
            continue  # older versions are never read again by this run
        try:
            weights.verified_digest(version)
        except WeightStoreError as err:
            set_aside(as_path(weights.version_dir(version)), str(err))
            if version > after:
                damaged_after = _oldest(damaged_after, version)
            continue
        check_made_under(config, weights.manifest(version), weights.version_dir(version))
    for incomplete in weights.incomplete():
        weights.remove(incomplete)
        notes.append(f"removed {incomplete} (a weight version killed before its manifest)")
    # LATEST names the newest complete version (a manifest is written last); anything else is repaired
    pointer, newest = weights.pointer(), max(weights.versions(), default=None)
    if pointer != newest:
        if weights.pointer_damaged():
            why = "was not a version number"
        elif pointer is None:
            why = "was missing"
        else:
            gone = pointer not in weights.versions()
            why = f"pointed at {pointer}, " + ("a version that is gone" if gone else "not the newest")
        weights.repoint(newest)
        notes.append(f"LATEST {why}; now {newest}")

    point.refresh = damaged_after is not None
    if point.iteration is not None:
        if point.iteration in weights.versions():
            point.weights = weights.ref(point.iteration)
        _check_streams(checkpoints, config, point.iteration)
    return point


def check_made_under(config: RunConfig, recorded: dict, where) -> None:
    """Refuse a checkpoint or weight version that records another config than `config` (naming the
    differing keys when it records the config itself); one made before configs were recorded passes."""
    digest = recorded.get("config_digest")
    if digest is None or digest == config.digest():
        return
    differing = ""
    if isinstance(recorded.get("config"), dict):
        with contextlib.suppress(ValueError):
            keys = config_diff(RunConfig.model_validate(recorded["config"]), config)
            differing = f" (differing keys: {', '.join(keys)})"
    raise rundir.RunDirError(
        f"{where} was made under another config (digest {digest}, this one is {config.digest()}){differing}; "
        "use another --run-dir, or the config the run was started with"
    )


def check_data(config: RunConfig, run_dir: AnyPath, data: dict, point: ResumePoint) -> None:
    """After RUN/data was regenerated: the rows must be the ones the checkpoints were trained on."""
    if point.data_sha256 and data["sha256"] != point.data_sha256:
        raise rundir.RunDirError(
            f"{run_dir / 'data'}: regenerated from the config's sources it holds other rows (sha256 "
            f"{data['sha256'][:12]}) than the run was trained on ({point.data_sha256[:12]}): a source changed since "
            "the run started; restore it, or start a new run directory"
        )


def _oldest(current: int | None, iteration: int) -> int:
    return iteration if current is None else min(current, iteration)


def path_iteration(path: Path) -> int:
    return int(path.parent.name.removeprefix("iter_"))


def _check_streams(checkpoints: CheckpointStore, config: RunConfig, iteration: int) -> None:
    recorded = checkpoints.metadata(iteration).get("rng")
    if recorded is None:
        return  # the warm-start checkpoint: nothing random has been drawn by RL yet
    expected = next_iteration_streams(config.seed, iteration)
    if recorded != expected:
        raise rundir.RunDirError(
            f"{checkpoints.path(iteration)}: the random streams recorded for iteration {iteration + 1} differ from "
            "the ones this code derives; the code changed how keys are derived, so resuming would not reproduce "
            "the run. Resume with the version of spotrl that started it, or start a new run directory."
        )


# Sections a warm start depends on: a run may start from another run's warm start only if these match.
WARM_START_SECTIONS = ("seed", "model", "problem", "warmstart")


def seed_from_warm_start(run_dir: Path, config: RunConfig, source_dir: Path) -> None:
    """Start `run_dir` (a new run of `config`) from the warm start of the run in `source_dir`.

    Comparing algorithms from the same starting policy is the common case: the new directory gets
    the source's curated data, its iteration-0 evaluation, and checkpoint 0 with the same policy
    parameters (the optimizer and critic are this config's, fresh), so the flow resumes after
    iteration 0. Refused unless the sections that decide the warm start are equal.
    """
    from spotrl.tasks.context import RunContext

    run_dir, source_dir = Path(run_dir), Path(source_dir)
    source_config = rundir.read_config(source_dir)
    differing = [k for k in WARM_START_SECTIONS if getattr(source_config, k) != getattr(config, k)]
    data = lambda c: c.curation.model_copy(update={"difficulty": None})  # noqa: E731 - the sources decide the data
    if data(source_config) != data(config):
        differing.append("curation")
    if differing:
        raise rundir.RunDirError(f"{source_dir}: its warm start was made with other {', '.join(differing)} settings")
    if (run_dir / "checkpoints").exists():
        raise rundir.RunDirError(f"{run_dir} already holds a run; a warm start can only seed a new run directory")
    source = RunContext(source_dir, source_config)
    if 0 not in source.checkpoints.sealed_iterations():
        raise rundir.RunDirError(
            f"{source.checkpoints.path(0)}: the warm start of {source_dir} is gone (a run made before spotrl "
            "0.3 pruned it); start from a run that keeps it"
        )
    state, meta = source.checkpoints.restore(0, source.state_template())
    rundir.prepare(run_dir, config)
    shutil.copytree(source_dir / "data", run_dir / "data")
    rundir.write_record(run_dir, "eval", 0, rundir.read_record(source_dir, "eval", 0))
    ctx = RunContext(run_dir, config)
    meta = {
        **meta,
        **made_under(config),
        "rng": next_iteration_streams(config.seed, 0),
        "warm_start_from": str(source_dir),
    }
    ctx.checkpoints.save(0, ctx.initial_train_state(state["params"]), meta)
    ctx.checkpoints.seal(0)
    extra = {"warm_start_from": str(source_dir), "config_digest": config.digest()}
    ctx.weights.publish(0, ctx.policy.to_pure(state["params"]), extra)
