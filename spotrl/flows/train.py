"""The `train` flow: curate, warm start, then RL iterations as task groups inside one flow run.

    curate -> warm-start -> [rollout-plan -> rollout (x shards) -> reward -> update -> checkpoint -> publish] x N

An iteration takes about a second here, and a sub-flow run costs about 1.1 s of fixed overhead, so
iterations are groups of tasks in this flow, not sub-flows. Re-running the flow on the same run
directory resumes after the last complete iteration (resume.py); the tasks of the interrupted
iteration that had finished are cache hits (results persist under RUN/prefect-results).
"""

from __future__ import annotations

import contextlib
import time

from prefect import flow, unmapped
from prefect.utilities.annotations import quote

from spotrl import distributed
from spotrl.config import RunConfig
from spotrl.configs import resolve, with_preset
from spotrl.curation.curriculum import estimate_iteration
from spotrl.flows import artifacts, rundir
from spotrl.flows.crashes import FLOW_NAME, FLOW_RUN_NAME, close_abandoned
from spotrl.flows.fleet import RolloutFleet
from spotrl.flows.preemption import PreemptionGuard
from spotrl.flows.results import result_storage
from spotrl.flows.resume import eval_due, find_resume_point
from spotrl.model.compiles import compile_count
from spotrl.reporting.plots import make_report
from spotrl.reporting.tensorboard import sync_tensorboard
from spotrl.rollout.shards import idle_fraction
from spotrl.storage.paths import AnyPath, as_path
from spotrl.tasks import spmd, stages
from spotrl.tasks.context import get_context
from spotrl.tasks.runlog import say


def _configured(run_dir: AnyPath, refresh: bool = False):
    """The stage tasks with result storage inside this run directory.

    `refresh=True` runs them even when a cached result exists: used for the iterations after a
    damaged artifact, whose cached results may point at what was quarantined.
    """
    storage = result_storage(run_dir / "prefect-results")
    names = ("curate", "warm_start", "rollout_plan", "rollout", "reward", "update", "checkpoint", "publish")
    names += ("evaluate", "difficulty")
    return {name: getattr(stages, name).with_options(result_storage=storage, refresh_cache=refresh) for name in names}


def _task_input(config: RunConfig) -> quote:
    """The config as a task argument the engine passes through as is.

    Unwrapped, Prefect walks the nested config twice on every task call, looking for futures to
    wait on (~3 ms of the ~10 ms a task run costs the flow; measured in benchmarks/README.md). The
    task still receives the RunConfig and its cache key is computed from it, the same as unwrapped.
    """
    return quote(config)


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
        result = _run(config, run_path, guard, runner, as_given=run_dir, fleet=fleet)
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


