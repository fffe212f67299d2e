import numpy as np
import pytest

from spotrl.rewards.score import score
from spotrl.rewards.verifiers import get_verifier, reversed_digits_exact


@pytest.mark.parametrize(
    "completion, stopped, answer, expected",
    [
        ("753", True, "357", 1.0),
        ("753", False, "357", 0.0),  # cut off at the token limit
        ("357", True, "357", 0.0),  # not reversed
        ("7530", True, "357", 0.0),  # extra digit
        ("", True, "357", 0.0),
        ("1", True, "1", 1.0),
    ],
)
def test_reversed_digits_exact(completion, stopped, answer, expected):
    assert reversed_digits_exact(completion, stopped, answer) == expected


def test_score_batch_and_unknown_verifier():
    np.testing.assert_array_equal(score("arithmetic", ["21", "3"], [True, True], ["12", "4"]), [1.0, 0.0])
    with pytest.raises(ValueError, match="no verifier 'poetry'"):
        get_verifier("poetry")
