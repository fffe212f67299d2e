"""The trainer's side of an RL iteration as library calls: the starting parameters (iteration 0), the
update on a training batch, and the metadata each checkpoint records with the train state.

`update_on_batch` rescores the sampled tokens with the trainer's weights (the "proximal" policy: on
policy its logprobs must equal the sampler's, off policy they give the truncated importance weights
that correct for stale rollouts) unless the sampler's recorded logprobs can stand in for them
(`uses_sampler_logprobs`), scores them under the reference policy for a KL term, then runs
`policy_update`. No Prefect and no run directory: the stage task in spotrl/tasks/stages.py reads the
rollouts and saves what this returns.
"""

from __future__ import annotations

import jax
import numpy as np

from spotrl.model.sequences import completion_mask, join
from spotrl.rl.batch import TrainingBatch
from spotrl.rl.importance import importance_statistics, truncated_weights
from spotrl.rl.rft import rft_update
from spotrl.rl.train_step import build_rl_step, build_scoring_fn, loss_spec
from spotrl.rl.update import UpdateBatch, advantage_spec, policy_update
from spotrl.rl.warmstart import pretrained_start, supervised_warm_start
from spotrl.rng import minibatch_rng, next_iteration_streams


def update_on_batch(
    config,
    iteration: int,
    state: dict,
    batch: TrainingBatch,
    *,
    tokenizer,
    graphdef,
    optimizer,
    critic_graphdef=None,
    critic_optimizer=None,
    reference_params=None,
) -> tuple[dict, dict]:
    """(the train state after the update, its metrics with the alignment statistics) for `batch`.

    `reference_params`: the KL reference policy's weights, or None without a KL term.
    `algorithm.name: rft` is not a policy-gradient update: the supervised step on the verified rows.
    """
    if config.algorithm.name == "rft":
        return rft_update(config, iteration, state, batch, tokenizer=tokenizer, graphdef=graphdef, optimizer=optimizer)
    a, r, frame = config.algorithm, config.rollout, batch.frame
    prompt_tokens, prompt_valid = tokenizer.encode_batch_left_padded(frame["prompt"].tolist())
    tokens, lengths = np.stack(frame["tokens"].to_numpy()), frame["length"].to_numpy()
    behaviour_logprobs = np.stack(frame["logprobs"].to_numpy())

    scoring = build_scoring_fn(graphdef, r.temperature, critic_graphdef)
    all_tokens, all_valid = join(prompt_tokens, prompt_valid, tokens, lengths)
    width = tokens.shape[1]
    real = completion_mask(np.where(np.arange(len(lengths)) < batch.real_rows, lengths, 0), width)
    sampler = uses_sampler_logprobs(config)
    prox_logprobs, old_values, alignment = behaviour_logprobs, None, {}
    if not sampler or critic_graphdef is not None:  # a critic's values at sampling time need the pass too
        logprobs, values = scoring(state["params"], state.get("critic"), all_tokens, all_valid, width)
        old_values = None if values is None else np.asarray(values)
        if not sampler:
            prox_logprobs = np.asarray(logprobs)
            alignment = importance_statistics(prox_logprobs, behaviour_logprobs, real, a.importance_cap)
    ref_logprobs = None
    if reference_params is not None:
        ref_logprobs = np.asarray(scoring(reference_params, None, all_tokens, all_valid, width)[0])
    behaviour_weights = None
    if r.max_staleness > 0:
        behaviour_weights = truncated_weights(prox_logprobs, behaviour_logprobs, real, a.importance_cap)

    step_fn = build_rl_step(
        graphdef,
        optimizer,
        loss_spec(a, r.max_new_tokens),
        r.temperature,
        critic_graphdef,
        critic_optimizer,
        micro_batches=a.micro_batches,
    )
    update = UpdateBatch(
        prompt_tokens=prompt_tokens,
        prompt_valid=prompt_valid,
        tokens=tokens,
        lengths=lengths,
        old_logprobs=prox_logprobs,
        rewards=frame["reward"].to_numpy(),
        real_rows=batch.real_rows,
        ref_logprobs=ref_logprobs,
        old_values=old_values,
        behaviour_weights=behaviour_weights,
    )
    state, metrics = policy_update(
        step_fn,
        state,
        update,
        advantage_spec(a, r.group_size),
        minibatches=a.minibatches,
        epochs=a.epochs,
        rng=minibatch_rng(config.seed, iteration),
    )
    metrics.update(alignment)
    return state, metrics


