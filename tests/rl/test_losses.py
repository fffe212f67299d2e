import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spotrl.rl.advantages import ADVANTAGE_ESTIMATORS, group_normalized_advantages
from spotrl.rl.losses import clipped_policy_loss, token_entropy, token_logprobs


def test_group_advantages_population_std_by_hand():
    # advantage_std "population" (ddof 0):
    # group 1: rewards 1,0,0,1 -> mean 0.5, population std 0.5 -> +-1 (eps 0)
    # group 2: all equal -> 0
    # group 3: 1,0,0,0 -> mean .25, std sqrt(.1875)=.4330127 -> 1.7320508, -0.5773503
    rewards = jnp.array([[1.0, 0, 0, 1], [1, 1, 1, 1], [1, 0, 0, 0]])
    adv = group_normalized_advantages(rewards, eps=0.0 + 1e-12, ddof=0)
    np.testing.assert_allclose(adv[0], [1, -1, -1, 1], atol=1e-6)
    np.testing.assert_allclose(adv[1], [0, 0, 0, 0], atol=1e-6)
    np.testing.assert_allclose(adv[2], [1.7320508, -0.5773503, -0.5773503, -0.5773503], atol=1e-6)
    assert ADVANTAGE_ESTIMATORS["grpo"] is group_normalized_advantages


def test_group_advantages_sample_std_g2_by_hand():
    # the default, ddof 1 as verl and TRL. G = 2, rewards 1, 0: mean .5, deviations +-.5,
    # sample variance (.25 + .25) / 1 = .5, std .7071068 -> +-.5 / .7071068 = +-.7071068
    # (the population std .5 gives +-1: sqrt 2 = 1.41 times larger, the 41% of issue 20);
    # rewards 3, 1: deviations +-1, std sqrt 2 -> +-.7071068; a unanimous group -> 0
    adv = group_normalized_advantages(jnp.array([[1.0, 0.0], [3.0, 1.0], [2.0, 2.0]]), eps=1e-12)
    np.testing.assert_allclose(adv, [[0.7071068, -0.7071068], [0.7071068, -0.7071068], [0, 0]], atol=1e-6)
    # eps in the denominator: .5 / (.7071068 + .5) = .4142136
    adv = group_normalized_advantages(jnp.array([[1.0, 0.0]]), eps=0.5)
    np.testing.assert_allclose(adv, [[0.4142136, -0.4142136]], atol=1e-6)


def test_group_advantages_sample_std_g8_by_hand():
    # G = 8, three of eight solved: mean .375, deviations .625 (x3) and -.375 (x5),
    # squares sum 3 * .390625 + 5 * .140625 = 1.875; sample variance 1.875 / 7 = .2678571,
    # std .5175492 -> .625 / .5175492 = 1.2076147, -.375 / .5175492 = -.7245688
    # (population: std sqrt(1.875 / 8) = .4841229 -> 1.2909944, -.7745967: sqrt(8/7) = 1.069 apart)
    rewards = jnp.array([[1.0, 1, 1, 0, 0, 0, 0, 0]])
    np.testing.assert_allclose(
        group_normalized_advantages(rewards, eps=1e-12), [[1.2076147] * 3 + [-0.7245688] * 5], rtol=1e-6
    )
    np.testing.assert_allclose(
        group_normalized_advantages(rewards, eps=1e-12, ddof=0), [[1.2909944] * 3 + [-0.7745967] * 5], rtol=1e-6
    )
    # the eps the run uses (1e-4): .625 / (.5175492 + 1e-4) = 1.2073814
    np.testing.assert_allclose(group_normalized_advantages(rewards)[0, 0], 1.2073814, rtol=1e-6)


def test_group_of_one_gets_advantage_zero_not_nan():
    # one sample has no sample std (n - 1 = 0): its advantage is 0, as for a unanimous group
    np.testing.assert_array_equal(group_normalized_advantages(jnp.array([[5.0], [2.0]])), [[0.0], [0.0]])


