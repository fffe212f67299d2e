"""A policy's static parts (graph definition, parameter template) and pure-dict <-> State conversion.

Storage holds parameters as nested dicts of arrays ("pure" dicts); jitted code takes nnx.State.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from spotrl.model.config import ModelConfig
from spotrl.model.transformer import Transformer


class Policy:
    def __init__(self, config: ModelConfig, init_seed: int = 0, params: dict | None = None):
        """A randomly initialised policy, or (`params`: a nested pure dict, e.g. from hf.load_params) one
        whose initial state is those parameters, without materialising a random model first."""
        self.config = config
        if params is None:
            model = Transformer(config, rngs=nnx.Rngs(init_seed))
            self.graphdef, self.init_state = nnx.split(model)
        else:
            from spotrl.model.hf import abstract_model

            self.graphdef, self.init_state = abstract_model(config)
            nnx.replace_by_pure_dict(self.init_state, params)

    def to_state(self, params: dict) -> nnx.State:
        state = jax.tree.map(lambda x: x, self.init_state)
        nnx.replace_by_pure_dict(state, jax.tree.map(jax.numpy.asarray, params))
        return state

    @staticmethod
    def to_pure(state: nnx.State) -> dict:
        return jax.tree.map(np.asarray, nnx.to_pure_dict(state))

    def template(self) -> dict:
        return nnx.to_pure_dict(self.init_state)
