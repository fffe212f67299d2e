"""The stages of an RL iteration as Prefect tasks: thin wrappers over library code.

Each task takes (config, run_dir, small references) and returns a small reference dict: a URI, a
version or iteration, a content hash and a few scalar metrics. Arrays live in the run directory.

DESIGN invariant 2: cache policy INPUTS + TASK_SOURCE (no RUN_ID, so a re-run of the flow after a
kill reuses finished stages), persisted results (the flow points result storage into the run
directory), retries only for transient I/O errors.
"""

from __future__ import annotations

import os
import socket
import time

import numpy as np
import pandas as pd
from prefect import task
from prefect.cache_policies import INPUTS, TASK_SOURCE, CacheKeyFnPolicy

from spotrl.curation import curriculum, rundata
from spotrl.problems import get_problem
from spotrl.curation.batches import batch_indices
from spotrl.faults import failpoint
from spotrl.config import RunConfig
from spotrl.evaluation.evaluate import evaluate_pass_at_k
from spotrl.model.sequences import completion_mask, join
from spotrl.rl.shaping import fill_batch_with_signal, groups_with_signal, overlong_penalty
from spotrl.rl.update import advantage_spec, policy_update
from spotrl.rng import derive_key, derive_numpy_rng, next_iteration_streams
from spotrl.rollout.completions import sample_completions
from spotrl.rl.train_step import build_rl_step, build_scoring_fn, loss_spec
from spotrl.rl.warmstart import pretrained_start, supervised_warm_start
from spotrl.rewards.sandbox.runner import SandboxError, SandboxUnavailable
from spotrl.rewards.score import score
from spotrl.storage.rollouts import read_shard, write_shard
from spotrl.tasks.context import get_context

_PERMANENT_OS_ERRORS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


def retry_transient(task, task_run, state) -> bool:
    """Retry I/O hiccups (network, storage); never a bug or bad data, which would fail the same way."""
    try:
        state.result()
    except SandboxUnavailable:  # no isolation possible on this host: retrying cannot help
        return False
    except (TimeoutError, ConnectionError, SandboxError):  # a sandbox that failed to run is infrastructure
        return True
    except OSError as err:
        return not isinstance(err, _PERMANENT_OS_ERRORS)
    except Exception:
        return False
    return False


STAGE_OPTIONS = dict(
    cache_policy=INPUTS + TASK_SOURCE,
    persist_result=True,
    retries=2,
    retry_delay_seconds=[1, 4],
    retry_condition_fn=retry_transient,
)


# The config only names source files: their content goes into the key too, so an edited file re-curates.
CURATE_CACHE_POLICY = INPUTS + TASK_SOURCE + CacheKeyFnPolicy(cache_key_fn=rundata.cache_key)


@task(name="curate", **{**STAGE_OPTIONS, "cache_policy": CURATE_CACHE_POLICY})
def curate(config: RunConfig, run_dir: str) -> dict:
    return rundata.prepare(config, run_dir)


@task(name="warm-start", **STAGE_OPTIONS)
def warm_start(config: RunConfig, run_dir: str, data: dict) -> dict:
    """Supervised warm start; writes the iteration-0 train state (fresh optimizer for RL)."""
    ctx = get_context(run_dir, config)
    prompts, answers, targets = get_problem(config.problem.name).warm_start_examples(ctx.split("train"))
    started = time.perf_counter()
    start = pretrained_start if config.model.path else supervised_warm_start  # a checkpoint is the starting policy
    params, info = start(
        ctx.policy, ctx.tokenizer, config.problem.name, prompts, answers, targets, config.warmstart,
        seed=config.seed, max_new_tokens=config.rollout.max_new_tokens,
    )
    state = ctx.initial_train_state(params)
    meta = {"iteration": 0, "seed": config.seed, "data_cursor": 0, "data_sha256": data["sha256"], "optimizer_steps": 0,
            "rollout_weights_versions": [], "rng": next_iteration_streams(config.seed, 0, config.rollout.shards),
            "warmstart": info}
    path = ctx.checkpoints.save(0, state, meta)
    ctx.train_states.put(0, state)
    return {"uri": str(path), "iteration": 0, "warmstart_seconds": time.perf_counter() - started, **info}


