"""The trainer's update on a sampled batch: which logprobs the ratio is taken against."""

import jax
import numpy as np
import pytest

from spotrl.config import RunConfig
from spotrl.configs import build_config
from spotrl.problems import get_problem
from spotrl.rl.batch import training_batch
from spotrl.rl.iteration_update import update_on_batch, uses_sampler_logprobs
from spotrl.rl.train_step import make_optimizer
from spotrl.rollout.completions import LoadedPolicy, completions_frame, sample_completions
from spotrl.rollout.sampler import SamplingParams
from spotrl.tasks.context import RunContext


@pytest.mark.parametrize(
    ("overrides", "sampler"),
    [
        ([], True),  # the default: on-policy, float32, threads, no critic
        (["algorithm.old_logprobs=recompute"], False),
        (["rollout.max_staleness=1", "weights.keep=3"], False),  # stale rollouts: importance weights need the pass
        (["model.compute_dtype=bfloat16"], False),  # bf16 sampler/trainer mismatch is ~1e-2, not rounding
        (["model.dtype=bfloat16"], False),
        (["rollout.task_runner=ray"], False),  # sampled in another process, maybe on other hardware
        (["algorithm.name=ppo"], False),  # the critic's values need the pass
        (["algorithm.old_logprobs=sampler", "algorithm.name=ppo"], True),  # told: the ratio uses the sampler's
    ],
)
def test_auto_takes_the_samplers_logprobs_only_where_they_differ_by_rounding(overrides, sampler):
    assert uses_sampler_logprobs(build_config(None, overrides)) is sampler


def test_sampler_logprobs_with_stale_rollouts_are_refused_at_construction():
    with pytest.raises(ValueError, match="old_logprobs 'sampler' needs rollout.max_staleness 0"):
        build_config(None, ["algorithm.old_logprobs=sampler", "rollout.max_staleness=1"])


def _batch(ctx: RunContext, config: RunConfig):
    """A real on-policy batch: the built-in model's samples of training prompts, with rewards that vary."""
    r, problem = config.rollout, get_problem(config.problem.name)
    prompts = problem.builtin_splits(config.problem, config.seed)[0].head(r.prompts_per_iteration)
    sampling = SamplingParams(
        max_new_tokens=r.max_new_tokens,
        stop_token=ctx.tokenizer.eos_id,
        pad_token=ctx.tokenizer.pad_id,
        temperature=r.temperature,
        stop_tokens=ctx.tokenizer.stop_ids,
    )
    policy = LoadedPolicy(ctx.policy.graphdef, ctx.policy.to_state(ctx.policy.init_state), ctx.tokenizer)
    completions = sample_completions(policy, list(prompts["prompt"]), r.group_size, sampling, jax.random.key(3))
    frame = completions_frame(prompts, completions, r.group_size, weights_version=0)
    frame["reward"] = (np.arange(len(frame)) % 3 == 0).astype(np.float32)  # every group has signal
    return training_batch(
        frame, 1, group_size=r.group_size, prompts=r.prompts_per_iteration, max_staleness=0, dynamic_sampling=False
    )


@pytest.mark.slow  # compiles a sampler, a scoring pass and a train step
def test_the_samplers_logprobs_give_the_recomputed_update_up_to_rounding(tmp_path):
    small = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=2", "problem.train_size=64"]
    config = build_config(None, small + ["rollout.prompts_per_iteration=8", "algorithm.old_logprobs=recompute"])
    ctx = RunContext(tmp_path, config)  # one model, one batch, one optimizer: only the choice differs
    batch, optimizer = _batch(ctx, config), make_optimizer(**config.optimizer.model_dump())
    before = jax.tree.map(np.array, ctx.policy.init_state)
    results = {}
    for choice in ("recompute", "sampler"):
        chosen = config.model_copy(update={"algorithm": config.algorithm.model_copy(update={"old_logprobs": choice})})
        state, metrics = update_on_batch(
            chosen,
            1,
            ctx.initial_train_state(jax.tree.map(np.array, before)),
            batch,
            tokenizer=ctx.tokenizer,
            graphdef=ctx.policy.graphdef,
            optimizer=optimizer,
        )
        results[choice] = (jax.tree.map(np.array, state["params"]), metrics)
    (recomputed, m_recompute), (sampled, m_sampler) = results["recompute"], results["sampler"]
    moved = max(np.abs(a - b).max() for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(recomputed)))
    apart = max(np.abs(a - b).max() for a, b in zip(jax.tree.leaves(recomputed), jax.tree.leaves(sampled)))
    assert moved > 1e-4  # the update did something
    assert apart < 1e-3 * moved  # ... and the two sources of old logprobs agree on it up to float rounding
    assert m_recompute["logprob_max_abs_diff"] < 1e-4  # measured where the pass ran
    assert "logprob_max_abs_diff" not in m_sampler  # not claimed where it did not
    assert m_sampler["loss"] == pytest.approx(m_recompute["loss"], abs=1e-5)
