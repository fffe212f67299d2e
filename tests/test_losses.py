import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spotrl.model.advantages import ADVANTAGE_ESTIMATORS, group_normalized_advantages
from spotrl.model.losses import clipped_policy_loss, token_logprobs


def test_group_advantages_by_hand():
    # group 1: rewards 1,0,0,1 -> mean 0.5, population std 0.5 -> +-1 (eps 0)
    # group 2: all equal -> 0
    # group 3: 1,0,0,0 -> mean .25, std sqrt(.1875)=.4330127 -> 1.7320508, -0.5773503
    rewards = jnp.array([[1.0, 0, 0, 1], [1, 1, 1, 1], [1, 0, 0, 0]])
    adv = group_normalized_advantages(rewards, eps=0.0 + 1e-12)
    np.testing.assert_allclose(adv[0], [1, -1, -1, 1], atol=1e-6)
    np.testing.assert_allclose(adv[1], [0, 0, 0, 0], atol=1e-6)
    np.testing.assert_allclose(adv[2], [1.7320508, -0.5773503, -0.5773503, -0.5773503], atol=1e-6)
    assert ADVANTAGE_ESTIMATORS["grpo"] is group_normalized_advantages


def test_group_advantages_eps_in_denominator():
    adv = group_normalized_advantages(jnp.array([[1.0, 0.0]]), eps=0.5)  # std 0.5 -> / 1.0
    np.testing.assert_allclose(adv, [[0.5, -0.5]], atol=1e-7)


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
