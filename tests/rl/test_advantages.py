"""Advantage estimators and GAE on small cases computed by hand (expected numbers written out)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spotrl.rl.advantages import (
    ADVANTAGE_ESTIMATORS,
    discounted_returns,
    gae,
    masked_whiten,
)


def test_registry_names_and_one_signature():
    assert {"grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"} <= set(ADVANTAGE_ESTIMATORS.names())
    rewards = jnp.array([[1.0, 0.0, 2.0], [0.0, 0.0, 1.0]])
    for name in ADVANTAGE_ESTIMATORS.names():
        fn = ADVANTAGE_ESTIMATORS[name]
        eager = fn(rewards, eps=1e-4)
        jitted = jax.jit(lambda r: fn(r, eps=1e-4))(rewards)
        assert eager.shape == rewards.shape
        np.testing.assert_allclose(eager, jitted, rtol=1e-6, atol=1e-7)


def test_dr_grpo_subtracts_group_mean_only():
    # group 1: mean .5 -> +-.5 (GRPO would give +-1); group 2: mean .25
    adv = ADVANTAGE_ESTIMATORS["dr_grpo"](jnp.array([[1.0, 0, 0, 1], [1, 0, 0, 0]]), eps=123.0)
    np.testing.assert_allclose(adv, [[0.5, -0.5, -0.5, 0.5], [0.75, -0.25, -0.25, -0.25]], atol=1e-7)


def test_rloo_leave_one_out_baseline():
    rloo = ADVANTAGE_ESTIMATORS["rloo"]
    # 1 - mean(0,0,0) = 1;  0 - mean(1,0,0) = -1/3
    np.testing.assert_allclose(rloo(jnp.array([[1.0, 0, 0, 0]])), [[1, -1 / 3, -1 / 3, -1 / 3]], rtol=1e-6)
    # 3 - mean(1,2) = 1.5;  1 - mean(3,2) = -1.5;  2 - mean(3,1) = 0
    np.testing.assert_allclose(rloo(jnp.array([[3.0, 1, 2]])), [[1.5, -1.5, 0.0]], atol=1e-6)
    with pytest.raises(ValueError, match="at least 2"):
        rloo(jnp.array([[1.0], [0.0]]))


def test_reinforce_pp_whitens_over_the_whole_batch():
    # all rewards 1,0,1,1: mean .75, population std sqrt(.1875) = .4330127
    # .25/.4330127 = .5773503, -.75/.4330127 = -1.7320508; the unanimous group [1,1] is NOT zeroed
    adv = ADVANTAGE_ESTIMATORS["reinforce_pp"](jnp.array([[1.0, 0.0], [1.0, 1.0]]), eps=0.0)
    np.testing.assert_allclose(adv, [[0.5773503, -1.7320508], [0.5773503, 0.5773503]], rtol=1e-6)


def test_reinforce_pp_baseline_centres_per_group_then_whitens_per_batch():
    # centred: [.5,-.5], [0,0], [1,-1]; batch mean 0, std sqrt(2.5/6) = .6454972
    adv = ADVANTAGE_ESTIMATORS["reinforce_pp_baseline"](jnp.array([[1.0, 0], [1, 1], [2, 0]]), eps=0.0)
    np.testing.assert_allclose(
        adv, [[0.7745967, -0.7745967], [0.0, 0.0], [1.5491933, -1.5491933]], rtol=1e-6, atol=1e-7
    )


def test_gae_by_hand():
    # gamma .9, lam .8 (gamma*lam = .72), V after the end = 0
    # t2: delta = 1 - .7 = .3                       A2 = .3
    # t1: delta = .9*.7 - .6 = .03                  A1 = .03 + .72*.3   = .246
    # t0: delta = .9*.6 - .5 = .04                  A0 = .04 + .72*.246 = .21712
    rewards = jnp.array([[0.0, 0.0, 1.0]])
    values = jnp.array([[0.5, 0.6, 0.7]])
    adv, ret = gae(rewards, values, jnp.ones((1, 3)), 0.9, 0.8)
    np.testing.assert_allclose(adv, [[0.21712, 0.246, 0.3]], rtol=1e-6)
    np.testing.assert_allclose(ret, [[0.71712, 0.846, 1.0]], rtol=1e-6)
    # lam = 0: one-step TD errors;  gamma = lam = 1: reward-to-go minus value
    adv, _ = gae(rewards, values, jnp.ones((1, 3)), 0.9, 0.0)
    np.testing.assert_allclose(adv, [[0.04, 0.03, 0.3]], rtol=1e-5)
    adv, ret = gae(rewards, values, jnp.ones((1, 3)), 1.0, 1.0)
    np.testing.assert_allclose(adv, [[0.5, 0.4, 0.3]], rtol=1e-6)
    np.testing.assert_allclose(ret, [[1.0, 1.0, 1.0]], rtol=1e-6)


def test_gae_right_padding_is_the_end_of_the_episode():
    # same row as above, padded with a reward and values that must be ignored
    rewards = jnp.array([[0.0, 0.0, 1.0, 5.0, 5.0]])
    values = jnp.array([[0.5, 0.6, 0.7, 99.0, 99.0]])
    adv, ret = gae(rewards, values, jnp.array([[1, 1, 1, 0, 0]]), 0.9, 0.8)
    np.testing.assert_allclose(adv, [[0.21712, 0.246, 0.3, 0, 0]], rtol=1e-6)
    np.testing.assert_allclose(ret, [[0.71712, 0.846, 1.0, 0, 0]], rtol=1e-6)


def test_gae_skips_masked_tokens_inside_a_row():
    # a masked token (e.g. tool output) between t0 and t1 is skipped, not a time step
    rewards = jnp.array([[0.0, 7.0, 0.0, 1.0]])
    values = jnp.array([[0.5, 42.0, 0.6, 0.7]])
    adv, ret = gae(rewards, values, jnp.array([[1, 0, 1, 1]]), 0.9, 0.8)
    np.testing.assert_allclose(adv, [[0.21712, 0.0, 0.246, 0.3]], rtol=1e-6)
    np.testing.assert_allclose(ret, [[0.71712, 0.0, 0.846, 1.0]], rtol=1e-6)


def _gae_reference(rewards, values, mask, gamma, lam):
    """Naive loops: walk each row's valid positions backwards."""
    adv = np.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        steps = [t for t in range(rewards.shape[1]) if mask[b, t]]
        next_value, next_adv = 0.0, 0.0
        for t in reversed(steps):
            delta = rewards[b, t] + gamma * next_value - values[b, t]
            adv[b, t] = delta + gamma * lam * next_adv
            next_value, next_adv = values[b, t], adv[b, t]
    return adv, np.where(mask, adv + values, 0.0)


