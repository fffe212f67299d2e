"""Advantage estimators, in a registry keyed by name (GRPO first; others plug in the same way)."""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp

from spotrl.registry import Registry

ADVANTAGE_ESTIMATORS: Registry[Callable[..., jnp.ndarray]] = Registry("advantage estimator")


@ADVANTAGE_ESTIMATORS.register("grpo")
def group_normalized_advantages(rewards: jnp.ndarray, eps: float = 1e-4) -> jnp.ndarray:
    """GRPO: (r - mean(group)) / (std(group) + eps) for rewards [groups, group_size].

    The population standard deviation (ddof=0) is used; a group whose rewards are all equal gets
    advantage 0 for every sample.
    """
    mean = rewards.mean(axis=-1, keepdims=True)
    std = rewards.std(axis=-1, keepdims=True)
    return (rewards - mean) / (std + eps)
