import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from sampling_fixtures import DigitTokenizer

from spotrl.config import ModelConfig
from spotrl.model.compiles import CompileCounter, compile_count
from spotrl.model.transformer import Transformer, forward
from spotrl.rl.losses import token_logprobs
from spotrl.rollout.completions import LoadedPolicy, sample_completions
from spotrl.rollout.sampler import SamplingParams, filter_logits, generate, generate_groups, jit_cache_sizes

STOP = 1


def _setup():
    cfg = ModelConfig(vocab_size=16, hidden_size=32, intermediate_size=48, num_layers=2)
    model = Transformer(cfg, rngs=nnx.Rngs(1))
    graphdef, state = nnx.split(model)
    prompts = np.array([[0, 0, 2, 5, 6], [2, 7, 8, 9, 4], [0, 2, 3, 3, 3]], np.int32)
    return model, graphdef, state, prompts, prompts != 0


def _naive_greedy(model, prompts, valid, steps):
    """Re-run the full forward pass for every new token: no cache."""
    tokens, mask = prompts.copy(), valid.copy()
    out = []
    for _ in range(steps):
        logits = forward(model, jnp.asarray(tokens), jnp.asarray(mask))[:, -1]
        nxt = np.asarray(jnp.argmax(logits, -1)).astype(np.int32)
        out.append(nxt)
        tokens = np.concatenate([tokens, nxt[:, None]], 1)
        mask = np.concatenate([mask, np.ones((len(mask), 1), bool)], 1)
    return np.stack(out, 1)


@pytest.mark.slow  # compile-heavy: tens of seconds of XLA compilation
def test_greedy_matches_naive_decoding_without_cache():
    model, graphdef, state, prompts, valid = _setup()
    params = SamplingParams(max_new_tokens=6, stop_token=99, temperature=0.0)  # no stop: all 6 steps
    out = generate(graphdef, state, prompts, valid, jax.random.key(0), params)
    np.testing.assert_array_equal(out.tokens, _naive_greedy(model, prompts, valid, 6))
    np.testing.assert_array_equal(out.lengths, [6, 6, 6])


def test_logprobs_equal_trainer_recomputation():
    model, graphdef, state, prompts, valid = _setup()
    params = SamplingParams(max_new_tokens=5, stop_token=99, temperature=0.7)
    out = generate(graphdef, state, prompts, valid, jax.random.key(3), params)
    tokens = np.concatenate([prompts, np.asarray(out.tokens)], 1)
    mask = np.concatenate([valid, np.ones_like(out.tokens, bool)], 1)
    logits = forward(model, jnp.asarray(tokens), jnp.asarray(mask))[:, prompts.shape[1] - 1 : -1]
    recomputed = token_logprobs(logits, jnp.asarray(out.tokens), 0.7)
    np.testing.assert_allclose(out.logprobs, recomputed, atol=1e-5)


def test_stop_token_pads_the_rest_and_sets_lengths():
    _, graphdef, state, prompts, valid = _setup()
    greedy = generate(
        graphdef,
        state,
        prompts,
        valid,
        jax.random.key(0),
        SamplingParams(max_new_tokens=6, stop_token=99, temperature=0.0),
    )
    stop = int(greedy.tokens[0, 2])  # make the third greedy token of row 0 the stop token
    out = generate(
        graphdef,
        state,
        prompts,
        valid,
        jax.random.key(0),
        SamplingParams(max_new_tokens=6, stop_token=stop, pad_token=0, temperature=0.0),
    )
    tokens = np.asarray(out.tokens)
    for row in range(3):
        hits = np.flatnonzero(np.asarray(greedy.tokens[row]) == stop)
        expected_len = hits[0] + 1 if len(hits) else 6
        assert out.lengths[row] == expected_len
        np.testing.assert_array_equal(tokens[row, :expected_len], np.asarray(greedy.tokens[row, :expected_len]))
        assert (tokens[row, expected_len:] == 0).all()
        assert (np.asarray(out.logprobs[row, expected_len:]) == 0).all()
    assert out.lengths[0] <= 3  # the stop token ends row 0 at the latest where it was put


def test_any_of_several_stop_tokens_ends_a_row():
    """generation_config.json may list several eos ids (<|im_end|> and <|endoftext|>): each one ends a row."""
    _, graphdef, state, prompts, valid = _setup()
    greedy = generate(
        graphdef,
        state,
        prompts,
        valid,
        jax.random.key(0),
        SamplingParams(max_new_tokens=6, stop_token=99, temperature=0.0),
    )
    greedy = np.asarray(greedy.tokens)
    first, second = int(greedy[0, 1]), int(greedy[1, 3])  # a stop for row 0's 2nd token, one for row 1's 4th
    stops = {first, second}
    out = generate(
        graphdef,
        state,
        prompts,
        valid,
        jax.random.key(0),
        SamplingParams(max_new_tokens=6, stop_token=first, pad_token=0, temperature=0.0, stop_tokens=(second,)),
    )
    for row in range(3):
        hits = [i for i, t in enumerate(greedy[row]) if t in stops]
        expected_len = hits[0] + 1 if hits else 6
        assert out.lengths[row] == expected_len
        np.testing.assert_array_equal(np.asarray(out.tokens)[row, :expected_len], greedy[row, :expected_len])
    assert out.lengths[0] <= 2 and out.lengths[1] <= 4


