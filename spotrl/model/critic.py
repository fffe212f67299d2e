"""PPO's critic: a scalar value per token, from the policy's own trunk or from a trunk of its own.

"shared": a linear head on the policy's final hidden states; the value loss also trains the trunk.
"separate": a second transformer, initialised from the policy's warm-start weights (the usual
choice of critic initialisation), with its own head; policy and critic share nothing.
The critic is never published: rollout workers only need the policy.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from spotrl.config import ModelConfig
from spotrl.model.transformer import Dense, Transformer, forward_hidden


class Critic(nnx.Module):
    def __init__(self, cfg: ModelConfig, separate: bool, *, rngs: nnx.Rngs):
        self.trunk = Transformer(cfg, rngs=rngs) if separate else None
        # zero init: the first value estimates are 0, so early advantages are the plain returns
        self.head = Dense(cfg.hidden_size, 1, kernel_init=nnx.initializers.zeros, rngs=rngs)

    def __call__(self, policy: Transformer, tokens: jax.Array, valid: jax.Array) -> jax.Array:
        """Values [B, T] (float32) for every position of left-padded rows."""
        hidden = forward_hidden(self.trunk if self.trunk is not None else policy, tokens, valid)
        return self.head(hidden)[..., 0].astype(jnp.float32)
