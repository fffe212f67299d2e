"""The `train` flow: curate, warm start, then RL iterations as task groups inside one flow run.

    curate -> warm-start -> [rollout-plan -> rollout (x shards) -> reward -> update -> publish -> checkpoint] x N

An iteration takes about a second here, and a sub-flow run costs about 1.1 s of fixed overhead, so
iterations are groups of tasks in this flow, not sub-flows. Re-running the flow on the same run
directory resumes after the last complete iteration (resume.py); the tasks of the interrupted
iteration that had finished are cache hits (results persist under RUN/prefect-results).
"""

from __future__ import annotations

import contextlib
import time

from prefect import flow

from spotrl import distributed
from spotrl.config import RunConfig
from spotrl.configs import resolve, with_preset
from spotrl.flows import artifacts, rundir
from spotrl.flows.crashes import FLOW_NAME, FLOW_RUN_NAME, close_abandoned
from spotrl.flows.fleet import RolloutFleet
from spotrl.flows.iteration import LookAhead, Stages, iteration_line, run_iteration
from spotrl.flows.preemption import PreemptionGuard
from spotrl.flows.resume import check_data, eval_due, find_resume_point
from spotrl.reporting.plots import make_report
from spotrl.reporting.tensorboard import sync_tensorboard
from spotrl.storage.paths import AnyPath
from spotrl.tasks import spmd
from spotrl.tasks.context import get_context
from spotrl.tasks.runlog import say


class AttemptsExhausted(RuntimeError):
    pass


@flow(name=FLOW_NAME, flow_run_name=FLOW_RUN_NAME, log_prints=False, validate_parameters=True)
def train(
    config: RunConfig = RunConfig(),
    run_dir: str = "runs/tiny",
    preset: str | None = None,
    attempt: int = 1,
    max_attempts: int = 5,
    preemption_grace_seconds: float = 25.0,
) -> dict:
    """Train the policy with RL; returns the evaluation before and after, and where the run lives.

    Re-running on the same run directory resumes after the last complete iteration (see resume.py).
    On SIGTERM the running stage finishes, then the run stops with `Preempted` (see preemption.py).
    `attempt` counts submissions of this run (the crashed-run automation in deployments/ passes the
    crashed run's attempt + 1); a run past `max_attempts` is refused so a run that crashes every time
    is not resubmitted forever. None of these three is a task input, so no cache key depends on them.
    `preset` (a shipped preset's name or a YAML path) is the base that the keys given in `config`
    override, as `spotrl train --config PRESET --set KEY=VALUE` does.
    """
    if attempt > max_attempts:
        raise AttemptsExhausted(
            f"attempt {attempt} > max_attempts {max_attempts} for run directory {run_dir}; "
            "not resubmitting: look at why the previous attempts crashed"
        )
    started = time.perf_counter()
    distributed.initialize()  # a multi-host trainer: before any JAX computation (process 0 runs this flow)
    # a deployment's config did not go through the loader: the preset under it, completed from model.path
    config = resolve(with_preset(preset, config))
    run_path = rundir.prepare(run_dir, config)
    with (
        rundir.exclusive(run_path),
        PreemptionGuard(preemption_grace_seconds) as guard,
        rollout_task_runner(config) as runner,
        RolloutFleet(config, run_path, runner) as fleet,
        spmd.leading(),
    ):
        result = _run(config, run_path, guard, fleet, as_given=run_dir)
    result = {**result, "seconds": time.perf_counter() - started}
    result["report"] = _report(str(run_path))
    artifacts.publish_summary(result, config)
    return result


def _continue_after_crashes(run_dir: str) -> None:
    """Close what crashed processes left open on this run directory, and say which run this one continues."""
    from prefect.runtime import flow_run

    try:
        predecessor, closed = close_abandoned(run_dir, flow_run.id)
    except Exception as err:  # noqa: BLE001 - bookkeeping in the UI: never a reason to stop training
        say(f"warning: could not close the runs a crash left open on {run_dir}: {type(err).__name__}: {err}")
        return
    if predecessor is None:
        return
    say(
        f"continuing flow run {predecessor.name!r} ({predecessor.id}), which ended {predecessor.state}"
        + (f": {predecessor.message}" if predecessor.message else "")
        + (f"; marked {closed} runs it left open as Crashed" if closed else "")
    )
    artifacts.link_flow_run("continues", predecessor.id, f"continues {predecessor.name} ({predecessor.state})")