def _run(
    config: RunConfig,
    run_path: AnyPath,
    guard: PreemptionGuard,
    runner=None,
    as_given: str = "",
    fleet: RolloutFleet | None = None,
) -> dict:
    """The run's body; `as_given` is the run directory as the flow's parameter spelled it (earlier flow
    runs on it are found by that spelling); `fleet` says how many rollout workers each iteration uses."""
    fleet = fleet or RolloutFleet(config, run_path, runner)
    root = str(run_path)
    say(f"run directory: {root}  (config {config.digest()})")
    ctx = get_context(root, config)
    say(ctx.memory_summary())
    artifacts.publish_config(config)
    _continue_after_crashes(as_given or str(run_path))
    point = find_resume_point(run_path, config, ctx.checkpoints, ctx.weights)
    for note in point.notes:
        say(f"recovery: {note}")
    tasks = _configured(run_path, refresh=point.refresh)
    config_input = _task_input(config)

    if point.iteration is None:
        data = tasks["curate"](config_input, root)
        initial = tasks["warm_start"](config_input, root, data)
        say(f"warm start: {initial['steps']} supervised steps, greedy accuracy {initial['greedy_accuracy']:.1%}")
        previous = tasks["checkpoint"](config_input, root, initial)
        weights = tasks["publish"](config_input, root, previous)
        _evaluate(tasks, config, root, weights, 0)
        start = 1
    else:
        say(f"resuming after iteration {point.iteration} (sealed checkpoint {point.checkpoint['sha256'][:12]})")
        previous = point.checkpoint
        weights = point.weights or _configured(run_path, refresh=True)["publish"](config_input, root, previous)
        start = point.iteration + 1
    guard.check("after the warm start")
    progress = artifacts.Progress(start - 1, config.iterations)

    # Generation runs ahead of training by up to rollout.max_staleness iterations: iteration j
    # samples with weights version j-1-staleness (deterministic, so a resumed run regenerates the same
    # rollouts), and its rollouts are launched as soon as that version is published, while the
    # trainer is still updating the iterations before j.
    staleness = config.rollout.max_staleness

    def sampling_version(j: int) -> int:
        """The weights version iteration j samples with."""
        return max(0, j - 1 - staleness)

    published = {weights["version"]: weights}
    published.update({v: ctx.weights.ref(v) for v in range(sampling_version(start), start - 1)})
    in_flight: dict[int, tuple] = {}
    estimates: dict[int, dict] = {}

    def difficulty_for(j: int) -> dict | None:
        """The difficulty estimate filtering iteration j's prompts, made with the weights the
        estimating iteration samples with (curation/curriculum.py)."""
        schedule = config.curation.difficulty
        if schedule is None:
            return None
        estimated_at = estimate_iteration(j, schedule.every)
        if estimated_at not in estimates:
            estimate = estimates[estimated_at] = tasks["difficulty"](
                config_input, root, estimated_at, sampling_version(estimated_at)
            )
            say(
                f"difficulty before iteration {estimated_at}: {estimate['stream_rows']} prompts in the stream "
                f"({estimate['never_solved']} never, {estimate['always_solved']} always solved of "
                f"{estimate['estimated']} estimated)"
            )
        return estimates[estimated_at]

    def launch_ready(first_uncollected: int):
        for j in range(first_uncollected, config.iterations + 1):
            version = sampling_version(j)
            if version not in published:
                break
            if j not in in_flight:
                in_flight[j] = _launch(
                    tasks, config, root, j, published[version], 0, fleet.runner(j), difficulty_for(j)
                )

    for iteration in range(start, config.iterations + 1):
        iteration_started, compiles_before = time.perf_counter(), compile_count()
        launch_ready(iteration)
        rollouts, scored, plans = _collect(
            tasks, config, root, iteration, in_flight.pop(iteration), fleet.runner(iteration)
        )
        guard.check(f"in iteration {iteration} after its rollouts were scored")
        updated = tasks["update"](config_input, root, iteration, previous, scored)
        previous = tasks["checkpoint"](config_input, root, updated)
        guard.check(f"in iteration {iteration} after its checkpoint was sealed")
        weights = tasks["publish"](config_input, root, previous)
        published[weights["version"]] = weights
        launch_ready(iteration + 1)  # the next iterations' rollouts start before this iteration's bookkeeping
        metrics = _iteration_metrics(
            iteration,
            plans,
            rollouts,
            scored,
            updated,
            weights,
            time.perf_counter() - iteration_started,
            compile_count() - compiles_before,
        )
        fleet.record(iteration, metrics)
        rundir.write_record(run_path, "metrics", iteration, metrics)
        _tensorboard(root)
        # rft: no loss when nothing verified (no step), and the share of the rollouts it kept
        loss = f"{metrics['loss']:+.4f}" if "loss" in metrics else "   none"
        update = (
            f"kept {metrics['kept_fraction']:.3f}" if "kept_fraction" in metrics else f"clip {metrics['clip_frac']:.3f}"
        )
        say(
            f"iteration {iteration:>4}/{config.iterations}  reward {metrics['reward_mean']:.3f}  "
            f"loss {loss}  {update}  "
            f"{metrics['tokens_per_s']:,.0f} tok/s  {metrics['seconds']:.2f}s"
        )
        if eval_due(config, iteration):
            _evaluate(tasks, config, root, weights, iteration)
        progress.update(iteration)
        guard.check(f"after iteration {iteration}")

    return {
        "run_dir": root,
        "before": rundir.read_record(run_path, "eval", 0),
        "after": rundir.read_record(run_path, "eval", config.iterations),
        "weights_sha256": weights["sha256"],
    }


