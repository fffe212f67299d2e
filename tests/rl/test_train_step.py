"""The RL train step's micro-batching (gradient accumulation) and mixed precision, on a tiny model."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from spotrl.config import ModelConfig
from spotrl.model.policy import Policy
from spotrl.rl.losses import LossSpec, policy_loss
from spotrl.rl.train_step import RLBatch, build_rl_step, completion_logprobs, make_optimizer

CFG = ModelConfig(hidden_size=32, intermediate_size=64, num_layers=1)
PROMPT, NEW = 5, 4


def _batch(rows: int = 8, seed: int = 0) -> RLBatch:
    """Completions of uneven length, so micro-batches hold different numbers of valid tokens."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(2, CFG.vocab_size, (rows, PROMPT + NEW)).astype(np.int32)
    lengths = np.array([4, 1, 2, 4, 3, 1, 4, 0])[:rows]  # the last row is padding: no valid token
    valid = np.concatenate([np.ones((rows, PROMPT), bool), np.arange(NEW)[None] < lengths[:, None]], axis=1)
    old = rng.normal(-2.7, 0.3, (rows, NEW)).astype(np.float32)
    return RLBatch(tokens, valid, old, rng.normal(0, 1, rows).astype(np.float32))


def _fresh(policy: Policy):
    return jax.tree.map(jnp.copy, policy.to_state(policy.template()))  # the step donates its input


def _grads_by_sgd(policy, spec, micro_batches, batch):
    """The gradient the step applied: with SGD at learning rate 1, params_before - params_after."""
    tx = optax.sgd(1.0)
    params = _fresh(policy)
    before = jax.tree.map(np.array, params)
    step = build_rl_step(policy.graphdef, tx, spec, 1.0, micro_batches=micro_batches)
    state, metrics = step({"params": params, "opt_state": tx.init(params)}, batch)
    return jax.tree.map(lambda b, a: b - np.asarray(a), before, state["params"]), jax.device_get(metrics)


def _reference(policy, spec):
    """Jitted (loss, metrics) and gradient of the full-batch loss written out directly from
    losses.policy_loss (no train-step code)."""

    def loss(params, b):
        model = nnx.merge(policy.graphdef, params)
        logprobs, logits = completion_logprobs(model, jnp.asarray(b.tokens), jnp.asarray(b.valid), NEW, 1.0)
        logp = jax.nn.log_softmax(logits)
        entropy = -(jnp.exp(logp) * logp).sum(-1)
        return policy_loss(
            logprobs,
            b.old_logprobs,
            b.advantages,
            b.valid[:, -NEW:],
            LossSpec(aggregation=spec.aggregation, entropy_coef=spec.entropy_coef),
            entropy=entropy,
        )

    return jax.jit(jax.value_and_grad(loss, has_aux=True))


def _max_gap(a, b) -> float:
    return max(
        float(np.abs(np.asarray(x) - np.asarray(y)).max()) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
    )


@pytest.mark.slow  # compile-heavy: tens of seconds of XLA compilation
@pytest.mark.parametrize(
    "spec",
    [
        LossSpec(),
        LossSpec(aggregation="seq_mean_token_mean", entropy_coef=0.01),
        LossSpec(aggregation="seq_mean_token_sum_norm"),
    ],
    ids=["token_mean", "seq_mean_token_mean+entropy", "seq_mean_token_sum_norm"],
)
def test_micro_batched_update_equals_the_full_batch_update(spec):
    policy = Policy(CFG, init_seed=0)
    batch = _batch()
    micro, metrics = _grads_by_sgd(policy, spec, 4, batch)  # 4 micro-batches of 2 rows: 8, 4, 8, 3 tokens
    reference = _reference(policy, spec)
    (loss, expected_metrics), expected = reference(_fresh(policy), batch)
    for got, want in zip(jax.tree.leaves(micro), jax.tree.leaves(expected)):
        np.testing.assert_allclose(got, np.asarray(want), rtol=1e-4, atol=1e-6)
    # float32 sums in another order: 1.7e-5 apart on an AVX-512 Xeon (the same tolerance as the gradients)
    assert metrics["loss"] == pytest.approx(float(loss), rel=1e-4)
    for key in ("pg_loss", "clip_frac", "ratio_mean", "approx_kl", "entropy"):
        assert metrics[key] == pytest.approx(float(expected_metrics[key]), rel=1e-5, abs=1e-7), key
    assert metrics["grad_norm"] == pytest.approx(float(optax.tree.norm(expected)), rel=1e-5)

    if spec.aggregation == "token_mean":  # the weighting matters: a plain mean of the micro-batch gradients differs
        quarters = [jax.tree.map(lambda x: x[i * 2 : (i + 1) * 2], batch) for i in range(4)]
        plain = jax.tree.map(lambda *g: sum(g) / 4, *[reference(_fresh(policy), q)[1] for q in quarters])
        assert _max_gap(plain, expected) > 1e-3