def uses_sampler_logprobs(config) -> bool:
    """Whether the update takes its ratio against the sampler's recorded logprobs instead of rescoring the
    rollouts with the trainer's weights (`algorithm.old_logprobs`). `auto` skips the pass only where both
    are the same function of the same weights on the same devices, so they differ by float rounding alone
    (~1e-6 in float32): on-policy, float32 throughout, one device of this process, no critic (whose
    values need the pass anyway). Stale rollouts, bf16 (sampler/trainer mismatch ~1e-2), a mesh or Ray
    workers (other reduction orders, other hardware) recompute."""
    choice = config.algorithm.old_logprobs
    if choice != "auto":
        return choice == "sampler"
    m, r = config.model, config.rollout
    return (
        r.max_staleness == 0
        and m.dtype == "float32"
        and m.resolved_compute_dtype == "float32"
        and m.mesh.fsdp * m.mesh.tp == 1
        and r.task_runner == "threads"
        and config.algorithm.value.head == "none"
        and jax.process_count() == 1
    )


def starting_params(
    config, policy, tokenizer, verifier: str, prompts, answers, targets, report=None
) -> tuple[dict, dict]:
    """(the iteration-0 parameters, warm-start info): a checkpoint (`model.path`) is the starting
    policy as is; otherwise the supervised warm start on (prompts, answers, targets), its greedy
    accuracy judged by `verifier` (a key of spotrl.rewards.verifiers.VERIFIERS)."""
    start = pretrained_start if config.model.path else supervised_warm_start
    return start(
        policy,
        tokenizer,
        verifier,
        prompts,
        answers,
        targets,
        config.warmstart,
        seed=config.seed,
        max_new_tokens=config.rollout.max_new_tokens,
        report=report,
    )


def made_under(config) -> dict:
    """The identity a checkpoint records, so a resume under another config is refused even when
    RUN/config.yaml is gone (flows/resume.py names the differing keys from it)."""
    return {"config_digest": config.digest(), "config": config.model_dump(mode="json")}


def initial_metadata(config, data_sha256: str, warmstart: dict) -> dict:
    """The metadata of the iteration-0 checkpoint (the warm start)."""
    return {
        **made_under(config),
        "iteration": 0,
        "seed": config.seed,
        "data_cursor": 0,
        "data_sha256": data_sha256,
        "optimizer_steps": 0,
        "rollout_weights_versions": [],
        "rng": next_iteration_streams(config.seed, 0),
        "warmstart": warmstart,
    }


def checkpoint_metadata(config, iteration: int, before: dict, optimizer_steps: int, weights_versions) -> dict:
    """With the arrays, everything that decides the future of the run: the metadata of iteration
    `iteration`'s checkpoint, continuing `before` (the previous checkpoint's)."""
    versions = sorted({int(v) for v in weights_versions})
    return {
        **made_under(config),
        "iteration": iteration,
        "seed": config.seed,
        "data_cursor": iteration * config.rollout.prompts_per_iteration,  # prompts consumed so far
        "data_sha256": before["data_sha256"],
        "optimizer_steps": before["optimizer_steps"] + optimizer_steps,
        "rollout_weights_versions": before["rollout_weights_versions"] + [[iteration, versions]],
        "rng": next_iteration_streams(config.seed, iteration),
    }