def _tensorboard(root: str) -> None:
    """RUN/tensorboard gets the iterations and evaluations recorded so far (each point once)."""
    try:
        sync_tensorboard(root)
    except Exception as err:  # noqa: BLE001 - curves are a view of metrics.jsonl, never a reason to stop
        say(f"warning: TensorBoard scalars not written ({type(err).__name__}: {err}); `spotrl report` can redo them")


def _report(root: str) -> str | None:
    """RUN/report/index.html with the run's curves; its path (None if it could not be made)."""
    try:
        return str(make_report(root))
    except Exception as err:  # noqa: BLE001 - the same: `spotrl report --run-dir` makes it again
        say(f"warning: report not written ({type(err).__name__}: {err}); run `spotrl report --run-dir {root}`")
        return None


@contextlib.contextmanager
def rollout_task_runner(config: RunConfig):
    """The task runner rollout shards are mapped over: None (the flow's thread pool) or Ray.

    A Ray worker that dies mid-shard fails only its Ray task, which Ray runs again on another worker
    (max_retries, 3 by default) under the same Prefect task run: the flow never sees it."""
    if config.rollout.task_runner == "threads":
        yield None
        return
    from prefect_ray import RayTaskRunner

    # a local Ray: our workers only need the CPU (JAX), no dashboard
    init_kwargs = {} if config.rollout.ray_address else {"include_dashboard": False}
    with RayTaskRunner(address=config.rollout.ray_address, init_kwargs=init_kwargs) as runner:
        yield runner


def _run(config: RunConfig, run_path: AnyPath, guard: PreemptionGuard, fleet: RolloutFleet, as_given: str) -> dict:
    """The run's body; `as_given` is the run directory as the flow's parameter spelled it (earlier flow
    runs on it are found by that spelling); `fleet` says how many rollout workers each iteration uses."""
    root = str(run_path)
    say(f"run directory: {root}  (config {config.digest()})")
    ctx = get_context(root, config)
    say(ctx.memory_summary())
    artifacts.publish_config(config)
    _continue_after_crashes(as_given)
    point = find_resume_point(run_path, config, ctx.checkpoints, ctx.weights)
    for note in point.notes:
        say(f"recovery: {note}")
    rundir.rebuild_records(run_path)  # metrics.jsonl and eval.jsonl are views of the per-iteration records
    stages = Stages(config, run_path, refresh=point.refresh)

    if point.iteration is None:
        data = (stages.refreshed() if point.recurate else stages).curate()
        initial = stages.warm_start(data)
        say(f"warm start: {initial['steps']} supervised steps, greedy accuracy {initial['greedy_accuracy']:.1%}")
        previous = stages.checkpoint(initial)
        weights = stages.publish(previous)
        _evaluate(stages, weights, 0)
        start = 1
    else:
        if point.recurate:  # the curated data was damaged or lost: the same sources and seed make it again
            data = stages.refreshed().curate()
            check_data(config, run_path, data, point)
            say(f"recovery: curated data made again, the rows the run trained on (sha256 {data['sha256'][:12]})")
        say(f"resuming after iteration {point.iteration} (sealed checkpoint {point.checkpoint['sha256'][:12]})")
        previous = point.checkpoint
        weights = point.weights or stages.refreshed().publish(previous)
        start = point.iteration + 1
    guard.check("after the warm start")
    progress = artifacts.Progress(start - 1, config.iterations)

    ahead = LookAhead(stages, fleet, start, weights, ctx.weights)
    for iteration in range(start, config.iterations + 1):
        done = run_iteration(stages, ahead, iteration, previous, check=guard.check)
        previous, weights = done.sealed, done.weights
        fleet.record(iteration, done.metrics)
        rundir.write_record(run_path, "metrics", iteration, done.metrics)
        _tensorboard(root)
        say(iteration_line(done.metrics, config.iterations))
        if eval_due(config, iteration):
            _evaluate(stages, weights, iteration)
        progress.update(iteration)
        guard.check(f"after iteration {iteration}")

    return {
        "run_dir": root,
        "before": rundir.read_record(run_path, "eval", 0),
        "after": rundir.read_record(run_path, "eval", config.iterations),
        "weights_sha256": weights["sha256"],
    }


def _evaluate(stages: Stages, weights: dict, iteration: int) -> dict:
    result = stages.evaluate(weights, iteration)
    rundir.write_record(stages.run_path, "eval", iteration, result)
    artifacts.publish_evaluations(rundir.read_records(stages.run_path, "eval"))
    _tensorboard(stages.root)
    say(
        f"eval after iteration {iteration} (weights v{weights['version']}): "
        f"pass@1 {result['pass_at_1']:.1%}  pass@{result['k']} {result['pass_at_k']:.1%}"
    )
    return result