def test_clipped_loss_by_hand():
    # ratios e^{ln 1.5}=1.5, e^{ln .5}=.5, 1.0 and a masked token; eps=0.2
    logp = jnp.log(jnp.array([[1.5, 0.5, 1.0, 7.0]]))
    old = jnp.zeros((1, 4))
    mask = jnp.array([[1, 1, 1, 0]])
    # A=+2: token1 min(3.0, 1.2*2=2.4)=2.4 (clipped); token2 min(1.0, .8*2=1.6)=1.0; token3 2.0
    loss, m = clipped_policy_loss(logp, old, jnp.array([2.0]), mask, 0.2)
    np.testing.assert_allclose(loss, -(2.4 + 1.0 + 2.0) / 3, rtol=1e-6)
    np.testing.assert_allclose(m["clip_frac"], 1 / 3, rtol=1e-6)
    # A=-1: token1 min(-1.5, -1.2)=-1.5; token2 min(-.5, -.8)=-.8 (clipped); token3 -1
    loss, m = clipped_policy_loss(logp, old, jnp.array([-1.0]), mask, 0.2)
    np.testing.assert_allclose(loss, (1.5 + 0.8 + 1.0) / 3, rtol=1e-6)
    np.testing.assert_allclose(m["clip_frac"], 1 / 3, rtol=1e-6)
    np.testing.assert_allclose(m["ratio_mean"], (1.5 + 0.5 + 1.0) / 3, rtol=1e-6)


def test_on_policy_gradient_is_advantage_weighted_logprob_gradient():
    """At ratio 1 the clipped loss's gradient equals that of -mean(A * logp)."""
    logp = jnp.array([[-0.3, -1.2], [-0.7, -0.1]])
    adv, mask = jnp.array([1.5, -0.5]), jnp.ones((2, 2))
    g = jax.grad(lambda lp: clipped_policy_loss(lp, jax.lax.stop_gradient(logp), adv, mask, 0.2)[0])(logp)
    expected = -(adv[:, None] * jnp.ones((2, 2))) / 4
    np.testing.assert_allclose(g, expected, rtol=1e-6)


def test_token_logprobs_with_temperature():
    logits = jnp.array([[2.0, 0.0, -1.0]])
    lp = token_logprobs(logits, jnp.array([0]), temperature=2.0)
    scaled = np.array([1.0, 0.0, -0.5])
    expected = scaled[0] - np.log(np.exp(scaled).sum())
    np.testing.assert_allclose(lp, [expected], rtol=1e-6)


def test_empty_mask_gives_zero_loss_not_nan():
    loss, _ = clipped_policy_loss(jnp.zeros((1, 2)), jnp.zeros((1, 2)), jnp.array([1.0]), jnp.zeros((1, 2)), 0.2)
    assert float(loss) == 0.0 and not np.isnan(float(loss))


# --- the policy_loss template ---------------------------------------------------------------------

from spotrl.rl.losses import (  # noqa: E402
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    LossSpec,
    explained_variance,
    policy_loss,
    value_loss,
)