@pytest.mark.slow  # compile-heavy: tens of seconds of XLA compilation
def test_entropy_metric_and_bonus_are_of_the_tempered_distribution():
    """At rollout temperature 0.7 the entropy is that of softmax(logits / 0.7), the distribution
    the logprobs (and the sampler) use, checked against naive numpy on the model's logits."""
    policy = Policy(CFG, init_seed=0)
    batch = _batch()
    t, coef = 0.7, 0.01
    tx = optax.sgd(0.0)  # the metrics are of the weights before the update
    params = _fresh(policy)
    model = nnx.merge(policy.graphdef, params)
    _, logits = completion_logprobs(model, jnp.asarray(batch.tokens), jnp.asarray(batch.valid), NEW, t)
    z = np.asarray(logits, np.float64) / t
    z -= z.max(-1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    mask = batch.valid[:, -NEW:]
    want = float((-(p * np.log(p)).sum(-1))[mask].mean())
    step = build_rl_step(policy.graphdef, tx, LossSpec(entropy_coef=coef), t)
    _, metrics = step({"params": params, "opt_state": tx.init(params)}, batch)
    metrics = jax.device_get(metrics)
    assert metrics["entropy"] == pytest.approx(want, rel=1e-5)
    assert metrics["loss"] == pytest.approx(metrics["pg_loss"] - coef * want, rel=1e-5)  # the bonus, same H
    # the untempered entropy (the bug of issue 20) is another number
    p1 = np.exp(z * t) / np.exp(z * t).sum(-1, keepdims=True)
    assert abs(float((-(p1 * np.log(p1)).sum(-1))[mask].mean()) - want) > 0.1


def test_micro_batches_must_divide_the_batch_and_know_the_aggregation():
    policy = Policy(CFG, init_seed=0)
    tx = optax.sgd(1.0)
    step = build_rl_step(policy.graphdef, tx, LossSpec(), 1.0, micro_batches=3)
    params = _fresh(policy)
    with pytest.raises(TypeError):  # 8 rows do not reshape into 3 micro-batches
        step({"params": params, "opt_state": tx.init(params)}, _batch())
    with pytest.raises(ValueError, match="micro-batching"):
        build_rl_step(policy.graphdef, tx, LossSpec(aggregation="nonsense"), 1.0, micro_batches=2)


@pytest.mark.slow  # compile-heavy: tens of seconds of XLA compilation
def test_mixed_precision_keeps_float32_master_weights_and_a_close_loss():
    f32 = Policy(CFG, init_seed=0)
    mixed = Policy(CFG.model_copy(update={"compute_dtype": "bfloat16"}), init_seed=0)
    for a, b in zip(jax.tree.leaves(f32.init_state), jax.tree.leaves(mixed.init_state)):
        assert b.dtype == jnp.float32 and np.array_equal(a, b)  # same master weights
    batch = _batch()
    tx = make_optimizer(1e-2, 0.01, 0.9, 0.999, 1.0)
    results = {}
    for name, policy in (("f32", f32), ("mixed", mixed)):
        step = build_rl_step(policy.graphdef, tx, LossSpec(), 1.0)
        params = _fresh(policy)
        state = {"params": params, "opt_state": tx.init(params)}
        for _ in range(2):
            state, metrics = step(state, batch)
        results[name] = (state, jax.device_get(metrics))
    state, metrics = results["mixed"]
    dtypes = {x.dtype for x in jax.tree.leaves(state)}
    assert dtypes <= {jnp.dtype(jnp.float32), jnp.dtype(jnp.int32)}, dtypes  # params and Adam moments
    ref = results["f32"][1]
    # the matmuls ran in bfloat16 (8 bits of mantissa): close to float32, but not the same numbers
    assert metrics["loss"] != ref["loss"]
    assert metrics["loss"] == pytest.approx(ref["loss"], abs=2e-2)
    assert metrics["entropy"] == pytest.approx(ref["entropy"], rel=1e-2)


def test_run_config_takes_micro_batches_that_divide_the_minibatch_and_a_compute_dtype():
    from spotrl.configs import build_config

    config = build_config(None, ["algorithm.micro_batches=4", "model.compute_dtype=bfloat16"])
    assert config.algorithm.micro_batches == 4 and config.model.resolved_compute_dtype == "bfloat16"
    assert build_config(None, []).model.resolved_compute_dtype == "float32"
    with pytest.raises(ValueError, match="algorithm.micro_batches"):  # 64 x 8 rows / 4 minibatches = 128 rows
        build_config(None, ["algorithm.micro_batches=3"])
    with pytest.raises(ValueError, match="compute_dtype"):
        build_config(None, ["model.compute_dtype=float16"])
