"""The stages of an RL iteration as Prefect tasks: thin wrappers over library code.

Each task takes (config, run_dir, small references) and returns a small reference dict: a URI, a
version or iteration, a content hash and a few scalar metrics. Arrays live in the run directory.

DESIGN invariant 2: cache policy INPUTS + TASK_SOURCE (no RUN_ID, so a re-run of the flow after a
kill reuses finished stages), persisted results (the flow points result storage into the run
directory), retries only for transient I/O errors.
"""

from __future__ import annotations

import time

import pandas as pd
from prefect import task
from prefect.cache_policies import INPUTS, TASK_SOURCE, CacheKeyFnPolicy

from spotrl import distributed
from spotrl.config import RunConfig
from spotrl.curation import curriculum, rundata
from spotrl.curation.batches import rollout_rows
from spotrl.evaluation.evaluate import difficulty_sampler, evaluate_pass_at_k
from spotrl.faults import failpoint
from spotrl.rewards.sandbox.runner import SandboxError, SandboxUnavailable
from spotrl.rewards.score import score
from spotrl.rl.batch import in_generation_order, training_batch
from spotrl.rl.iteration_update import checkpoint_metadata, initial_metadata, starting_params, update_on_batch
from spotrl.rl.shaping import reward_summary, shaped_rewards
from spotrl.rng import derive_key, rollout_key
from spotrl.rollout import shards
from spotrl.rollout.completions import LoadedPolicy, round_frame, sample_completions, shard_number
from spotrl.storage.failures import is_environment_failure
from spotrl.storage.lease import worker_id
from spotrl.storage.rollouts import read_shard, write_shard
from spotrl.tasks import runlog
from spotrl.tasks.context import get_context
from spotrl.tasks.spmd import on_every_process

_PERMANENT_OS_ERRORS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


def retry_transient(task, task_run, state) -> bool:
    """Retry I/O hiccups (network, storage); never a bug or bad data, which would fail the same way."""
    try:
        state.result()
    except Exception as err:  # noqa: BLE001 - the state's exception, classified below
        if isinstance(err, SandboxUnavailable) or is_environment_failure(err):
            return False  # no isolation on this host, a full disk, a read-only directory: seconds change nothing
        if isinstance(err, (TimeoutError, ConnectionError, SandboxError)):  # a sandbox that failed to run too
            return True
        return isinstance(err, OSError) and not isinstance(err, _PERMANENT_OS_ERRORS)
    return False


STAGE_OPTIONS = dict(
    cache_policy=INPUTS + TASK_SOURCE,
    persist_result=True,
    retries=2,
    retry_delay_seconds=[1, 4],
    retry_condition_fn=retry_transient,
)


def _rollout_run_name(parameters: dict) -> str:
    """rollout-i0007-s2: the UI tells the task runs apart by iteration and shard (-r1: a DAPO extra round)."""
    extra = parameters.get("generation_round", 0)
    return f"rollout-i{parameters['iteration']:04d}-s{parameters['shard']}" + (f"-r{extra}" if extra else "")


def _plan_run_name(parameters: dict) -> str:
    extra = parameters.get("generation_round", 0)
    return f"rollout-plan-i{parameters['iteration']:04d}" + (f"-r{extra}" if extra else "")


# The config only names source files: their content goes into the key too, so an edited file re-curates.
CURATE_CACHE_POLICY = INPUTS + TASK_SOURCE + CacheKeyFnPolicy(cache_key_fn=rundata.cache_key)


@task(name="curate", **{**STAGE_OPTIONS, "cache_policy": CURATE_CACHE_POLICY})
def curate(config: RunConfig, run_dir: str) -> dict:
    return rundata.prepare(config, run_dir)


@task(name="warm-start", **STAGE_OPTIONS)
@on_every_process
def warm_start(config: RunConfig, run_dir: str, data: dict) -> dict:
    """Supervised warm start; writes the iteration-0 train state (fresh optimizer for RL)."""
    ctx = get_context(run_dir, config)
    prompts, answers, targets = ctx.problem_spec.warm_start_examples(ctx.split("train"))
    started = time.perf_counter()
    with runlog.Progress("warm start", total=config.warmstart.max_steps) as progress:
        params, info = starting_params(
            config, ctx.policy, ctx.tokenizer, ctx.problem_spec.verifier, prompts, answers, targets, report=progress
        )
    state = ctx.initial_train_state(params)
    path = ctx.checkpoints.save(0, state, initial_metadata(config, data["sha256"], info))
    ctx.train_states.put(0, state)
    return {"uri": str(path), "iteration": 0, "warmstart_seconds": time.perf_counter() - started, **info}