def test_clip_higher_token_ratio_by_hand():
    # ratios 1.25, 1.35, .75, .85; clip range [1 - .2, 1 + .3] = [.8, 1.3]
    logp = jnp.log(jnp.array([[1.25, 1.35, 0.75, 0.85]]))
    old, mask = jnp.zeros((1, 4)), jnp.ones((1, 4))
    spec = LossSpec(clip_low=0.2, clip_high=0.3)
    # A=+1: 1.25, min(1.35, 1.3)=1.3 (high clip), min(.75, .8)=.75, .85 -> sum 4.15
    loss, m = policy_loss(logp, old, jnp.array([1.0]), mask, spec)
    np.testing.assert_allclose(loss, -4.15 / 4, rtol=1e-6)
    np.testing.assert_allclose([m["clip_frac_low"], m["clip_frac_high"], m["clip_frac"]], [0, 0.25, 0.25], atol=1e-7)
    # A=-1: -1.25, min(-1.35, -1.3)=-1.35, min(-.75, -.8)=-.8 (low clip), -.85 -> sum -4.25
    loss, m = policy_loss(logp, old, jnp.array([-1.0]), mask, spec)
    np.testing.assert_allclose(loss, 4.25 / 4, rtol=1e-6)
    np.testing.assert_allclose([m["clip_frac_low"], m["clip_frac_high"]], [0.25, 0], atol=1e-7)
    np.testing.assert_allclose(m["pg_loss"], loss, rtol=1e-6)
    np.testing.assert_allclose(m["ratio_mean"], (1.25 + 1.35 + 0.75 + 0.85) / 4, rtol=1e-6)
    # per-token advantages [+1, -1, +1, -1]: 1.25 - 1.35 + .75 - .85 = -.2, nothing clipped
    loss, m = policy_loss(logp, old, jnp.array([[1.0, -1.0, 1.0, -1.0]]), mask, spec)
    np.testing.assert_allclose(loss, 0.2 / 4, rtol=1e-5)
    assert float(m["clip_frac"]) == 0.0
    # clip_high=None is the symmetric clip [.8, 1.2]: 1.2 + 1.2 + .75 + .85 = 4.0
    loss, m = policy_loss(logp, old, jnp.array([1.0]), mask, LossSpec(clip_low=0.2, clip_high=None))
    np.testing.assert_allclose(loss, -1.0, rtol=1e-6)
    np.testing.assert_allclose(m["clip_frac_high"], 0.5, rtol=1e-6)


def test_dual_clip_by_hand():
    # ratios 4, 2, .5; clip .2; dual clip c = 3
    logp = jnp.log(jnp.array([[4.0, 2.0, 0.5]]))
    old, mask = jnp.zeros((1, 3)), jnp.ones((1, 3))
    # A=-1: max(min(-4, -1.2), -3) = -3 (dual);  min(-2, -1.2) = -2;  min(-.5, -.8) = -.8 (low clip)
    loss_fn = lambda lp, a: policy_loss(lp, old, a, mask, LossSpec(clip_low=0.2, dual_clip=3.0))  # noqa: E731
    loss, m = loss_fn(logp, jnp.array([-1.0]))
    np.testing.assert_allclose(loss, 5.8 / 3, rtol=1e-6)
    np.testing.assert_allclose(
        [m["dual_clip_frac"], m["clip_frac_low"], m["clip_frac_high"]], [1 / 3, 1 / 3, 0], atol=1e-7
    )
    # a dual-clipped or clipped token gets no gradient; the free token gets -A * r / 3 = 2/3
    g = jax.grad(lambda lp: loss_fn(lp, jnp.array([-1.0]))[0])(logp)
    np.testing.assert_allclose(g, [[0.0, 2.0 / 3, 0.0]], atol=1e-6)
    # A=+1: the dual clip does not apply: min(4, 1.2) + min(2, 1.2) + .5 = 2.9
    loss, m = loss_fn(logp, jnp.array([1.0]))
    np.testing.assert_allclose(loss, -2.9 / 3, rtol=1e-6)
    np.testing.assert_allclose([m["dual_clip_frac"], m["clip_frac_high"]], [0, 2 / 3], atol=1e-7)
    with pytest.raises(ValueError, match="dual_clip"):
        policy_loss(logp, old, jnp.array([1.0]), mask, LossSpec(dual_clip=1.0))


def _gspo_case():
    # row 0: valid log ratios ln2, 0 (the 50 is padding) -> s0 = exp(ln2 / 2) = sqrt 2 = 1.4142136
    # row 1: log ratios .1, -.4, 0 -> mean -.1 -> s1 = exp(-.1) = .9048374
    logp = jnp.array([[jnp.log(2.0), 0.0, 50.0], [0.1, -0.4, 0.0]])
    mask = jnp.array([[1, 1, 0], [1, 1, 1]])
    return logp, jnp.zeros((2, 3)), jnp.array([1.0, -1.0]), mask


