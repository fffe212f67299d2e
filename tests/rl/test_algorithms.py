"""Every algorithm preset trains the built-in problem: its mean reward rises over a short run.

One warm start is shared: it is written once, then each preset's run directory is seeded with it
(checkpoint 0 with the preset's train state, weights version 0, the data), so the flow resumes
after iteration 0 and runs only RL. The prompt set is small and fixed (32 prompts, all of them
every iteration), so improvement shows in a few iterations instead of hundreds.
"""

import numpy as np
import pandas as pd
import pytest
from support import LEARNING_OVERRIDES

from spotrl.algorithm_presets import ALGORITHMS
from spotrl.configs import build_config
from spotrl.flows import rundir
from spotrl.flows.resume import seed_from_warm_start
from spotrl.rl.batch import training_batch
from spotrl.storage.records import read_jsonl

ITERATIONS = 14


@pytest.fixture(scope="module")
def warm_start_run(prefect_harness, tmp_path_factory):
    from spotrl.flows.train import train

    run_dir = tmp_path_factory.mktemp("warm") / "run"
    config = build_config(None, LEARNING_OVERRIDES + ["iterations=0"])
    train(config=config, run_dir=str(run_dir))
    return run_dir, config


@pytest.mark.slow
@pytest.mark.parametrize("name", ALGORITHMS)
def test_preset_raises_mean_reward(name, warm_start_run, tmp_path):
    from spotrl.flows.train import train

    warm_dir, _ = warm_start_run
    config = build_config(None, LEARNING_OVERRIDES + [f"iterations={ITERATIONS}", f"algorithm.name={name}"])
    run_dir = tmp_path / name
    seed_from_warm_start(run_dir, config, warm_dir)
    train(config=config, run_dir=str(run_dir))

    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["iteration"] for m in metrics] == list(range(1, ITERATIONS + 1))  # resumed after the warm start
    rewards = [m["reward_mean"] for m in metrics]
    first, last = np.mean(rewards[:3]), np.mean(rewards[-3:])
    assert last > first + 0.1, (name, rewards)

    if name == "ppo":  # on-policy with a critic: the pass runs, and its logprobs are the sampler's (alignment)
        assert max(m["logprob_max_abs_diff"] for m in metrics) < 1e-4
        assert all(abs(m["importance_ratio_mean"] - 1) < 1e-5 and m["staleness"] == 0 for m in metrics)
    if name == "grpo":  # on-policy in float32 without a critic: the ratio is taken against the sampler's logprobs
        assert all("logprob_max_abs_diff" not in m for m in metrics)
    keys = metrics[-1].keys()
    if name == "rft":  # the supervised step on the verified samples: no ratio, no advantage
        assert {"loss", "kept_fraction", "kept_rows"} <= keys and "clip_frac" not in keys
        return
    assert {"loss", "clip_frac_low", "clip_frac_high", "entropy", "advantage_mean", "advantage_std"} <= keys
    if name == "ppo":
        assert {"value_loss", "explained_variance"} <= keys
        # the critic (zero-initialised) follows the rising returns
        assert metrics[-1]["value_mean"] > metrics[0]["value_mean"] + 0.1
    if name == "reinforce_pp":
        assert "kl" not in keys or metrics[-1]["kl"] >= 0  # KL is in the reward, not the loss
        assert (run_dir / "weights" / "v000000").exists()  # the reference policy is never collected
    if name == "dapo":
        assert all(m["groups_trained"] <= config.rollout.prompts_per_iteration for m in metrics)
        assert sum(m["groups_dropped"] for m in metrics) > 0 and max(m["generation_rounds"] for m in metrics) > 1
        assert all(m["shaped_reward_mean"] <= m["reward_mean"] for m in metrics)  # overlong only subtracts


def test_dynamic_sampling_short_batch_is_padded_with_a_warning():
    config = build_config(
        None, LEARNING_OVERRIDES + ["algorithm.name=dapo", "rollout.prompts_per_iteration=4", "algorithm.minibatches=1"]
    )
    g = config.rollout.group_size
    rewards = np.zeros(3 * g)
    rewards[g : 2 * g : 2] = 1.0  # only the second of three groups has signal
    frame = pd.DataFrame({"reward": rewards, "prompt": [f"p{i // g}" for i in range(3 * g)], "weights_version": 4})
    r = config.rollout
    batch = training_batch(
        frame,
        5,
        group_size=g,
        prompts=r.prompts_per_iteration,
        max_staleness=r.max_staleness,
        dynamic_sampling=config.algorithm.dynamic_sampling.enabled,
    )
    assert len(batch.frame) == 4 * g and batch.real_rows == g
    assert list(batch.frame["prompt"][:g]) == ["p1"] * g
    info = batch.info
    assert info["groups_dropped"] == 2 and info["groups_trained"] == 1 and info["batch_short_groups"] == 3
    assert "only 1 of 4 groups had signal" in batch.warning


@pytest.mark.slow
def test_warm_start_is_shared_only_between_matching_configs(warm_start_run, tmp_path):
    warm_dir, _ = warm_start_run
    other = build_config(None, LEARNING_OVERRIDES + ["iterations=3", "model.num_layers=3"])
    with pytest.raises(rundir.RunDirError, match="other model settings"):
        seed_from_warm_start(tmp_path / "other", other, warm_dir)


@pytest.mark.slow
def test_stale_rollouts_are_importance_corrected_and_still_learn(warm_start_run, tmp_path):
    from spotrl.flows.train import train

    warm_dir, _ = warm_start_run
    config = build_config(None, LEARNING_OVERRIDES + [f"iterations={ITERATIONS}", "rollout.max_staleness=1"])
    run_dir = tmp_path / "stale"
    seed_from_warm_start(run_dir, config, warm_dir)
    train(config=config, run_dir=str(run_dir))
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    # iteration i samples with weights i - 2: one version behind, except at the start
    assert [m["rollout_weights_versions"] for m in metrics] == [[max(0, i - 2)] for i in range(1, ITERATIONS + 1)]
    assert [m["staleness"] for m in metrics] == [0] + [1] * (ITERATIONS - 1)
    assert all(m["rollouts_dropped_stale"] == 0 for m in metrics)
    later = metrics[2:]  # from iteration 3 on the trainer's weights differ from the sampler's
    assert (
        max(m["importance_ratio_max"] for m in later) > 1.001 and min(m["importance_ratio_min"] for m in later) < 0.999
    )
    rewards = [m["reward_mean"] for m in metrics]
    assert np.mean(rewards[-3:]) > np.mean(rewards[:3]) + 0.1, rewards
