"""Held-out evaluation: pass@k of sampled completions, reported while it samples."""

import jax
import numpy as np
from flax import nnx
from sampling_fixtures import DigitTokenizer

from spotrl.config import ModelConfig
from spotrl.evaluation.evaluate import evaluate_pass_at_k
from spotrl.model.transformer import Transformer
from spotrl.rollout.completions import LoadedPolicy, sample_completions
from spotrl.rollout.sampler import SamplingParams


def test_pass_at_k_and_its_running_report_match_a_count_by_hand():
    graphdef, state = nnx.split(
        Transformer(ModelConfig(vocab_size=12, hidden_size=32, intermediate_size=48), rngs=nnx.Rngs(5))
    )
    prompts, n = ["12", "3456", "7", "89", "0", "31"], 4
    params = SamplingParams(max_new_tokens=3, stop_token=1, temperature=1.0)
    key = jax.random.key(7)
    sampled = sample_completions(LoadedPolicy(graphdef, state, DigitTokenizer()), prompts, n, params, key)
    # the answer of prompt i is the reversed text of one of its samples when that one stopped: i % n
    # samples right at least, the others by chance only
    answers = [sampled.texts[i * n + i % n][::-1] for i in range(len(prompts))]
    correct = np.array(
        [
            [bool(sampled.stopped[i * n + j]) and sampled.texts[i * n + j][::-1] == answers[i] for j in range(n)]
            for i in range(len(prompts))
        ]
    ).sum(axis=1)
    reports = []
    result = evaluate_pass_at_k(
        LoadedPolicy(graphdef, state, DigitTokenizer()),
        "arithmetic",
        prompts,
        answers,
        n=n,
        k=2,
        sampling=params,
        key=key,
        report=lambda done, fields: reports.append((done, fields)),
        max_chunk_rows=8,
    )
    assert result["pass_at_1"] == correct.sum() / (len(prompts) * n)
    # pass@2 by hand: 1 - C(n - c, 2) / C(n, 2) per prompt
    by_hand = np.mean([1 - (n - c) * (n - c - 1) / (n * (n - 1)) for c in correct])
    assert abs(result["pass_at_k"] - by_hand) < 1e-12
    assert result["tokens"] == sampled.num_tokens
    assert reports[-1] == (len(prompts) * n, {"pass@1": f"{result['pass_at_1']:.1%}"})
    assert [done for done, _ in reports] == [8, 16, 24]