def test_sequence_ratio_gspo_by_hand():
    logp, old, adv, mask = _gspo_case()
    # clip .2: row 0 min(1.414, 1.2) = 1.2 (high clip); row 1 min(-.9048, -.9048) = -.9048374
    loss, m = policy_loss(
        logp, old, adv, mask, LossSpec(ratio_level="sequence", clip_low=0.2, aggregation="seq_mean_token_mean")
    )
    np.testing.assert_allclose(loss, (-1.2 + 0.9048374) / 2, rtol=1e-6)
    # token_mean weighs row 0 by its 2 tokens and row 1 by its 3: (-2.4 + 3 * .9048374) / 5
    loss, m = policy_loss(logp, old, adv, mask, LossSpec(ratio_level="sequence", clip_low=0.2))
    np.testing.assert_allclose(loss, (-2.4 + 3 * 0.9048374) / 5, rtol=1e-6)
    np.testing.assert_allclose([m["clip_frac_high"], m["clip_frac_low"]], [0.4, 0.0], atol=1e-7)
    np.testing.assert_allclose(m["ratio_mean"], (2 * 1.4142136 + 3 * 0.9048374) / 5, rtol=1e-6)
    assert np.isfinite(float(m["approx_kl"]))  # the padding's log ratio 50 never reaches exp
    # a wider clip leaves row 0 free: -(1.4142136 - .9048374) / 2
    loss, _ = policy_loss(
        logp,
        old,
        adv,
        mask,
        LossSpec(ratio_level="sequence", clip_low=0.5, clip_high=None, aggregation="seq_mean_token_mean"),
    )
    np.testing.assert_allclose(loss, -(1.4142136 - 0.9048374) / 2, rtol=1e-6)


def test_sequence_ratio_gradient_is_gspo():
    """d loss / d logp_{i,t} = -A_i s_i / |y_i| / B for unclipped sequences (GSPO's gradient)."""
    logp, old, adv, mask = _gspo_case()
    g = jax.grad(
        lambda lp: policy_loss(
            lp,
            old,
            adv,
            mask,
            LossSpec(ratio_level="sequence", clip_low=0.5, clip_high=None, aggregation="seq_mean_token_mean"),
        )[0]
    )(logp)
    s0, s1 = 1.4142136, 0.9048374
    expected = [[-s0 / 2 / 2, -s0 / 2 / 2, 0.0], [s1 / 3 / 2, s1 / 3 / 2, s1 / 3 / 2]]
    np.testing.assert_allclose(g, expected, rtol=1e-5)


def test_aggregations_by_hand():
    # at ratio 1 the per-token loss is -A; A = 9 on masked tokens must be ignored; row 2 is empty
    adv = jnp.array([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0], [9.0, 9.0, 9.0, 9.0]])
    mask = jnp.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    lp = jnp.zeros((3, 4))

    def loss(aggregation, **kw):
        return float(policy_loss(lp, lp, adv, mask, LossSpec(aggregation=aggregation, **kw))[0])

    np.testing.assert_allclose(loss("token_mean"), -(1 + 2 + 3 + 4) / 4, rtol=1e-6)
    np.testing.assert_allclose(loss("seq_mean_token_mean"), -(2 + 4) / 2, rtol=1e-6)  # row means 2, 4
    # Dr.GRPO as verl: row sums 6, 4 over N = 4 -> 1.5, 1 -> summed over rows 2.5 (not their mean
    # 1.25; the empty row adds nothing either way); with constant 2 -> 3 + 2 = 5
    np.testing.assert_allclose(loss("seq_mean_token_sum_norm"), -2.5, rtol=1e-6)
    np.testing.assert_allclose(loss("seq_mean_token_sum_norm", norm_constant=2.0), -5.0, rtol=1e-6)
    assert {"token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"} <= set(LOSS_AGGREGATIONS.names())
    with pytest.raises(ValueError, match="norm_constant"):
        loss("token_mean", norm_constant=2.0)
    with pytest.raises(ValueError, match="loss aggregation"):
        loss("sum_everything")
    with pytest.raises(ValueError, match="ratio_level"):
        policy_loss(lp, lp, adv, mask, LossSpec(ratio_level="segment"))