def test_gae_matches_naive_loop():
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=(4, 7)).astype(np.float32)
    values = rng.normal(size=(4, 7)).astype(np.float32)
    mask = np.array([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0, 0], [1, 0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0, 0]], bool)
    for gamma, lam in [(1.0, 1.0), (0.99, 0.95), (0.5, 0.0)]:
        adv, ret = gae(jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(mask), gamma, lam)
        ref_adv, ref_ret = _gae_reference(rewards, values, mask, gamma, lam)
        np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ret, ref_ret, rtol=1e-5, atol=1e-6)


def test_gae_is_jittable_and_a_target():
    rewards, values, mask = jnp.ones((2, 3)), jnp.zeros((2, 3)), jnp.ones((2, 3))
    adv, _ = jax.jit(gae, static_argnums=(3, 4))(rewards, values, mask, 1.0, 1.0)
    np.testing.assert_allclose(adv, [[3, 2, 1], [3, 2, 1]], rtol=1e-6)
    g = jax.grad(lambda v: gae(rewards, v, mask, 1.0, 1.0)[0].sum())(values)
    np.testing.assert_array_equal(g, 0.0)  # stop-gradient: advantages are fixed targets


def test_discounted_returns():
    # gamma .5: [0 + .5*(0 + .5*1), 0 + .5*1, 1] = [.25, .5, 1]; padding ignored
    out = discounted_returns(jnp.array([[0.0, 0.0, 1.0, 3.0]]), jnp.array([[1, 1, 1, 0]]), 0.5)
    np.testing.assert_allclose(out, [[0.25, 0.5, 1.0, 0.0]], rtol=1e-6)


def test_masked_whiten():
    # valid 1,2,3: mean 2, population std sqrt(2/3) = .8164966; the 100 is padding
    out = masked_whiten(jnp.array([[1.0, 2.0, 3.0, 100.0]]), jnp.array([[1, 1, 1, 0]]), eps=0.0)
    np.testing.assert_allclose(out, [[-1.2247449, 0.0, 1.2247449, 0.0]], rtol=1e-6, atol=1e-7)


def test_every_advantage_has_one_lookup_and_gae_is_registered():
    from spotrl.rl.advantages import PER_TOKEN_ADVANTAGE_ESTIMATORS
    from spotrl.rl.shaping import token_level_rewards
    from spotrl.rl.update import AdvantageSpec, compute_advantages

    assert PER_TOKEN_ADVANTAGE_ESTIMATORS.names() == ["gae", "reinforce_pp", "reinforce_pp_baseline"]
    assert "gae" not in ADVANTAGE_ESTIMATORS and AdvantageSpec("gae", 2).per_token
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=4).astype(np.float32)
    mask = np.array([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]], bool)
    values = rng.normal(size=(4, 3)).astype(np.float32)
    adv, returns = compute_advantages(AdvantageSpec("gae", 2, gamma=0.9, lam=0.8), rewards, mask, old_values=values)
    want_adv, want_returns = gae(token_level_rewards(jnp.asarray(rewards), mask), jnp.asarray(values), mask, 0.9, 0.8)
    np.testing.assert_array_equal(adv, masked_whiten(want_adv, mask))  # bit-identical to the composition
    np.testing.assert_array_equal(returns, want_returns)
    with pytest.raises(ValueError, match="has no per-token form"):
        compute_advantages(AdvantageSpec("grpo", 2, kl_in_reward_coef=0.1), rewards, mask, values, values)