@task(name="difficulty", task_run_name="difficulty-i{iteration:04d}", **STAGE_OPTIONS)
def difficulty(config: RunConfig, run_dir: str, iteration: int, weights_version: int) -> dict:
    """Pass rates of the training prompts under weights `weights_version`: they filter the prompt
    stream from `iteration` on (curation/curriculum.py). Keyed on the version, not on its bytes: a
    version's weights are deterministic, and an old version may be gone when a resumed run asks."""
    ctx = get_context(run_dir, config)
    r = config.rollout  # batches of a rollout shard's size: the sampler compiled for rollouts serves
    sampler = difficulty_sampler(
        lambda: LoadedPolicy(ctx.policy.graphdef, ctx.pull(weights_version), ctx.tokenizer),
        ctx.problem_spec.verifier,
        ctx.sampling(r.temperature),
        derive_key(config.seed, "difficulty", weights_version),
        config.problem.verify_workers,
    )
    return curriculum.estimate_for_iteration(
        ctx.run_dir,
        ctx.split("train").to_pandas(),
        iteration=iteration,
        version=weights_version,
        make_sampler=sampler,
        cfg=config.curation.difficulty,
        seed=config.seed,
        batch_size=shards.shard_capacity(r.prompts_per_iteration, r.shards),
        min_rows=r.prompts_per_iteration,
    )


def _columns(split, rows: list[int]) -> pd.DataFrame:
    """The split's `rows` as a frame: a `datasets` column iterated reads one row at a time (~0.1 ms
    each, ~35 ms of every default iteration), a frame is read at once."""
    return split.select(rows).to_pandas()


@task(name="rollout-plan", task_run_name=_plan_run_name, **STAGE_OPTIONS)
def rollout_plan(
    config: RunConfig, run_dir: str, iteration: int, generation_round: int = 0, difficulty: dict | None = None
) -> dict:
    """Which of the round's prompts each shard samples (rollout/shards.py), from the completion
    lengths of the iterations the round cannot overtake (<= iteration - 1 - max_staleness).

    Round 0 takes the iteration's prompts in the seeded data order; rounds >= 1 are dynamic
    sampling's extra generations, on prompts drawn from a stream of their own. With a `difficulty`
    estimate, both draw from the training rows it did not drop.
    """
    ctx = get_context(run_dir, config)
    r, train = config.rollout, ctx.split("train")
    pool = curriculum.stream_rows(train, difficulty, config.curation.difficulty, r.prompts_per_iteration)
    rows = rollout_rows(config.seed, iteration, generation_round, pool, r.prompts_per_iteration)
    record = shards.length_record(ctx.run_dir, iteration - 1 - r.max_staleness)
    return {
        "iteration": iteration,
        "round": generation_round,
        "rows": rows.tolist(),  # the round's prompts (training rows), in the order their keys follow
        **shards.plan_round(_columns(train, rows.tolist()), ctx.tokenizer, record, r),  # positions in `rows`
    }


@task(name="rollout", task_run_name=_rollout_run_name, **STAGE_OPTIONS)
def rollout(
    config: RunConfig, run_dir: str, iteration: int, shard: int, weights: dict, plan: dict, generation_round: int = 0
) -> dict:
    """Sample shard `shard` of the round's `plan`, `group_size` completions per prompt, with `weights`.

    Sample j of the round's prompt i draws with its own key (rng.rollout_key), and the batch has the
    same shape on every shard, so the rows come out the same whichever shard samples them.
    """
    ctx = get_context(run_dir, config)
    r, train = config.rollout, ctx.split("train")
    positions = plan["shards"][shard]
    prompts = _columns(train, [plan["rows"][i] for i in positions])
    started = time.perf_counter()
    completions = sample_completions(
        LoadedPolicy(ctx.policy.graphdef, ctx.pull(weights["version"]), ctx.tokenizer),
        prompts["prompt"].tolist(),
        r.group_size,
        ctx.sampling(r.temperature),
        rollout_key(config.seed, iteration, generation_round),
        prompt_ids=positions,
        chunk_rows=shards.shard_capacity(r.prompts_per_iteration, r.shards) * r.group_size,
        prompt_length=plan["prompt_length"],
    )
    seconds = time.perf_counter() - started
    failpoint("rollout.sample", iteration)
    frame = round_frame(prompts, completions, r.group_size, weights["version"], generation_round, positions)
    number = shard_number(shard, generation_round, r.shards)
    path, sha256 = write_shard(ctx.run_dir / "rollouts", iteration, number, "rollouts", frame)
    return {
        "uri": str(path),
        "sha256": sha256,
        "iteration": iteration,
        "shard": number,
        "round": generation_round,
        "weights_version": weights["version"],
        "worker": worker_id(),
        "rows": len(frame),
        "tokens": completions.num_tokens,
        "rollout_seconds": seconds,
        "tokens_per_s": completions.num_tokens / max(seconds, 1e-9),
    }


