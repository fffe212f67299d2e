"""Advantage estimators and GAE on small cases computed by hand (expected numbers written out)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spotrl.rl.advantages import (
    ADVANTAGE_ESTIMATORS,
    PER_TOKEN_ADVANTAGE_ESTIMATORS,
    discounted_returns,
    gae,
    masked_whiten,
    std,
)


def test_registry_names_and_one_signature():
    # REINFORCE++ has only a per-token form (one convention with or without a KL in the reward)
    assert {"grpo", "dr_grpo", "rloo"} <= set(ADVANTAGE_ESTIMATORS.names())
    assert not {"reinforce_pp", "reinforce_pp_baseline"} & set(ADVANTAGE_ESTIMATORS.names())
    rewards = jnp.array([[1.0, 0.0, 2.0], [0.0, 0.0, 1.0]])
    for name in ADVANTAGE_ESTIMATORS.names():
        fn = ADVANTAGE_ESTIMATORS[name]
        eager = fn(rewards, eps=1e-4, ddof=1)
        jitted = jax.jit(lambda r: fn(r, eps=1e-4, ddof=0))(rewards)
        assert eager.shape == rewards.shape
        if name != "grpo":  # only GRPO divides by a std
            np.testing.assert_allclose(eager, jitted, rtol=1e-6, atol=1e-7)


def test_std_by_hand():
    x = jnp.array([[1.0, 2.0, 3.0, 100.0]])
    w = jnp.array([[1, 1, 1, 0]])
    # valid 1, 2, 3: squares of deviations sum 2 -> sample std sqrt(2/2) = 1, population sqrt(2/3)
    np.testing.assert_allclose(std(x, weights=w), 1.0, rtol=1e-6)
    np.testing.assert_allclose(std(x, ddof=0, weights=w), 0.8164966, rtol=1e-6)
    np.testing.assert_allclose(std(x[:, :3], axis=-1), np.std(np.array([[1.0, 2, 3]]), axis=-1, ddof=1), rtol=1e-6)
    assert float(std(jnp.array([7.0]))) == 0.0  # one entry: 0, not NaN


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


# REINFORCE++ case: groups of 2, rewards 1, 0 | 1, 1 with 1, 3 | 2, 2 completion tokens
RPP_REWARDS = np.array([1.0, 0.0, 1.0, 1.0], np.float32)
RPP_MASK = np.array([[1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 1, 0]], bool)


def test_reinforce_pp_whitens_over_the_batchs_tokens():
    # gamma 1, no KL: every token's return is its sequence's reward; 8 tokens, five 1s and three 0s
    # (each sequence weighs its length, as in verl and OpenRLHF): mean .625, deviations .375 (x5),
    # -.625 (x3), squares sum 1.875, sample std sqrt(1.875 / 7) = .5175492 ->
    # .375 / .5175492 = .7245688, -.625 / .5175492 = -1.2076147; the unanimous group [1,1] is NOT zeroed
    fn = PER_TOKEN_ADVANTAGE_ESTIMATORS["reinforce_pp"]
    adv, returns = fn(jnp.asarray(RPP_REWARDS), RPP_MASK, group_size=2, eps=0.0)
    a, b = 0.7245688, -1.2076147
    np.testing.assert_allclose(adv, [[a, 0, 0], [b, b, b], [a, a, 0], [a, a, 0]], rtol=1e-6, atol=1e-7)
    assert returns is None
    # population std sqrt(1.875 / 8) = .4841229: .375 / .4841229 = .7745967
    adv, _ = fn(jnp.asarray(RPP_REWARDS), RPP_MASK, group_size=2, eps=0.0, ddof=0)
    np.testing.assert_allclose(adv[0, 0], 0.7745967, rtol=1e-6)


def test_reinforce_pp_is_one_convention_with_or_without_kl_in_the_reward():
    from spotrl.rl.update import AdvantageSpec, compute_advantages

    rng = np.random.default_rng(0)
    old, ref = rng.normal(-1, 0.5, (2, 4, 3)).astype(np.float32)
    no_kl, _ = compute_advantages(AdvantageSpec("reinforce_pp", 2), RPP_REWARDS, RPP_MASK)
    kl_coef_0, _ = compute_advantages(
        AdvantageSpec("reinforce_pp", 2, kl_in_reward_coef=0.0), RPP_REWARDS, RPP_MASK, old, ref
    )
    fn = PER_TOKEN_ADVANTAGE_ESTIMATORS["reinforce_pp"]
    kl_given_coef_0, _ = fn(jnp.asarray(RPP_REWARDS), RPP_MASK, group_size=2, kl=jnp.asarray(old - ref), kl_coef=0.0)
    np.testing.assert_array_equal(no_kl, kl_coef_0)
    np.testing.assert_array_equal(no_kl, kl_given_coef_0)
    # the run's eps 1e-4: .375 / (.5175492 + 1e-4) = .7244288
    np.testing.assert_allclose(no_kl[0, 0], 0.7244288, rtol=1e-6)

    # with a KL in the reward, the same whitening (token weights, sample std, the same eps):
    # rewards 1, 0 with masks [1, 1], [1, 0]; k1 = .5, 1 | 2 (the 9 is padding), coef .1
    # per-token rewards [-.05, 1 - .1] | [-.2] -> returns [.85, .9] | [-.2]; mean 1.55 / 3 = .5166667,
    # deviations .3333333, .3833333, -.7166667, squares sum .7716667, std sqrt(.7716667 / 2) = .6211548
    adv, _ = fn(
        jnp.array([1.0, 0.0]),
        np.array([[1, 1], [1, 0]], bool),
        group_size=2,
        kl=jnp.array([[0.5, 1.0], [2.0, 9.0]]),
        kl_coef=0.1,
        eps=0.0,
    )
    np.testing.assert_allclose(adv, [[0.5366349, 0.6171301], [-1.1537649, 0.0]], rtol=1e-5, atol=1e-7)


def test_reinforce_pp_baseline_centres_per_group_then_whitens_per_batch():
    # centred: [.5, -.5], [0, 0]; tokens .5 (x1), -.5 (x3), 0 (x4): mean -.125, deviations .625,
    # -.375 (x3), .125 (x4), squares sum .390625 + .421875 + .0625 = .875, std sqrt(.875 / 7) = .3535534
    adv, _ = PER_TOKEN_ADVANTAGE_ESTIMATORS["reinforce_pp_baseline"](
        jnp.asarray(RPP_REWARDS), RPP_MASK, group_size=2, eps=0.0
    )
    a, b, c = 0.625 / 0.3535534, -0.375 / 0.3535534, 0.125 / 0.3535534
    np.testing.assert_allclose(adv, [[a, 0, 0], [b, b, b], [c, c, 0], [c, c, 0]], rtol=1e-6, atol=1e-7)


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
    # valid 1,2,3: mean 2, sample std 1 (population sqrt(2/3) = .8164966); the 100 is padding
    x, mask = jnp.array([[1.0, 2.0, 3.0, 100.0]]), jnp.array([[1, 1, 1, 0]])
    np.testing.assert_allclose(masked_whiten(x, mask, eps=0.0), [[-1.0, 0.0, 1.0, 0.0]], rtol=1e-6, atol=1e-7)
    out = masked_whiten(x, mask, eps=0.0, ddof=0)
    np.testing.assert_allclose(out, [[-1.2247449, 0.0, 1.2247449, 0.0]], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(masked_whiten(x, mask, eps=1.0)[0, 0], -0.5, rtol=1e-6)  # -1 / (1 + 1)


def test_every_advantage_has_one_lookup_and_gae_is_registered():
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