def test_kl_estimators_by_hand():
    logp = jnp.array([[-1.0, -2.0]])
    ref = jnp.array([[-1.5, -1.0]])  # d = ref - logp = -.5, 1
    np.testing.assert_allclose(KL_ESTIMATORS["k1"](logp, ref), [[0.5, -1.0]], rtol=1e-6)
    np.testing.assert_allclose(KL_ESTIMATORS["k2"](logp, ref), [[0.125, 0.5]], rtol=1e-6)
    # exp(-.5) + .5 - 1 = .1065307;  e - 1 - 1 = .7182818
    np.testing.assert_allclose(KL_ESTIMATORS["k3"](logp, ref), [[0.1065307, 0.7182818]], rtol=1e-6)


def test_k3_is_clamped_like_verl():
    # d = ref - logp clamped to [-20, 20] before exp, k3 to [-10, 10] after:
    # d = 50 -> 20: e^20 - 21 = 4.85e8 -> 10;  d = -50 -> -20: e^-20 + 19 = 19.000000002 -> 10
    # d = 3: e^3 - 4 = 16.09 -> 10;  d = 2: e^2 - 3 = 4.3890561 and d = -5: e^-5 + 4 = 4.0067379 (unclamped)
    logp = jnp.array([[-50.0, 0.0, -3.0, -2.0, 0.0]])
    ref = jnp.array([[0.0, -50.0, 0.0, 0.0, -5.0]])
    k3 = KL_ESTIMATORS["k3"](logp, ref)
    np.testing.assert_allclose(k3, [[10.0, 10.0, 10.0, 4.3890561, 4.0067379]], rtol=1e-6)
    # without the clamps float32 gives inf for d = 100: e^100 overflows
    k3 = KL_ESTIMATORS["k3"](jnp.array([[-100.0]]), jnp.array([[0.0]]))
    assert np.isfinite(float(k3[0, 0])) and float(k3[0, 0]) == 10.0
    # a clamped token has no gradient (like a clipped one), an unclamped one has e^d... - 1: here -(e^2 - 1)
    g = jax.grad(lambda lp: KL_ESTIMATORS["k3"](lp, ref).sum())(logp)
    np.testing.assert_allclose(g, [[0.0, 0.0, 0.0, -(np.e**2 - 1), -(np.exp(-5.0) - 1)]], rtol=1e-5)


def test_log_ratio_is_clamped_to_20_before_exp():
    # log ratios 100 and -100 at valid tokens: the ratio is e^20 = 4.8516520e8 and e^-20, not inf and 0
    logp = jnp.array([[100.0, -100.0, 0.0]])
    old, mask = jnp.zeros((1, 3)), jnp.ones((1, 3))
    # A = -1, no dual clip: min(-e^20, -1.2) = -e^20;  min(-e^-20, -.8) = -.8;  -1 -> loss (e^20 + 1.8) / 3
    loss, m = policy_loss(logp, old, jnp.array([-1.0]), mask, LossSpec(dual_clip=None))
    np.testing.assert_allclose(loss, (np.exp(20.0) + 1.8) / 3, rtol=1e-6)
    np.testing.assert_allclose(m["ratio_mean"], (np.exp(20.0) + np.exp(-20.0) + 1) / 3, rtol=1e-6)
    # approx_kl is k3 with d = old - logp = -100, 100, 0 -> clamped to 10, 10, 0
    np.testing.assert_allclose(m["approx_kl"], 20 / 3, rtol=1e-6)
    # with the (default) dual clip c = 3: max(-e^20, -3) = -3 -> (3 + .8 + 1) / 3
    loss, m = policy_loss(logp, old, jnp.array([-1.0]), mask)
    np.testing.assert_allclose(loss, 4.8 / 3, rtol=1e-6)
    # the sequence ratio: mean log ratio (100 + 100) / 2 = 100 -> 20; A = +1 clips it at 1.2 anyway
    loss, m = policy_loss(
        jnp.array([[100.0, 100.0]]),
        jnp.zeros((1, 2)),
        jnp.array([1.0]),
        jnp.ones((1, 2)),
        LossSpec(ratio_level="sequence", dual_clip=None),
    )
    np.testing.assert_allclose([loss, m["ratio_mean"]], [-1.2, np.exp(20.0)], rtol=1e-6)
    for x in jax.tree.leaves((loss, m)):
        assert np.isfinite(np.asarray(x)).all()


