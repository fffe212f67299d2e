import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from spotrl.config import ModelConfig
from spotrl.model.transformer import Transformer, causal_mask, forward, init_cache, positions_from_mask, rope


def _model(**kw):
    cfg = ModelConfig(
        vocab_size=16, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2, **kw
    )
    return cfg, Transformer(cfg, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("tie,bias", [(True, False), (False, True)])
def test_cached_decoding_equals_full_forward(tie, bias):
    cfg, model = _model(tie_embeddings=tie, qkv_bias=bias)
    rng = np.random.default_rng(0)
    batch, prompt_len, steps = 3, 6, 5
    tokens = rng.integers(3, 16, size=(batch, prompt_len + steps)).astype(np.int32)
    valid = np.ones_like(tokens, bool)
    valid[1, :2] = False  # left padding of different lengths
    valid[2, :4] = False
    tokens[~valid] = 0
    full = forward(model, jnp.asarray(tokens), jnp.asarray(valid))

    slots = prompt_len + steps
    key_valid = jnp.asarray(valid)  # every slot's validity is known up front
    cache = init_cache(cfg, batch, slots)
    positions = positions_from_mask(key_valid)
    logits, cache = model(
        jnp.asarray(tokens[:, :prompt_len]),
        positions[:, :prompt_len],
        causal_mask(jnp.arange(prompt_len), key_valid),
        cache,
        0,
    )
    np.testing.assert_allclose(logits[:, -1], full[:, prompt_len - 1], atol=1e-5)
    for i in range(steps):
        slot = prompt_len + i
        step_logits, cache = model(
            jnp.asarray(tokens[:, slot : slot + 1]),
            positions[:, slot : slot + 1],
            causal_mask(jnp.full((1,), slot), key_valid),
            cache,
            slot,
        )
        np.testing.assert_allclose(step_logits[:, 0], full[:, slot], atol=1e-5)


def test_left_padding_does_not_change_logits():
    cfg, model = _model()
    seq = jnp.array([[5, 6, 7, 8]], jnp.int32)
    padded = jnp.array([[0, 0, 5, 6, 7, 8]], jnp.int32)
    a = forward(model, seq, jnp.ones((1, 4), bool))
    b = forward(model, padded, jnp.array([[False, False, True, True, True, True]]))
    np.testing.assert_allclose(a[0], b[0, 2:], atol=1e-5)


def test_rope_is_a_rotation_and_relative():
    x = jax.random.normal(jax.random.key(0), (1, 4, 2, 8))
    pos = jnp.arange(4)[None]
    y = rope(x, pos, 10000.0)
    np.testing.assert_allclose(jnp.linalg.norm(y, axis=-1), jnp.linalg.norm(x, axis=-1), rtol=1e-5)
    np.testing.assert_allclose(y[:, 0], x[:, 0], atol=1e-6)  # position 0 is the identity
    # dot products depend only on the distance between positions
    q = jnp.broadcast_to(x[:, :1], x.shape)
    d1 = jnp.sum(rope(q, pos, 1e4)[:, 1] * rope(q, pos, 1e4)[:, 0])
    d2 = jnp.sum(rope(q, pos + 5, 1e4)[:, 1] * rope(q, pos + 5, 1e4)[:, 0])
    np.testing.assert_allclose(d1, d2, rtol=1e-4)


def test_tied_model_has_no_lm_head_and_gqa_shapes():
    cfg, model = _model()
    assert model.lm_head is None
    attn = model.layers[0].self_attn
    assert attn.q_proj.kernel[...].shape == (32, 4 * 8)
    assert attn.k_proj.kernel[...].shape == (32, 2 * 8)


def test_config_rejects_heads_not_divisible():
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        ModelConfig(num_heads=4, num_kv_heads=3)