def _launch(
    tasks,
    config: RunConfig,
    root: str,
    iteration: int,
    weights: dict,
    generation_round: int,
    runner=None,
    difficulty: dict | None = None,
):
    """Plan one round of rollouts, submit its shards and their scoring; returns futures and the plan."""
    plan = tasks["rollout_plan"](_task_input(config), root, iteration, generation_round, difficulty)
    # Ray pickles the arguments with the quote still on (a bare tuple arrives): it gets the config as is.
    parameters = {
        "config": unmapped(config if runner else _task_input(config)),
        "run_dir": unmapped(root),
        "iteration": unmapped(iteration),
        "shard": range(config.rollout.shards),
        "weights": unmapped(weights),
        "plan": unmapped(plan),
        "generation_round": unmapped(generation_round),
    }
    if runner is None:
        sampled = tasks["rollout"].map(**parameters)
    else:
        sampled = runner.map(tasks["rollout"], parameters)
    rewarded = tasks["reward"].map(unmapped(_task_input(config)), unmapped(root), sampled)
    return sampled, rewarded, weights, difficulty, plan


def _collect(
    tasks, config: RunConfig, root: str, iteration: int, launched, runner=None
) -> tuple[list[dict], list[dict], list[dict]]:
    """Wait for an iteration's rollouts and scores. With dynamic sampling (DAPO), further rounds
    (same weights) run until enough groups have signal or `max_rounds` is reached."""
    r, ds = config.rollout, config.algorithm.dynamic_sampling
    rollouts, scored = [], []
    sampled, rewarded, weights, difficulty, plan = launched
    plans = [plan]
    for generation_round in range(1 + (ds.max_rounds if ds.enabled else 0)):
        if generation_round:
            if sum(s["groups_with_signal"] for s in scored) >= r.prompts_per_iteration:
                break
            sampled, rewarded, _, _, plan = _launch(
                tasks, config, root, iteration, weights, generation_round, runner, difficulty
            )
            plans.append(plan)
        scored += rewarded.result()
        rollouts += sampled.result()
    return rollouts, scored, plans


def _evaluate(tasks, config: RunConfig, root: str, weights: dict, iteration: int) -> dict:
    result = tasks["evaluate"](_task_input(config), root, weights, iteration)
    rundir.write_record(as_path(root), "eval", iteration, result)
    artifacts.publish_evaluations(rundir.read_records(as_path(root), "eval"))
    _tensorboard(root)
    say(
        f"eval after iteration {iteration} (weights v{weights['version']}): "
        f"pass@1 {result['pass_at_1']:.1%}  pass@{result['k']} {result['pass_at_k']:.1%}"
    )
    return result


def _iteration_metrics(iteration, plans, rollouts, scored, updated, weights, seconds, compilations) -> dict:
    rows = sum(s["rows"] for s in scored)
    tokens = sum(r["tokens"] for r in rollouts)
    rounds = {r["round"] for r in rollouts}  # shards of a round run in parallel, rounds one after another
    rollout_seconds = sum(max(r["rollout_seconds"] for r in rollouts if r["round"] == k) for k in rounds)
    skip = {"uri", "iteration", "update_seconds"}
    return {
        "iteration": iteration,
        "weights_version": weights["version"],
        "rollout_weights_versions": sorted({r["weights_version"] for r in rollouts}),
        "staleness": iteration - 1 - min(r["weights_version"] for r in rollouts),
        "reward_mean": sum(s["reward_sum"] for s in scored) / rows,
        "shaped_reward_mean": sum(s["shaped_reward_sum"] for s in scored) / rows,
        "generation_rounds": 1 + max(r["round"] for r in rollouts),
        "completion_length_mean": sum(s["length_sum"] for s in scored) / rows,
        "rollout_tokens": tokens,
        "rollout_plan": [{k: p[k] for k in ("round", "sizes", "predicted_costs")} for p in plans],
        **{k: v for k, v in updated.items() if k not in skip},
        "tokens_per_s": tokens / max(rollout_seconds, 1e-9),
        "seconds": seconds,
        # how the work was executed (varies from run to run, unlike everything above)
        # (jit compilations in this process during the iteration: 0 in steady state, more after a restart)
        "timing": {
            "rollout_seconds": rollout_seconds,
            "rollout_idle_fraction": idle_fraction(
                [[r["rollout_seconds"] for r in rollouts if r["round"] == k] for k in sorted(rounds)]
            ),
            "update_seconds": updated["update_seconds"],
            "compilations": compilations,
            "rollout_workers": sorted({r.get("worker", "") for r in rollouts}),
        },
    }