def test_dual_clip_is_on_by_default_with_c_3():
    from spotrl.config import AlgorithmConfig
    from spotrl.rl.train_step import loss_spec

    # ratio 4 with A = -1: min(-4, -1.2) = -4, dual clip max(-4, -3) = -3 -> loss 3; off: 4
    logp, old, mask = jnp.log(jnp.array([[4.0]])), jnp.zeros((1, 1)), jnp.ones((1, 1))
    np.testing.assert_allclose(policy_loss(logp, old, jnp.array([-1.0]), mask)[0], 3.0, rtol=1e-6)
    np.testing.assert_allclose(
        policy_loss(logp, old, jnp.array([-1.0]), mask, LossSpec(dual_clip=None))[0], 4.0, rtol=1e-6
    )
    assert AlgorithmConfig().dual_clip == 3.0 and LossSpec().dual_clip == 3.0
    assert loss_spec(AlgorithmConfig(), 8).dual_clip == 3.0
    assert loss_spec(AlgorithmConfig(dual_clip=None), 8).dual_clip is None
    for name in ("grpo", "dapo", "gspo", "ppo"):
        assert AlgorithmConfig(name=name).dual_clip == 3.0


def _entropy_reference(logits: np.ndarray, temperature: float) -> np.ndarray:
    """Naive numpy: H = -sum_v p_v log p_v with p = softmax(logits / T), in float64."""
    z = logits.astype(np.float64) / temperature
    z = z - z.max(axis=-1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)
    return -(p * np.log(p)).sum(axis=-1)


def test_token_entropy_is_of_the_tempered_distribution():
    # [2, .5, -1, 0]: 0.8782812 nats at T = 1, 0.5719250 at T = 0.7 (softmax of logits / 0.7)
    logits = jnp.array([[2.0, 0.5, -1.0, 0.0]])
    np.testing.assert_allclose(token_entropy(logits), [0.8782812], rtol=1e-6)
    np.testing.assert_allclose(token_entropy(logits, 0.7), [0.5719250], rtol=1e-6)
    logits = np.random.default_rng(0).normal(0, 3, (3, 5, 64)).astype(np.float32)
    for t in (0.7, 1.0, 1.5):
        np.testing.assert_allclose(token_entropy(jnp.asarray(logits), t), _entropy_reference(logits, t), rtol=1e-5)
    # same temperature, same distribution as the logprobs: H = -sum_v p_v log p_v with their p
    logp = jnp.stack([token_logprobs(jnp.asarray(logits), jnp.full((3, 5), v), 0.7) for v in range(64)], -1)
    np.testing.assert_allclose(token_entropy(jnp.asarray(logits), 0.7), -(jnp.exp(logp) * logp).sum(-1), rtol=1e-5)


def test_kl_penalty_in_the_loss():
    # at ratio 1 with A = 0 the loss is kl_coef * token-mean(KL); the third token is padding
    # whose reference logprob would overflow exp() if it were not masked first
    logp = jnp.array([[-1.0, -2.0, -1.0]])
    ref = jnp.array([[-1.5, -1.0, 100.0]])
    mask = jnp.array([[1, 1, 0]])
    for estimator, mean_kl in [("k1", -0.25), ("k2", 0.3125), ("k3", 0.41240625)]:
        loss, m = policy_loss(
            logp, logp, jnp.zeros(1), mask, LossSpec(kl_coef=0.1, kl_estimator=estimator), ref_logprobs=ref
        )
        np.testing.assert_allclose(loss, 0.1 * mean_kl, rtol=1e-5)
        np.testing.assert_allclose(m["kl"], mean_kl, rtol=1e-5)
        assert float(m["pg_loss"]) == 0.0
    g = jax.grad(
        lambda lp: policy_loss(
            lp,
            jax.lax.stop_gradient(logp),
            jnp.zeros(1),
            mask,
            LossSpec(kl_coef=0.1, kl_estimator="k1"),
            ref_logprobs=ref,
        )[0]
    )(logp)
    np.testing.assert_allclose(g, [[0.05, 0.05, 0.0]], rtol=1e-5)  # d(.1 * mean k1)/d logp = .1 / 2
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(logp, logp, jnp.zeros(1), mask, LossSpec(kl_coef=0.1))