@task(name="reward", task_run_name="reward-i{rollouts[iteration]:04d}-s{rollouts[shard]}", **STAGE_OPTIONS)
def reward(config: RunConfig, run_dir: str, rollouts: dict) -> dict:
    ctx = get_context(run_dir, config)
    frame = read_shard(rollouts["uri"], rollouts["sha256"])
    frame["task_reward"] = score(
        ctx.problem_spec.verifier,
        frame["completion"].tolist(),
        frame["stopped"],
        frame["answer"].tolist(),
        workers=config.problem.verify_workers,
    )
    frame["reward"] = shaped_rewards(
        frame["task_reward"], frame["length"].to_numpy(), config.algorithm.overlong, config.rollout.max_new_tokens
    )
    failpoint("reward.score", rollouts["iteration"])
    path, sha256 = write_shard(ctx.run_dir / "rollouts", rollouts["iteration"], rollouts["shard"], "scored", frame)
    return {
        "uri": str(path),
        "sha256": sha256,
        "iteration": rollouts["iteration"],
        "rows": len(frame),
        **reward_summary(frame, config.rollout.group_size),
    }


@task(name="update", task_run_name="update-i{iteration:04d}", **STAGE_OPTIONS)
@on_every_process
def update(config: RunConfig, run_dir: str, iteration: int, previous: dict, scored: list[dict]) -> dict:
    """One policy update on the iteration's scored rollouts. The new train state stays in memory and
    is saved (orbax) in the background, while the next rollouts run; the checkpoint stage seals it."""
    ctx = get_context(run_dir, config)
    started = time.perf_counter()
    r = config.rollout
    frame = in_generation_order([read_shard(ref["uri"], ref["sha256"]) for ref in scored])
    batch = training_batch(
        frame,
        iteration,
        group_size=r.group_size,
        prompts=r.prompts_per_iteration,
        max_staleness=r.max_staleness,
        dynamic_sampling=config.algorithm.dynamic_sampling.enabled,
    )
    if batch.warning:
        runlog.warn(batch.warning)
    state, metrics = update_on_batch(
        config,
        iteration,
        ctx.train_state(previous["iteration"], consume=True),
        batch,
        tokenizer=ctx.tokenizer,
        graphdef=ctx.policy.graphdef,
        optimizer=ctx.optimizer,
        critic_graphdef=ctx.critic_graphdef,
        critic_optimizer=ctx.critic_optimizer,
        reference_params=None if ctx.reference_version is None else ctx.pull(ctx.reference_version),
    )
    failpoint("update.step", iteration)
    meta = checkpoint_metadata(
        config,
        iteration,
        ctx.checkpoints.metadata(previous["iteration"]),
        metrics["optimizer_steps"],
        batch.frame["weights_version"],
    )
    path = ctx.checkpoints.save(iteration, state, meta, background=True)
    ctx.train_states.put(iteration, state)
    return {
        "uri": str(path),
        "iteration": iteration,
        "update_seconds": time.perf_counter() - started,
        **metrics,
        **batch.info,
    }


@task(name="checkpoint", task_run_name="checkpoint-i{updated[iteration]:04d}", **STAGE_OPTIONS)
def checkpoint(config: RunConfig, run_dir: str, updated: dict) -> dict:
    """Seal the saved train state with checksums (once its background save has committed) and apply retention."""
    ctx = get_context(run_dir, config)
    ctx.checkpoints.seal(updated["iteration"])
    ctx.checkpoints.prune()
    return ctx.checkpoints.ref(updated["iteration"])


@task(name="publish", task_run_name="publish-i{checkpoint[iteration]:04d}", **STAGE_OPTIONS)
@on_every_process
def publish(config: RunConfig, run_dir: str, checkpoint: dict) -> dict:
    """Publish the parameters of `checkpoint` (the update's, saved or still saving, or a sealed one)
    as weight version == iteration; flips LATEST.

    Over several processes all of them gather the parameters (a collective), and process 0 writes."""
    ctx = get_context(run_dir, config)
    iteration = checkpoint["iteration"]
    state = ctx.train_state(iteration, consume=False)
    params = ctx.policy.to_pure(state["params"])
    if not distributed.is_primary():
        return {}
    ctx.weights.publish(iteration, params, {"checkpoint": checkpoint["uri"], "config_digest": config.digest()})
    return ctx.weights.ref(iteration)


@task(name="evaluate", task_run_name="evaluate-i{iteration:04d}", **STAGE_OPTIONS)
def evaluate(config: RunConfig, run_dir: str, weights: dict, iteration: int) -> dict:
    ctx = get_context(run_dir, config)
    e = config.eval
    held_out = ctx.split("eval").select(range(e.prompts))
    started = time.perf_counter()
    # off a terminal only the result's line (the flow says it): a bar's lines would flood CI logs
    with runlog.Progress(f"eval i{iteration}", total=len(held_out) * e.n, unit="sample", plain=False) as progress:
        result = evaluate_pass_at_k(
            LoadedPolicy(ctx.policy.graphdef, ctx.pull(weights["version"]), ctx.tokenizer),
            ctx.problem_spec.verifier,
            held_out["prompt"],
            held_out["answer"],
            n=e.n,
            k=e.k,
            sampling=ctx.sampling(e.temperature),
            key=derive_key(config.seed, "eval", weights["version"]),
            report=progress,
        )
    return {
        "iteration": iteration,
        "weights_version": weights["version"],
        **result,
        "eval_seconds": time.perf_counter() - started,
    }
