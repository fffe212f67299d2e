"""Importance weights between the trainer's policy and the sampler's: the correction for stale rollouts.

The trainer rescores the sampled tokens with its own weights (the "proximal" policy). On-policy its
logprobs must equal the sampler's (the alignment statistics check it); off-policy the ratio
exp(prox - behaviour), truncated at `cap`, reweights each token.
"""

from __future__ import annotations

import numpy as np


def importance_statistics(prox_logprobs, behaviour_logprobs, mask, cap: float) -> dict:
    """Trainer/sampler alignment and importance-ratio statistics over the valid tokens ({} without any)."""
    diff = (prox_logprobs - behaviour_logprobs)[mask]
    if diff.size == 0:
        return {}
    ratio = np.exp(diff)
    return {
        "logprob_max_abs_diff": float(np.abs(diff).max()),
        "importance_ratio_mean": float(ratio.mean()),
        "importance_ratio_min": float(ratio.min()),
        "importance_ratio_max": float(ratio.max()),
        "importance_truncated_frac": float((ratio > cap).mean()),
    }


def truncated_weights(prox_logprobs, behaviour_logprobs, mask, cap: float) -> np.ndarray:
    """min(exp(prox - behaviour), cap) per token, float32; min(1, cap) on the tokens outside `mask`."""
    return np.minimum(np.exp(np.where(mask, prox_logprobs - behaviour_logprobs, 0.0)), cap).astype(np.float32)
