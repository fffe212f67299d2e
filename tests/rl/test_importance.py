"""spotrl/rl/importance.py on a hand-computed example."""

import math

import numpy as np
import pytest

from spotrl.rl.importance import importance_statistics, truncated_weights

PROX = np.array([[-1.0, -2.0, -0.5], [-1.0, -3.0, -9.0]])
BEHAVIOUR = np.array([[-1.0, -2.5, -0.5], [-2.0, -3.0, 0.0]])
MASK = np.array([[True, True, False], [True, True, False]])  # the last tokens are padding
# prox - behaviour on the valid tokens: 0, 0.5, 1, 0


def test_statistics_over_the_valid_tokens():
    stats = importance_statistics(PROX, BEHAVIOUR, MASK, cap=2.0)
    ratios = [1.0, math.exp(0.5), math.exp(1.0), 1.0]
    assert stats["logprob_max_abs_diff"] == pytest.approx(1.0)
    assert stats["importance_ratio_mean"] == pytest.approx(sum(ratios) / 4)
    assert stats["importance_ratio_min"] == pytest.approx(1.0)
    assert stats["importance_ratio_max"] == pytest.approx(math.e)
    assert stats["importance_truncated_frac"] == pytest.approx(0.25)  # only e > 2


def test_no_valid_token_gives_no_statistics():
    assert importance_statistics(PROX, BEHAVIOUR, np.zeros_like(MASK), cap=2.0) == {}


def test_truncated_weights():
    weights = truncated_weights(PROX, BEHAVIOUR, MASK, cap=2.0)
    assert weights.dtype == np.float32
    expected = np.array([[1.0, math.exp(0.5), 1.0], [2.0, 1.0, 1.0]], np.float32)  # masked tokens: 1
    np.testing.assert_allclose(weights, expected, rtol=1e-6)
    # the same numbers as the expression the update stage used before it moved here
    np.testing.assert_array_equal(
        weights, np.minimum(np.exp(np.where(MASK, PROX - BEHAVIOUR, 0.0)), 2.0).astype(np.float32)
    )
