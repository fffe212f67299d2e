import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from spotrl.config import ModelConfig
from spotrl.model.policy import Policy
from spotrl.model.sequences import completion_mask, join
from spotrl.rl.losses import LossSpec
from spotrl.rl.train_step import build_rl_step, completion_logprobs, make_optimizer
from spotrl.rl.update import AdvantageSpec, UpdateBatch, compute_advantages, policy_update


@pytest.mark.slow  # compile-heavy: tens of seconds of XLA compilation
def test_update_raises_rewarded_and_lowers_penalised_completions():
    policy = Policy(ModelConfig(hidden_size=32, intermediate_size=64, num_layers=2), init_seed=0)
    tx = make_optimizer(1e-2, 0.0, 0.9, 0.999, 1.0)
    step = build_rl_step(policy.graphdef, tx, LossSpec(), 1.0)
    # one group of 4 samples of the same prompt: two rewarded, two not
    prompt = np.array([[2, 3, 4, 13, 5, 14]] * 4, np.int32)
    prompt_valid = np.ones_like(prompt, bool)
    tokens = np.array([[5, 6, 1, 0], [7, 1, 0, 0], [8, 9, 10, 1], [11, 1, 0, 0]], np.int32)
    lengths = np.array([3, 2, 4, 2])
    rewards = np.array([1.0, 0.0, 1.0, 0.0])

    def token_logprobs(state):
        model = nnx.merge(policy.graphdef, state)
        all_tokens, valid = join(prompt, prompt_valid, tokens, lengths)
        lp, _ = completion_logprobs(model, jnp.asarray(all_tokens), jnp.asarray(valid), 4, 1.0)
        return np.asarray(lp * completion_mask(lengths, 4))

    state = policy.to_state(policy.template())
    behaviour = token_logprobs(state)  # on-policy: what the sampler reports
    before = behaviour.sum(-1)
    train_state, metrics = policy_update(
        step,
        {"params": state, "opt_state": tx.init(state)},
        UpdateBatch(
            prompt_tokens=prompt,
            prompt_valid=prompt_valid,
            tokens=tokens,
            lengths=lengths,
            old_logprobs=behaviour,
            rewards=rewards,
        ),
        AdvantageSpec("grpo", group_size=4),
        minibatches=1,
        epochs=1,
        rng=np.random.default_rng(0),
    )
    after = token_logprobs(train_state["params"]).sum(-1)
    assert (after[[0, 2]] > before[[0, 2]]).all() and (after[[1, 3]] < before[[1, 3]]).all()
    assert metrics["optimizer_steps"] == 1 and metrics["groups_with_signal"] == 1.0
    np.testing.assert_allclose(metrics["advantage_mean"], 0.0, atol=1e-6)


def _critic_step_changes(head: str):
    """(policy changed?, critic changed?) after one PPO step whose policy term has zero gradient."""
    import jax

    from spotrl.model.critic import Critic
    from spotrl.rl.train_step import RLBatch

    cfg = ModelConfig(hidden_size=32, intermediate_size=64, num_layers=2)
    policy = Policy(cfg, init_seed=0)
    critic_graphdef, critic_state = nnx.split(Critic(cfg, separate=head == "separate", rngs=nnx.Rngs(1)))
    tx = make_optimizer(1e-2, 0.0, 0.9, 0.999, 1.0)
    step = build_rl_step(policy.graphdef, tx, LossSpec(value_coef=0.5, value_clip=None), 1.0, critic_graphdef, tx)
    params = policy.to_state(policy.template())
    state = {
        "params": params,
        "opt_state": tx.init(params),
        "critic": critic_state,
        "critic_opt_state": tx.init(critic_state),
    }
    before = jax.tree.map(np.array, state)
    tokens, valid = join(
        np.array([[2, 3, 4]] * 2, np.int32), np.ones((2, 3), bool), np.array([[5, 1], [6, 1]]), np.array([2, 2])
    )
    zeros = np.zeros((2, 2), np.float32)
    batch = RLBatch(
        tokens, valid, zeros, np.zeros(2, np.float32), old_values=zeros, returns=np.ones((2, 2), np.float32)
    )
    for _ in range(2):  # the head starts at zero: only from the second step can the trunk get a gradient
        state, metrics = step(state, batch)
    changed = lambda a, b: any(not np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))  # noqa: E731
    assert float(metrics["value_loss"]) > 0
    return changed(before["params"], state["params"]), changed(before["critic"], state["critic"])


@pytest.mark.slow  # compile-heavy: tens of seconds of XLA compilation
def test_separate_critic_leaves_the_policy_alone_and_shared_one_trains_its_trunk():
    assert _critic_step_changes("separate") == (False, True)
    assert _critic_step_changes("shared") == (True, True)


@pytest.mark.parametrize("kl_in_reward_coef", [0.0, 0.1])
def test_an_unknown_estimator_is_named_whatever_the_kl_setting(kl_in_reward_coef):
    spec = AdvantageSpec("nope", group_size=2, kl_in_reward_coef=kl_in_reward_coef)
    with pytest.raises(ValueError, match="no advantage estimator 'nope'; known: .*'gae'.*'grpo'"):
        compute_advantages(spec, np.zeros(4), np.ones((4, 2), bool))


def test_advantage_std_and_eps_reach_the_estimators():
    from spotrl.config import AlgorithmConfig
    from spotrl.rl.update import advantage_spec

    assert advantage_spec(AlgorithmConfig(), 8).ddof == 1  # the default: the sample std, as verl and TRL
    spec = advantage_spec(AlgorithmConfig(advantage_std="population", advantage_eps=0.5), 2)
    assert (spec.ddof, spec.eps) == (0, 0.5)
    # rewards 1, 0: population std .5 -> .5 / (.5 + .5) = .5;  the sample std .7071068 -> .4142136
    adv, _ = compute_advantages(spec, np.array([1.0, 0.0]), np.ones((2, 1), bool))
    np.testing.assert_allclose(adv, [0.5, -0.5], rtol=1e-6)
    adv, _ = compute_advantages(advantage_spec(AlgorithmConfig(advantage_eps=0.5), 2), [1.0, 0.0], np.ones((2, 1)))
    np.testing.assert_allclose(adv, [0.4142136, -0.4142136], rtol=1e-6)
