"""A policy's static parts (graph definition, parameter template) and pure-dict <-> State conversion.

Storage holds parameters as nested dicts of arrays ("pure" dicts); jitted code takes nnx.State.
A parameter's flat path joins its keys with dots ("layers.0.self_attn.q_proj.kernel").
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from flax import nnx

from spotrl import distributed
from spotrl.config import ModelConfig
from spotrl.model.transformer import Transformer


@functools.lru_cache(maxsize=8)
def _abstract_model(cfg: ModelConfig) -> tuple[nnx.GraphDef, nnx.State]:
    model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))  # seconds for a large model: cached
    return nnx.split(model)


def abstract_model(cfg: ModelConfig) -> tuple[nnx.GraphDef, nnx.State]:
    """Graph definition and shape-only state of our Transformer for `cfg` (allocates nothing)."""
    graphdef, state = _abstract_model(cfg)
    return graphdef, jax.tree.map(lambda x: x, state)  # a fresh State: callers fill it in place


def flat_params(tree: Mapping, prefix: str = "") -> dict[str, Any]:
    """A nested pure dict as {flat path: leaf}."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out.update(flat_params(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Our flat parameter path -> shape."""
    _, state = abstract_model(cfg)
    return {k: tuple(v.shape) for k, v in flat_params(nnx.to_pure_dict(state)).items()}


class Policy:
    def __init__(self, config: ModelConfig, init_seed: int = 0, params: dict | None = None):
        """A randomly initialised policy, or (`params`: a nested pure dict, e.g. from hf.loader.load_params) one
        whose initial state is those parameters, without materialising a random model first."""
        self.config = config
        if params is None:
            model = Transformer(config, rngs=nnx.Rngs(init_seed))
            self.graphdef, self.init_state = nnx.split(model)
        else:
            self.graphdef, self.init_state = abstract_model(config)
            nnx.replace_by_pure_dict(self.init_state, params)
        # parameters laid out over several devices (model.mesh): keep every later copy in that layout
        self.sharded = any(len(x.sharding.device_set) > 1 for x in jax.tree.leaves(self.init_state))
        # ... over the devices of several processes (a multi-host trainer): see to_state
        self.spans_processes = any(distributed.spans_processes(x) for x in jax.tree.leaves(self.init_state))

    def to_state(self, params: dict) -> nnx.State:
        """Host (or device) arrays as State; on a mesh, each array goes where the initial one lives.

        When the trainer's mesh spans processes, pulled weights go to this process's first device
        instead: rollouts and evaluations run in one process (process 0's flow), and a computation
        on the global mesh would wait for processes that are not running it."""
        state = jax.tree.map(lambda x: x, self.init_state)
        if self.spans_processes:
            local = jax.local_devices()[0]
            placed = jax.tree.map(lambda x: jax.device_put(np.asarray(x), local), params)
        elif self.sharded:
            placed = jax.tree.map(lambda x, t: jax.device_put(x, t.sharding), params, nnx.to_pure_dict(self.init_state))
        else:
            placed = jax.tree.map(jax.numpy.asarray, params)
        nnx.replace_by_pure_dict(state, placed)
        return state

    def place(self, tree):
        """On a mesh, every leaf that one device holds (the optimizer's step count, a critic) replicated
        over the mesh: a jitted step refuses arguments on different device sets."""
        if not self.sharded:
            return tree
        mesh = next(x.sharding.mesh for x in jax.tree.leaves(self.init_state) if len(x.sharding.device_set) > 1)
        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        # a process cannot device_put onto other processes' devices: each fills its own from the same value
        put = distributed.put_global if self.spans_processes else jax.device_put
        return jax.tree.map(lambda x: x if len(x.sharding.device_set) > 1 else put(x, replicated), tree)

    @staticmethod
    def to_pure(state: nnx.State) -> dict:
        """Host arrays. Parameters spanning processes are gathered: a collective, every process calls it."""
        return distributed.to_host(nnx.to_pure_dict(state))

    def template(self) -> dict:
        return nnx.to_pure_dict(self.init_state)
