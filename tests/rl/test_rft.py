"""Rejection-sampling fine-tuning (algorithm.name rft): which rows it keeps, that it trains on those
and only those with the supervised loss, and what an iteration where nothing verified does."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pandas as pd
import pytest
from flax import nnx

from spotrl.config import ModelConfig, RunConfig
from spotrl.model.policy import Policy
from spotrl.model.tokenizers import CharTokenizer
from spotrl.model.transformer import forward
from spotrl.rl.batch import TrainingBatch
from spotrl.rl.rft import rft_steps, rft_update, verified_rows
from spotrl.rl.train_step import build_sft_step
from spotrl.rl.warmstart import supervised_rows

CFG = ModelConfig(hidden_size=32, intermediate_size=64, num_layers=1)


def test_verified_rows_keeps_real_rows_at_or_above_the_threshold():
    rewards = [1.0, 0.0, 1.0, 0.5, 1.0, 1.0]  # the last two rows are padding
    assert verified_rows(rewards, 4, 1.0).tolist() == [0, 2]
    assert verified_rows(rewards, 4, 0.5).tolist() == [0, 2, 3]
    assert verified_rows(rewards, 6, 1.0).tolist() == [0, 2, 4, 5]
    assert verified_rows([0.0, 0.0], 2, 1.0).tolist() == []


def test_supervised_rows_target_the_completion_up_to_its_stop_token():
    prompt_tokens = np.array([[0, 2, 5], [2, 5, 6]])
    prompt_valid = np.array([[False, True, True], [True, True, True]])
    completions = np.array([[7, 1, 0], [8, 9, 1]])
    tokens, valid, target = supervised_rows(prompt_tokens, prompt_valid, completions, np.array([2, 0]))
    assert tokens.tolist() == [[0, 2, 5, 7, 1, 0], [2, 5, 6, 8, 9, 1]]
    assert valid.astype(int).tolist() == [[0, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]]
    assert target.astype(int).tolist() == [[0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 0, 0]]


def _rows(seed: int, rows: int = 6, prompt: int = 4, new: int = 4):
    rng = np.random.default_rng(seed)
    prompt_tokens = rng.integers(3, CFG.vocab_size, (rows, prompt))
    completions = rng.integers(3, CFG.vocab_size, (rows, new))
    lengths = np.array([4, 2, 3, 1, 4, 2])[:rows]
    return supervised_rows(prompt_tokens, np.ones((rows, prompt), bool), completions, lengths)


def _fresh_state(policy, tx):
    params = jax.tree.map(jnp.copy, policy.init_state)  # the step donates its input
    return {"params": params, "opt_state": tx.init(params)}


def _naive_loss(policy, params, tokens, valid, target, rows):
    """Mean negative log-likelihood of the target tokens of `rows`, written out (no spotrl step code)."""
    logits = forward(nnx.merge(policy.graphdef, params), jnp.asarray(tokens[rows]), jnp.asarray(valid[rows]))
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    picked = jnp.take_along_axis(logp, jnp.asarray(tokens[rows])[:, 1:, None], axis=-1)[..., 0]
    mask = jnp.asarray(target[rows])[:, 1:]
    return -(picked * mask).sum() / mask.sum()


@pytest.mark.slow  # compile-heavy: tens of seconds of XLA compilation
def test_an_rft_step_is_the_supervised_gradient_of_the_kept_rows_only():
    """With SGD at learning rate 1 the applied update is the gradient: it equals the gradient of the
    naive loss over the kept rows, and does not change when the rows left out are other sequences."""
    policy, tx = Policy(CFG, init_seed=0), optax.sgd(1.0)
    keep = np.array([0, 3, 4])
    tokens, valid, target = _rows(seed=1)
    before = jax.tree.map(np.array, policy.init_state)
    expected_loss, grads = jax.value_and_grad(_naive_loss, argnums=1)(policy, before, tokens, valid, target, keep)

    deltas = []
    for other_seed in (1, 2):  # the rows not kept: the same ones, then different sequences
        other = _rows(seed=other_seed)
        mixed = [np.where(np.isin(np.arange(6), keep)[:, None], mine, theirs) for mine, theirs in zip(_rows(1), other)]
        state, losses = rft_steps(
            build_sft_step(policy.graphdef, tx),
            _fresh_state(policy, tx),
            tokens=mixed[0],
            valid=mixed[1],
            target_mask=mixed[2],
            keep=keep,
            batch_size=4,  # 3 kept rows and one filler row whose mask is cleared
            epochs=1,
            rng=np.random.default_rng(0),
        )
        assert losses == [pytest.approx(float(expected_loss), rel=1e-5)]
        deltas.append(jax.tree.map(lambda b, a: b - np.asarray(a), before, state["params"]))
    for delta, other, grad in zip(jax.tree.leaves(deltas[0]), jax.tree.leaves(deltas[1]), jax.tree.leaves(grads)):
        np.testing.assert_allclose(delta, grad, atol=1e-6)
        np.testing.assert_allclose(delta, other, atol=1e-7)


def test_every_kept_row_once_per_epoch_in_fixed_size_batches_and_nothing_else():
    """Which rows each step trains on (target tokens present), recorded around the real step."""
    policy, tx = Policy(CFG, init_seed=0), optax.adam(1e-3)
    step, trained = build_sft_step(policy.graphdef, tx), []

    def recording_step(params, opt_state, tokens, valid, mask):
        trained.append((tokens.shape[0], [tuple(t) for t, m in zip(tokens.tolist(), mask) if m.any()]))
        return step(params, opt_state, tokens, valid, mask)

    tokens, valid, target = _rows(seed=3)
    keep = np.array([1, 2, 4, 5, 0])
    _, losses = rft_steps(
        recording_step,
        _fresh_state(policy, tx),
        tokens=tokens,
        valid=valid,
        target_mask=target,
        keep=keep,
        batch_size=2,
        epochs=2,
        rng=np.random.default_rng(0),
    )
    assert len(losses) == 6 and all(np.isfinite(losses))  # ceil(5 / 2) steps per epoch, 2 epochs
    assert [size for size, _ in trained] == [2] * 6
    for epoch in (trained[:3], trained[3:]):
        seen = sorted(row for _, rows in epoch for row in rows)
        assert seen == sorted(tuple(tokens[i]) for i in keep)  # each kept row exactly once, row 3 never


def test_nothing_verified_means_no_step_and_unchanged_weights():
    policy, tx = Policy(CFG, init_seed=0), optax.adam(1e-3)
    state = _fresh_state(policy, tx)
    before = jax.tree.map(np.array, state)
    tokens, valid, target = _rows(seed=4)
    after, losses = rft_steps(
        build_sft_step(policy.graphdef, tx),
        state,
        tokens=tokens,
        valid=valid,
        target_mask=target,
        keep=np.array([], int),
        batch_size=2,
        epochs=3,
        rng=np.random.default_rng(0),
    )
    assert losses == []
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
        np.testing.assert_array_equal(a, np.asarray(b))


def _scored_frame(task_rewards, rewards):
    tokenizer = CharTokenizer()
    completions = ["21", "3", "12", "9"] * 2
    tokens = np.zeros((8, 4), np.int32)
    lengths = np.zeros(8, np.int32)
    for i, text in enumerate(completions):
        ids = tokenizer.encode(text, eos=True)
        tokens[i, : len(ids)], lengths[i] = ids, len(ids)
    return pd.DataFrame(
        {
            "prompt": ["0012+0009="] * 4 + ["0001+0002="] * 4,
            "tokens": list(tokens),
            "length": lengths,
            "task_reward": task_rewards,
            "reward": rewards,
        }
    )


def _rft_config(**algorithm):
    return RunConfig(
        model=CFG,
        rollout={"prompts_per_iteration": 2, "group_size": 4, "max_new_tokens": 4},
        algorithm={"name": "rft", "minibatches": 2, **algorithm},
        problem={"train_size": 100, "eval_size": 10},
        eval={"prompts": 10},
    )


@pytest.mark.slow  # compile-heavy: tens of seconds of XLA compilation
def test_rft_update_trains_on_the_verifier_reward_and_reports_kept_fraction():
    """Row 0 ("21" for 12+9) is the only verified one; its shaped reward is lowered (an overlong
    penalty, say) below the threshold, the verifier's is not: kept. One step, on that row."""
    policy, tx = Policy(CFG, init_seed=0), optax.sgd(1.0)
    frame = _scored_frame([1.0, 0, 0, 0, 0, 0, 0, 0], [0.5, 0, 0, 0, 0, 0, 0, 0])
    tokenizer = CharTokenizer()
    state, metrics = rft_update(
        _rft_config(),
        1,
        _fresh_state(policy, tx),
        TrainingBatch(frame, 8, {}),
        tokenizer=tokenizer,
        graphdef=policy.graphdef,
        optimizer=tx,
    )
    prompt_tokens, prompt_valid = tokenizer.encode_batch_left_padded(frame["prompt"].tolist())
    rows = supervised_rows(prompt_tokens, prompt_valid, np.stack(frame["tokens"]), frame["length"].to_numpy())
    expected = _naive_loss(policy, policy.init_state, *rows, np.array([0]))
    assert metrics == {
        "kept_rows": 1,
        "kept_fraction": 1 / 8,
        "optimizer_steps": 1,
        "loss": pytest.approx(float(expected), rel=1e-5),
    }

    _, none_kept = rft_update(
        _rft_config(),
        2,
        state,
        TrainingBatch(_scored_frame([0.0] * 8, [0.0] * 8), 8, {}),
        tokenizer=tokenizer,
        graphdef=policy.graphdef,
        optimizer=tx,
    )
    assert none_kept == {"kept_rows": 0, "kept_fraction": 0.0, "optimizer_steps": 0}


def test_rft_config_takes_the_threshold_and_refuses_a_critic_or_a_kl():
    assert _rft_config(rft={"min_reward": 0.5}).algorithm.rft.min_reward == 0.5
    for parts, key in (
        ({"advantage": "gae", "value": {"head": "shared"}}, "value.head"),
        ({"kl": {"coef": 0.1}}, "kl.coef"),
    ):
        with pytest.raises(ValueError, match=key):
            _rft_config(**parts)