def test_entropy_bonus():
    lp, mask = jnp.zeros((1, 3)), jnp.array([[1, 1, 0]])
    loss, m = policy_loss(
        lp, lp, jnp.zeros(1), mask, LossSpec(entropy_coef=0.01), entropy=jnp.array([[1.0, 3.0, 50.0]])
    )
    np.testing.assert_allclose(loss, -0.01 * 2.0, rtol=1e-6)  # mean entropy over valid tokens = 2
    np.testing.assert_allclose(m["entropy"], 2.0, rtol=1e-6)
    with pytest.raises(ValueError, match="entropy"):
        policy_loss(lp, lp, jnp.zeros(1), mask, LossSpec(entropy_coef=0.01))


def test_approx_kl_is_k3_against_the_behaviour_policy():
    # r = 2: 2 - 1 - ln 2 = .3068528;  r = .5: .5 - 1 + ln 2 = .1931472;  mean .25
    _, m = policy_loss(jnp.log(jnp.array([[2.0, 0.5]])), jnp.zeros((1, 2)), jnp.zeros(1), jnp.ones((1, 2)))
    np.testing.assert_allclose(m["approx_kl"], 0.25, rtol=1e-5)


def test_policy_loss_jits():
    logp, old, adv, mask = _gspo_case()
    spec = LossSpec(ratio_level="sequence", clip_low=0.2, clip_high=0.28, aggregation="seq_mean_token_sum_norm")
    eager = policy_loss(logp, old, adv, mask, spec)
    jitted = jax.jit(lambda *a: policy_loss(*a, spec))(logp, old, adv, mask)
    np.testing.assert_allclose(eager[0], jitted[0], rtol=1e-6)
    assert set(eager[1]) == set(jitted[1])


@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
def test_policy_loss_gradient_matches_finite_differences(ratio_level):
    """Every term at once (clip-higher, dual clip, k3 KL, entropy) on a point away from the kinks."""
    with jax.enable_x64(True):
        old = jnp.array([[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.8]], jnp.float64)
        logp0 = old + jnp.array([[0.1, -0.3, 9.0], [0.5, -0.05, 0.2]], jnp.float64)  # 9.0 is padding
        ref = jnp.array([[-1.1, -0.2, -3.0], [-0.6, -1.0, -0.7]], jnp.float64)
        mask = jnp.array([[1, 1, 0], [1, 1, 1]])
        adv = jnp.array([1.0, -0.7], jnp.float64)
        entropy = jnp.array([[0.9, 1.1, 0.0], [0.4, 0.6, 0.8]], jnp.float64)

        @jax.jit
        def f(lp):
            return policy_loss(
                lp,
                old,
                adv,
                mask,
                LossSpec(
                    ratio_level=ratio_level,
                    clip_low=0.2,
                    clip_high=0.28,
                    dual_clip=3.0,
                    aggregation="seq_mean_token_mean",
                    kl_coef=0.1,
                    kl_estimator="k3",
                    entropy_coef=0.01,
                ),
                ref_logprobs=ref,
                entropy=entropy,
            )[0]

        grad = np.asarray(jax.grad(f)(logp0))
        assert grad.dtype == np.float64
        h, numeric = 1e-6, np.zeros((2, 3))
        for i in range(2):
            for j in range(3):
                step = jnp.zeros((2, 3), jnp.float64).at[i, j].set(h)
                numeric[i, j] = (float(f(logp0 + step)) - float(f(logp0 - step))) / (2 * h)
        np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-9)
        assert np.abs(grad[mask == 1]).min() > 1e-3 and grad[0, 2] == 0.0
    assert jnp.zeros(1).dtype == jnp.float32  # x64 is off again for the other tests


