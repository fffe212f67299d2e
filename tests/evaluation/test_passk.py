import itertools

import pytest

from spotrl.evaluation.passk import mean_pass_at_k, pass_at_k


def brute_force(n: int, c: int, k: int) -> float:
    """Fraction of all k-subsets of n samples (c correct) that hold a correct one."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 4, 8, 10])
def test_matches_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_force(n, c, k), abs=1e-12)


def test_by_hand_and_mean():
    assert pass_at_k(16, 2, 1) == pytest.approx(2 / 16)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 3 of the 6 pairs hold the correct one
    assert mean_pass_at_k([0, 4], 4, 2) == pytest.approx(0.5)


@pytest.mark.parametrize("args", [(4, 1, 5), (4, 1, 0), (4, 5, 1)])
def test_rejects_impossible(args):
    with pytest.raises(ValueError):
        pass_at_k(*args)