def test_top_k_one_is_greedy_and_sampling_is_deterministic_per_key():
    _, graphdef, state, prompts, valid = _setup()
    greedy = generate(
        graphdef,
        state,
        prompts,
        valid,
        jax.random.key(0),
        SamplingParams(max_new_tokens=4, stop_token=99, temperature=0.0),
    )
    top1 = generate(
        graphdef,
        state,
        prompts,
        valid,
        jax.random.key(5),
        SamplingParams(max_new_tokens=4, stop_token=99, temperature=1.0, top_k=1),
    )
    np.testing.assert_array_equal(greedy.tokens, top1.tokens)
    p = SamplingParams(max_new_tokens=4, stop_token=99)
    a = generate(graphdef, state, prompts, valid, jax.random.key(7), p)
    b = generate(graphdef, state, prompts, valid, jax.random.key(7), p)
    np.testing.assert_array_equal(a.tokens, b.tokens)


def test_filter_logits_by_hand():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
    neg = jnp.finfo(jnp.float32).min
    k2 = filter_logits(logits, top_k=2, top_p=1.0)
    assert (k2[0, 2:] == neg).all() and (k2[0, :2] == logits[0, :2]).all()
    # nucleus 0.7: 0.5 alone is below 0.7, 0.5 + 0.3 reaches it -> keep the first two
    p = filter_logits(logits, top_k=0, top_p=0.7)
    assert (p[0, :2] == logits[0, :2]).all() and (p[0, 2:] == neg).all()
    # nucleus 0.9: 0.5 + 0.3 = 0.8 < 0.9 -> keep three
    p = filter_logits(logits, top_k=0, top_p=0.9)
    assert (p[0, :3] == logits[0, :3]).all() and p[0, 3] == neg


def _group_setup(group_size=3):
    cfg = ModelConfig(vocab_size=16, hidden_size=32, intermediate_size=48, num_layers=2)
    model = Transformer(cfg, rngs=nnx.Rngs(2))
    graphdef, state = nnx.split(model)
    prompts = np.array([[0, 0, 2, 5, 6, 7], [2, 7, 8, 9, 4, 3], [0, 0, 0, 2, 3, 3]], np.int32)
    valid = prompts != 0
    return model, graphdef, state, prompts, valid, group_size


def test_shared_prefill_greedy_equals_repeated_prompts():
    _, graphdef, state, prompts, valid, g = _group_setup()
    params = SamplingParams(max_new_tokens=7, stop_token=99, temperature=0.0)
    shared = generate_groups(graphdef, state, prompts, valid, jax.random.key(0), params, g)
    plain = generate(graphdef, state, np.repeat(prompts, g, 0), np.repeat(valid, g, 0), jax.random.key(0), params)
    np.testing.assert_array_equal(shared.tokens, plain.tokens)
    np.testing.assert_array_equal(shared.lengths, plain.lengths)
    np.testing.assert_allclose(shared.logprobs, plain.logprobs, atol=1e-6)


@pytest.mark.slow  # compile-heavy: tens of seconds of XLA compilation
def test_shared_prefill_sampling_equals_repeated_prompts_and_trainer():
    model, graphdef, state, prompts, valid, g = _group_setup(4)
    params = SamplingParams(max_new_tokens=6, stop_token=5, temperature=0.9, top_k=8, top_p=0.95)
    rep_prompts, rep_valid = np.repeat(prompts, g, 0), np.repeat(valid, g, 0)
    shared = generate_groups(graphdef, state, prompts, valid, jax.random.key(11), params, g)
    again = generate_groups(graphdef, state, prompts, valid, jax.random.key(11), params, g)
    plain = generate(graphdef, state, rep_prompts, rep_valid, jax.random.key(11), params)
    np.testing.assert_array_equal(shared.tokens, again.tokens)  # deterministic from the key
    # same batch layout and key as the repeated path: the same random draws, the same samples
    np.testing.assert_array_equal(shared.tokens, plain.tokens)
    np.testing.assert_array_equal(shared.lengths, plain.lengths)
    np.testing.assert_allclose(shared.logprobs, plain.logprobs, atol=1e-5)
    # samples of one group differ (they share the prefill, not the draws)
    assert len({tuple(t) for t in np.asarray(shared.tokens[:g])}) > 1
    # and the behaviour logprobs are what the trainer recomputes
    tokens = np.concatenate([rep_prompts, np.asarray(shared.tokens)], 1)
    mask = np.concatenate([rep_valid, np.ones_like(shared.tokens, bool)], 1)
    logits = forward(model, jnp.asarray(tokens), jnp.asarray(mask))[:, prompts.shape[1] - 1 : -1]
    recomputed = token_logprobs(logits, jnp.asarray(shared.tokens), 0.9)
    live = np.arange(params.max_new_tokens)[None, :] < np.asarray(shared.lengths)[:, None]
    np.testing.assert_allclose(np.where(live, shared.logprobs, 0), np.where(live, recomputed, 0), atol=1e-5)