@task(name="difficulty", **STAGE_OPTIONS)
def difficulty(config: RunConfig, run_dir: str, iteration: int, weights_version: int) -> dict:
    """Pass rates of the training prompts under weights `weights_version`: they filter the prompt
    stream from `iteration` on (curation/curriculum.py). Keyed on the version, not on its bytes: a
    version's weights are deterministic, and an old version may be gone when a resumed run asks."""
    ctx = get_context(run_dir, config)
    sampler = lambda: curriculum.policy_sample_rewards(  # noqa: E731 - pulls the weights only when needed
        ctx.policy.graphdef, ctx.pull(weights_version), ctx.tokenizer, config.problem.name,
        ctx.sampling(config.rollout.temperature), derive_key(config.seed, "difficulty", weights_version),
        config.problem.verify_workers)
    r = config.rollout  # batches of a rollout shard's size: the sampler compiled for rollouts serves
    return curriculum.estimate_for_iteration(ctx.run_dir, ctx.split("train").to_pandas(), iteration, weights_version,
                                             sampler, config.curation.difficulty, config.seed,
                                             -(-r.prompts_per_iteration // r.shards), r.prompts_per_iteration)


@task(name="rollout", **STAGE_OPTIONS)
def rollout(config: RunConfig, run_dir: str, iteration: int, shard: int, weights: dict, generation_round: int = 0,
            difficulty: dict | None = None) -> dict:
    """Sample this shard's prompts of the iteration, `group_size` completions each, with `weights`.

    Round 0 takes the iteration's prompts in the seeded data order; rounds >= 1 are dynamic
    sampling's extra generations, on prompts drawn from a stream of their own. With a `difficulty`
    estimate, both draw from the training rows it did not drop.
    """
    ctx = get_context(run_dir, config)
    r, d = config.rollout, config.curation.difficulty
    train = ctx.split("train")
    pool = curriculum.stream_rows(train, difficulty, d, r.prompts_per_iteration)
    if generation_round == 0:
        rows = pool[batch_indices(config.seed, iteration, r.prompts_per_iteration, len(pool))]
        key = derive_key(config.seed, "rollout", iteration, shard)
    else:
        rng = derive_numpy_rng(config.seed, "dynamic_sampling", iteration, generation_round)
        rows = pool[rng.choice(len(pool), size=r.prompts_per_iteration, replace=False)]
        key = derive_key(config.seed, "rollout", iteration, shard, generation_round)
    rows = np.array_split(rows, r.shards)[shard]
    prompts = train.select(rows.tolist())
    started = time.perf_counter()
    state = ctx.pull(weights["version"])
    completions = sample_completions(
        ctx.policy.graphdef, state, ctx.tokenizer, prompts["prompt"], r.group_size, ctx.sampling(r.temperature),
        key,
    )
    seconds = time.perf_counter() - started
    failpoint("rollout.sample", iteration)
    repeat = lambda column: [v for v in prompts[column] for _ in range(r.group_size)]
    frame = pd.DataFrame({
        "prompt_id": repeat("id"),
        "prompt": repeat("prompt"),
        "answer": repeat("answer"),
        "sample": np.tile(np.arange(r.group_size), len(prompts)),
        "completion": completions.texts,
        "tokens": list(completions.tokens),
        "logprobs": list(completions.logprobs),
        "length": completions.lengths,
        "stopped": completions.stopped,
        "weights_version": weights["version"],
    })
    path, sha256 = write_shard(ctx.run_dir / "rollouts", iteration, shard + generation_round * r.shards, "rollouts", frame)
    return {"uri": str(path), "sha256": sha256, "iteration": iteration, "shard": shard + generation_round * r.shards,
            "round": generation_round, "weights_version": weights["version"], "worker": _worker(),
            "rows": len(frame), "tokens": completions.num_tokens, "rollout_seconds": seconds,
            "tokens_per_s": completions.num_tokens / max(seconds, 1e-9)}


@task(name="reward", **STAGE_OPTIONS)
def reward(config: RunConfig, run_dir: str, rollouts: dict) -> dict:
    frame = read_shard(rollouts["uri"], rollouts["sha256"])
    frame["task_reward"] = score(config.problem.name, frame["completion"].tolist(), frame["stopped"], frame["answer"].tolist(),
                                 workers=config.problem.verify_workers)
    frame["reward"] = frame["task_reward"]
    overlong = config.algorithm.overlong
    if overlong.enabled:
        max_tokens = overlong.max_tokens or config.rollout.max_new_tokens
        penalty = overlong_penalty(frame["length"].to_numpy(), max_tokens, overlong.cache_tokens, overlong.penalty)
        frame["reward"] = frame["task_reward"] + np.asarray(penalty, np.float64)
    grouped = frame["reward"].to_numpy().reshape(-1, config.rollout.group_size)
    failpoint("reward.score", rollouts["iteration"])
    root = get_context(run_dir, config).run_dir / "rollouts"
    path, sha256 = write_shard(root, rollouts["iteration"], rollouts["shard"], "scored", frame)
    return {"uri": str(path), "sha256": sha256, "iteration": rollouts["iteration"], "rows": len(frame),
            "reward_sum": float(frame["task_reward"].sum()), "shaped_reward_sum": float(frame["reward"].sum()),
            "length_sum": int(frame["length"].sum()), "groups": len(grouped),
            "groups_with_signal": int(np.asarray(groups_with_signal(grouped)).sum())}


@task(name="update", **STAGE_OPTIONS)
def update(config: RunConfig, run_dir: str, iteration: int, previous: dict, scored: list[dict]) -> dict:
    """One policy update on the iteration's scored rollouts; saves the new train state (orbax)."""
    ctx = get_context(run_dir, config)
    started = time.perf_counter()
    a, r = config.algorithm, config.rollout
    frame = pd.concat([read_shard(ref["uri"], ref["sha256"]) for ref in scored], ignore_index=True)
    frame, batch_info = _training_batch(config, frame, iteration)
    prompt_tokens, prompt_valid = ctx.tokenizer.encode_batch_left_padded(frame["prompt"].tolist())
    tokens, lengths = np.stack(frame["tokens"].to_numpy()), frame["length"].to_numpy()
    behaviour_logprobs = np.stack(frame["logprobs"].to_numpy())
    state = ctx.train_state(previous["iteration"], consume=True)

    # The trainer recomputes the logprobs of the sampled tokens with its own weights (the
    # "proximal" policy): on-policy they must equal the sampler's (alignment), off-policy they
    # give the truncated importance weights that correct for stale rollouts.
    scoring = build_scoring_fn(ctx.policy.graphdef, r.temperature, ctx.critic_graphdef)
    all_tokens, all_valid = join(prompt_tokens, prompt_valid, tokens, lengths)
    width = tokens.shape[1]
    prox_logprobs, old_values = scoring(state["params"], state.get("critic"), all_tokens, all_valid, width)
    prox_logprobs = np.asarray(prox_logprobs)
    old_values = None if old_values is None else np.asarray(old_values)
    ref_logprobs = None
    if ctx.reference_version is not None:
        ref_logprobs = np.asarray(scoring(ctx.pull(ctx.reference_version), None, all_tokens, all_valid, width)[0])
    real = completion_mask(np.where(np.arange(len(lengths)) < batch_info["real_rows"], lengths, 0), width)
    alignment = importance_statistics(prox_logprobs, behaviour_logprobs, real, a.importance_cap)
    behaviour_weights = None
    if r.max_staleness > 0:
        behaviour_weights = np.minimum(np.exp(np.where(real, prox_logprobs - behaviour_logprobs, 0.0)), a.importance_cap)

    step_fn = build_rl_step(ctx.policy.graphdef, ctx.optimizer, loss_spec(a, r.max_new_tokens), r.temperature,
                            ctx.critic_graphdef, ctx.critic_optimizer, micro_batches=a.micro_batches)
    state, metrics = policy_update(
        step_fn, state, prompt_tokens=prompt_tokens, prompt_valid=prompt_valid, tokens=tokens, lengths=lengths,
        old_logprobs=prox_logprobs, rewards=frame["reward"].to_numpy(), spec=advantage_spec(a, r.group_size),
        minibatches=a.minibatches, epochs=a.epochs, rng=derive_numpy_rng(config.seed, "minibatches", iteration),
        real_rows=batch_info["real_rows"], ref_logprobs=ref_logprobs, old_values=old_values,
        behaviour_weights=None if behaviour_weights is None else behaviour_weights.astype(np.float32),
    )
    metrics.update(alignment)
    failpoint("update.step", iteration)
    before = ctx.checkpoints.metadata(previous["iteration"])
    versions = sorted({int(v) for v in frame["weights_version"]})
    meta = {  # with the arrays, everything that decides the future of the run
        "iteration": iteration,
        "seed": config.seed,
        "data_cursor": iteration * config.rollout.prompts_per_iteration,  # prompts consumed so far
        "data_sha256": before["data_sha256"],
        "optimizer_steps": before["optimizer_steps"] + metrics["optimizer_steps"],
        "rollout_weights_versions": before["rollout_weights_versions"] + [[iteration, versions]],
        "rng": next_iteration_streams(config.seed, iteration, config.rollout.shards),
    }
    path = ctx.checkpoints.save(iteration, state, meta)
    ctx.train_states.put(iteration, state)
    return {"uri": str(path), "iteration": iteration, "update_seconds": time.perf_counter() - started,
            **metrics, **{k: v for k, v in batch_info.items() if k != "real_rows"}}


def _training_batch(config: RunConfig, frame: pd.DataFrame, iteration: int) -> tuple[pd.DataFrame, dict]:
    """The rows to train on, padded with inert rows to one fixed shape.

    Rollouts staler than rollout.max_staleness are dropped (the schedule never makes them; a bug or
    a hand-edited run would). With dynamic sampling: the first `prompts_per_iteration` groups that
    have signal; otherwise every group of the iteration's prompts.
    """
    r, ds = config.rollout, config.algorithm.dynamic_sampling
    target_rows = r.prompts_per_iteration * r.group_size
    stale = (iteration - 1 - frame["weights_version"].to_numpy()) > r.max_staleness
    info = {"rollouts_dropped_stale": int(stale.sum())}
    frame = frame[~stale].reset_index(drop=True)
    grouped = frame["reward"].to_numpy().reshape(-1, r.group_size)
    if ds.enabled:
        kept, dropped = fill_batch_with_signal(grouped, r.prompts_per_iteration)
        info.update(groups_generated=len(grouped), groups_dropped=dropped, groups_trained=len(kept),
                    batch_short_groups=r.prompts_per_iteration - len(kept))
        if len(kept) < r.prompts_per_iteration:
            get_run_logger_or_print(f"dynamic sampling: only {len(kept)} of {r.prompts_per_iteration} groups had signal "
                                    f"after {len(grouped)} generated; training on {len(kept)} (the rest is padding)")
    else:
        kept = list(range(min(len(grouped), r.prompts_per_iteration)))
    batch = frame.iloc[[g * r.group_size + i for g in kept for i in range(r.group_size)]].reset_index(drop=True)
    info["real_rows"] = len(batch)
    if len(batch) < target_rows and len(frame):
        filler = frame.iloc[[0] * (target_rows - len(batch))]  # any row: padding has no valid token and no advantage
        batch = pd.concat([batch, filler], ignore_index=True)
    return batch, info


def importance_statistics(prox_logprobs, behaviour_logprobs, mask, cap: float) -> dict:
    """Trainer/sampler alignment and importance-ratio statistics over the valid tokens."""
    diff = (prox_logprobs - behaviour_logprobs)[mask]
    if diff.size == 0:
        return {}
    ratio = np.exp(diff)
    return {"logprob_max_abs_diff": float(np.abs(diff).max()), "importance_ratio_mean": float(ratio.mean()),
            "importance_ratio_min": float(ratio.min()), "importance_ratio_max": float(ratio.max()),
            "importance_truncated_frac": float((ratio > cap).mean())}


def _worker() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def get_run_logger_or_print(message: str) -> None:
    try:
        from prefect import get_run_logger

        get_run_logger().warning(message)
    except Exception:  # noqa: BLE001 - outside a Prefect run (a plain function call)
        print(f"warning: {message}", flush=True)


@task(name="checkpoint", **STAGE_OPTIONS)
def checkpoint(config: RunConfig, run_dir: str, updated: dict) -> dict:
    """Seal the saved train state with checksums and apply retention."""
    ctx = get_context(run_dir, config)
    ctx.checkpoints.seal(updated["iteration"])
    ctx.checkpoints.prune()
    return ctx.checkpoints.ref(updated["iteration"])


@task(name="publish", **STAGE_OPTIONS)
def publish(config: RunConfig, run_dir: str, sealed: dict) -> dict:
    """Publish the checkpoint's parameters as weight version == iteration; flips LATEST."""
    ctx = get_context(run_dir, config)
    iteration = sealed["iteration"]
    state = ctx.train_state(iteration, consume=False)
    ctx.weights.publish(iteration, ctx.policy.to_pure(state["params"]), {"checkpoint": sealed["uri"]})
    return ctx.weights.ref(iteration)


@task(name="evaluate", **STAGE_OPTIONS)
def evaluate(config: RunConfig, run_dir: str, weights: dict, iteration: int) -> dict:
    ctx = get_context(run_dir, config)
    e = config.eval
    held_out = ctx.split("eval").select(range(e.prompts))
    started = time.perf_counter()
    result = evaluate_pass_at_k(
        ctx.policy.graphdef, ctx.pull(weights["version"]), ctx.tokenizer, config.problem.name,
        held_out["prompt"], held_out["answer"], n=e.n, k=e.k, sampling=ctx.sampling(e.temperature),
        key=derive_key(config.seed, "eval", weights["version"]),
    )
    return {"iteration": iteration, "weights_version": weights["version"], **result,
            "eval_seconds": time.perf_counter() - started}
