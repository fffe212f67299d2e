"""The stages of an RL iteration as Prefect tasks: thin wrappers over library code.

Each task takes (config, run_dir, small references) and returns a small reference dict: a URI, a
version or iteration, a content hash and a few scalar metrics. Arrays live in the run directory.

DESIGN invariant 2: cache policy INPUTS + TASK_SOURCE (no RUN_ID, so a re-run of the flow after a
kill reuses finished stages), persisted results (the flow points result storage into the run
directory), retries only for transient I/O errors.
"""

from __future__ import annotations

import time

import jax
import numpy as np
import pandas as pd
from prefect import task
from prefect.cache_policies import INPUTS, TASK_SOURCE

from spotrl.curation import arithmetic
from spotrl.curation.batches import batch_indices
from spotrl.curation.store import save_splits
from spotrl.faults import failpoint
from spotrl.flows.config import RunConfig
from spotrl.model.evaluate import evaluate_pass_at_k
from spotrl.model.grpo import policy_update
from spotrl.model.rng import derive_key, derive_numpy_rng, next_iteration_streams
from spotrl.model.rollout import sample_completions
from spotrl.model.train_step import build_rl_step
from spotrl.model.warmstart import supervised_warm_start
from spotrl.rewards.score import score
from spotrl.storage.rollouts import read_shard, write_shard
from spotrl.tasks.context import get_context

_PERMANENT_OS_ERRORS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


def retry_transient(task, task_run, state) -> bool:
    """Retry I/O hiccups (network, storage); never a bug or bad data, which would fail the same way."""
    try:
        state.result()
    except (TimeoutError, ConnectionError):
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


@task(name="curate", **STAGE_OPTIONS)
def curate(config: RunConfig, run_dir: str) -> dict:
    t = config.task
    train, held_out = arithmetic.make_splits(config.seed, t.train_size, t.eval_size, t.min_digits, t.max_digits)
    ctx = get_context(run_dir, config)
    manifest = save_splits(ctx.data_dir, {"train": train, "eval": held_out})
    return {"uri": str(ctx.data_dir), "sha256": manifest["sha256"], "rows": {k: v["rows"] for k, v in manifest["splits"].items()}}


@task(name="warm-start", **STAGE_OPTIONS)
def warm_start(config: RunConfig, run_dir: str, data: dict) -> dict:
    """Supervised warm start; writes the iteration-0 train state (fresh optimizer for RL)."""
    ctx = get_context(run_dir, config)
    train = ctx.split("train")
    started = time.perf_counter()
    params, info = supervised_warm_start(
        ctx.policy, ctx.tokenizer, config.task.name, train["prompt"], train["answer"],
        [arithmetic.completion_text(a) for a in train["answer"]], config.warmstart,
        seed=config.seed, max_new_tokens=config.rollout.max_new_tokens,
    )
    state = {"params": params, "opt_state": ctx.optimizer.init(params)}
    meta = {"iteration": 0, "seed": config.seed, "data_cursor": 0, "data_sha256": data["sha256"], "optimizer_steps": 0,
            "rollout_weights_versions": [], "rng": next_iteration_streams(config.seed, 0, config.rollout.shards),
            "warmstart": info}
    path = ctx.checkpoints.save(0, state, meta)
    ctx.train_states.put(0, state)
    return {"uri": str(path), "iteration": 0, "warmstart_seconds": time.perf_counter() - started, **info}


@task(name="rollout", **STAGE_OPTIONS)
def rollout(config: RunConfig, run_dir: str, iteration: int, shard: int, weights: dict) -> dict:
    """Sample this shard's prompts of the iteration, `group_size` completions each, with `weights`."""
    ctx = get_context(run_dir, config)
    r = config.rollout
    train = ctx.split("train")
    rows = batch_indices(config.seed, iteration, r.prompts_per_iteration, len(train))
    rows = np.array_split(rows, r.shards)[shard]
    prompts = train.select(rows.tolist())
    started = time.perf_counter()
    state = ctx.pull(weights["version"])
    completions = sample_completions(
        ctx.policy.graphdef, state, ctx.tokenizer, prompts["prompt"], r.group_size, ctx.sampling(r.temperature),
        derive_key(config.seed, "rollout", iteration, shard),
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
    path, sha256 = write_shard(ctx.run_dir / "rollouts", iteration, shard, "rollouts", frame)
    return {"uri": str(path), "sha256": sha256, "iteration": iteration, "shard": shard, "weights_version": weights["version"],
            "rows": len(frame), "tokens": completions.num_tokens, "rollout_seconds": seconds,
            "tokens_per_s": completions.num_tokens / max(seconds, 1e-9)}


@task(name="reward", **STAGE_OPTIONS)
def reward(config: RunConfig, run_dir: str, rollouts: dict) -> dict:
    frame = read_shard(rollouts["uri"], rollouts["sha256"])
    frame["reward"] = score(config.task.name, frame["completion"].tolist(), frame["stopped"], frame["answer"].tolist())
    failpoint("reward.score", rollouts["iteration"])
    root = get_context(run_dir, config).run_dir / "rollouts"
    path, sha256 = write_shard(root, rollouts["iteration"], rollouts["shard"], "scored", frame)
    return {"uri": str(path), "sha256": sha256, "iteration": rollouts["iteration"], "rows": len(frame),
            "reward_sum": float(frame["reward"].sum()), "length_sum": int(frame["length"].sum())}


@task(name="update", **STAGE_OPTIONS)
def update(config: RunConfig, run_dir: str, iteration: int, previous: dict, scored: list[dict]) -> dict:
    """One policy update on the iteration's scored rollouts; saves the new train state (orbax)."""
    ctx = get_context(run_dir, config)
    started = time.perf_counter()
    frame = pd.concat([read_shard(ref["uri"], ref["sha256"]) for ref in scored], ignore_index=True)
    prompt_tokens, prompt_valid = ctx.tokenizer.encode_batch_left_padded(frame["prompt"].tolist())
    state = ctx.train_state(previous["iteration"], consume=True)
    a = config.algorithm
    step_fn = build_rl_step(ctx.policy.graphdef, ctx.optimizer, a.clip_eps, config.rollout.temperature)
    params, opt_state, metrics = policy_update(
        step_fn, state["params"], state["opt_state"],
        prompt_tokens=prompt_tokens, prompt_valid=prompt_valid,
        tokens=np.stack(frame["tokens"].to_numpy()), lengths=frame["length"].to_numpy(),
        old_logprobs=np.stack(frame["logprobs"].to_numpy()), rewards=frame["reward"].to_numpy(),
        group_size=config.rollout.group_size, estimator=a.name, advantage_eps=a.advantage_eps,
        minibatches=a.minibatches, epochs=a.epochs, rng=derive_numpy_rng(config.seed, "minibatches", iteration),
    )
    failpoint("update.step", iteration)
    state = {"params": params, "opt_state": opt_state}
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
    return {"uri": str(path), "iteration": iteration, "update_seconds": time.perf_counter() - started, **metrics}


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
        ctx.policy.graphdef, ctx.pull(weights["version"]), ctx.tokenizer, config.task.name,
        held_out["prompt"], held_out["answer"], n=e.n, k=e.k, sampling=ctx.sampling(e.temperature),
        key=derive_key(config.seed, "eval", weights["version"]),
    )
    return {"iteration": iteration, "weights_version": weights["version"], **result,
            "eval_seconds": time.perf_counter() - started}
