"""pass@k with the unbiased estimator of Chen et al. (2021)."""

from __future__ import annotations

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn without replacement from n (c correct) is correct.

    1 - C(n-c, k) / C(n, k), computed as a stable product.
    """
    if not 0 < k <= n:
        raise ValueError(f"pass@k needs 0 < k <= n, got k={k}, n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"correct count c={c} outside [0, n={n}]")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def mean_pass_at_k(correct_counts, n: int, k: int) -> float:
    """Mean of pass@k over problems, each with n samples and correct_counts[i] correct."""
    counts = list(correct_counts)
    if not counts:
        raise ValueError("no problems to evaluate")
    return float(np.mean([pass_at_k(n, int(c), k) for c in counts]))