@pytest.mark.slow  # compile-heavy: tens of seconds of XLA compilation
@pytest.mark.parametrize("max_chunk_rows", [1024, 6, 4])
def test_sample_completions_shared_prefill_equals_repeated_path(max_chunk_rows):
    _, graphdef, state, _, _, _ = _group_setup()
    prompts = ["12", "3456", "7", "89", "0"]
    g = 2
    params = SamplingParams(max_new_tokens=5, stop_token=STOP, temperature=1.0)

    def run(shared):
        return sample_completions(
            LoadedPolicy(graphdef, state, DigitTokenizer()),
            prompts,
            g,
            params,
            jax.random.key(4),
            max_chunk_rows=max_chunk_rows,
            shared_prefill=shared,
        )

    shared, plain = run(True), run(False)
    assert shared.tokens.shape == (len(prompts) * g, 5)
    np.testing.assert_array_equal(shared.prompt_tokens, plain.prompt_tokens)
    np.testing.assert_array_equal(shared.tokens, plain.tokens)
    np.testing.assert_array_equal(shared.lengths, plain.lengths)
    np.testing.assert_array_equal(shared.stopped, plain.stopped)
    np.testing.assert_allclose(shared.logprobs, plain.logprobs, atol=1e-5)
    assert shared.texts == plain.texts
    # the default is the shared path
    default = sample_completions(
        LoadedPolicy(graphdef, state, DigitTokenizer()),
        prompts,
        g,
        params,
        jax.random.key(4),
        max_chunk_rows=max_chunk_rows,
    )
    np.testing.assert_array_equal(default.tokens, shared.tokens)


def test_a_sample_is_the_same_in_any_shard_of_the_same_shape():
    """Per-sample keys: split 6 prompts into shards of 3 two ways (batches padded to 3 prompts and one
    prompt length); every completion comes out bit for bit the same as sampled all together."""
    graphdef, state = nnx.split(
        Transformer(ModelConfig(vocab_size=16, hidden_size=32, intermediate_size=48), rngs=nnx.Rngs(3))
    )
    prompts, g = ["12", "3456", "7", "89", "0", "555"], 4
    params = SamplingParams(max_new_tokens=6, stop_token=1, temperature=1.0)

    def sample(ids):
        out = sample_completions(
            LoadedPolicy(graphdef, state, DigitTokenizer()),
            [prompts[i] for i in ids],
            g,
            params,
            jax.random.key(9),
            prompt_ids=ids,
            chunk_rows=3 * g,
            prompt_length=5,
        )
        return {(i, j): (out.tokens[k * g + j], out.logprobs[k * g + j]) for k, i in enumerate(ids) for j in range(g)}

    whole = {**sample([0, 1, 2]), **sample([3, 4, 5])}
    other = {**sample([1, 3, 5]), **sample([0, 2]), **sample([4])}  # another plan; short shards padded to 3
    for sample_id, (tokens, logprobs) in whole.items():
        np.testing.assert_array_equal(other[sample_id][0], tokens)
        np.testing.assert_array_equal(other[sample_id][1], logprobs)
    assert len({tuple(whole[(0, j)][0]) for j in range(g)}) > 1  # the samples of a group differ


def test_compile_counter_counts_sampler_compilations():
    _, graphdef, state, prompts, valid, g = _group_setup()
    params = SamplingParams(max_new_tokens=3, stop_token=99, temperature=0.0)
    counter = CompileCounter()
    before = jit_cache_sizes()
    with counter:
        generate_groups(graphdef, state, prompts, valid, jax.random.key(0), params, 5)  # new group size: compiles
    assert counter.count >= 1
    assert jit_cache_sizes()["generate_groups"] == before["generate_groups"] + 1
    with CompileCounter() as steady:
        generate_groups(graphdef, state, prompts, valid, jax.random.key(1), params, 5)  # same shapes: cached
    assert steady.count == 0
    mark = compile_count()
    generate_groups(graphdef, state, prompts[:2], valid[:2], jax.random.key(1), params, 5)  # new shape
    assert compile_count() > mark


def test_on_chunk_sees_every_chunk_in_order_and_changes_nothing():
    _, graphdef, state, _, _, _ = _group_setup()
    prompts, g = ["12", "3456", "7", "89", "0"], 2
    params = SamplingParams(max_new_tokens=5, stop_token=STOP, temperature=1.0)
    chunks = []
    run = lambda **kw: sample_completions(  # noqa: E731
        LoadedPolicy(graphdef, state, DigitTokenizer()), prompts, g, params, jax.random.key(4), max_chunk_rows=4, **kw
    )
    seen, plain = run(on_chunk=chunks.append), run()
    assert [len(c.texts) for c in chunks] == [4, 4, 2]
    np.testing.assert_array_equal(np.concatenate([c.tokens for c in chunks]), plain.tokens)
    assert [t for c in chunks for t in c.texts] == plain.texts == seen.texts
    np.testing.assert_array_equal(np.concatenate([c.stopped for c in chunks]), plain.stopped)
    np.testing.assert_array_equal(seen.logprobs, plain.logprobs)