# --- value loss and explained variance ----------------------------------------------------------


def test_value_loss_by_hand():
    values = jnp.array([[1.0, 2.0, 0.0, 9.0]])
    old = jnp.array([[0.5, 2.5, 0.0, 9.0]])
    returns = jnp.array([[2.0, 1.0, 0.3, 0.0]])
    mask = jnp.array([[1, 1, 1, 0]])
    # t0: v_clip = .5 + .2 = .7: max((1-2)^2, (.7-2)^2) = 1.69 (clipped)
    # t1: v_clip = 2.5 - .2 = 2.3: max((2-1)^2, (2.3-1)^2) = 1.69 (clipped);  t2: .09 either way
    loss, m = value_loss(values, old, returns, mask, 0.2)
    np.testing.assert_allclose(loss, 0.5 * (1.69 + 1.69 + 0.09) / 3, rtol=1e-6)
    np.testing.assert_allclose(m["value_clip_frac"], 2 / 3, rtol=1e-6)
    np.testing.assert_allclose(m["value_mean"], 1.0, rtol=1e-6)
    g = jax.grad(lambda v: value_loss(v, old, returns, mask, 0.2)[0])(values)
    np.testing.assert_allclose(g, [[0.0, 0.0, (0.0 - 0.3) / 3, 0.0]], atol=1e-7)  # clipped: no gradient
    loss, m = value_loss(values, old, returns, mask, None)  # plain .5 (v - R)^2
    np.testing.assert_allclose(loss, 0.5 * (1 + 1 + 0.09) / 3, rtol=1e-6)
    assert float(m["value_clip_frac"]) == 0.0


def test_explained_variance():
    returns = jnp.array([[1.0, 2.0, 3.0, 100.0]])
    mask = jnp.array([[1, 1, 1, 0]])
    np.testing.assert_allclose(explained_variance(jnp.array([[1.0, 2.0, 3.0, -5.0]]), returns, mask), 1.0)
    # residuals -1, 0, 1 have the returns' own variance 2/3 -> 0;  values 3,2,1: Var[-2,0,2] = 8/3 -> -3
    np.testing.assert_allclose(explained_variance(jnp.full((1, 4), 2.0), returns, mask), 0.0, atol=1e-6)
    np.testing.assert_allclose(explained_variance(jnp.array([[3.0, 2.0, 1.0, 0.0]]), returns, mask), -3.0, rtol=1e-6)
    assert np.isnan(float(explained_variance(jnp.zeros((1, 4)), jnp.ones((1, 4)), mask)))


def test_garbage_on_padding_never_leaks_into_the_loss():
    # NaN advantages and entropies and huge logprobs on padding: every aggregation stays finite
    logp = jnp.array([[-0.5, 80.0], [-1.0, -1.0]])
    old = jnp.array([[-0.6, -80.0], [-1.0, -1.0]])
    adv = jnp.array([[1.0, jnp.nan], [-1.0, -1.0]])
    entropy = jnp.array([[1.0, jnp.nan], [1.0, 1.0]])
    mask = jnp.array([[1, 0], [1, 1]])
    for aggregation in LOSS_AGGREGATIONS.names():
        for ratio_level in ("token", "sequence"):
            loss, m = policy_loss(
                logp,
                old,
                adv,
                mask,
                LossSpec(ratio_level=ratio_level, aggregation=aggregation, kl_coef=0.1, entropy_coef=0.01),
                ref_logprobs=old,
                entropy=entropy,
            )
            assert all(np.isfinite(float(v)) for v in [loss, *m.values()]), (aggregation, ratio_level, m)
            g = jax.grad(
                lambda lp: policy_loss(lp, old, adv, mask, LossSpec(ratio_level=ratio_level, aggregation=aggregation))[
                    0
                ]
            )(logp)
            assert np.isfinite(np.asarray(g)).all() and float(g[0, 1]) == 0.0
