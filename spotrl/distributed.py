"""A run over several processes (a TPU pod slice, several GPU hosts): JAX's multi-controller runtime.

Every process calls `initialize()` before any JAX computation; afterwards `jax.devices()` lists the
devices of all processes, so the trainer's mesh (`model.mesh`) spans hosts, and each process holds
the shards on its own devices. Process 0 runs the Prefect flow and alone writes what a run writes
once (records, weight versions, seals); the others follow the trainer's stages (spotrl/tasks/spmd.py).

Where the topology comes from (first match wins), read from the environment only: the values
differ per process and per attempt, so they are not part of the run's config (its identity):
  - SPOTRL_NUM_PROCESSES > 1: coordinator SPOTRL_COORDINATOR_ADDRESS (or JAX_COORDINATOR_ADDRESS),
    process id SPOTRL_PROCESS_ID (or JOB_COMPLETION_INDEX, set in each pod of a Kubernetes indexed Job);
  - SPOTRL_DISTRIBUTED=auto: JAX's own cluster detection (Cloud TPU pod slices, SLURM, Open MPI, ...);
  - otherwise one process, and nothing here does anything.
SPOTRL_DISTRIBUTED_TIMEOUT (seconds, default 300): how long a process waits for the others to join.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import numpy as np

ENV_NUM_PROCESSES = "SPOTRL_NUM_PROCESSES"
ENV_PROCESS_ID = "SPOTRL_PROCESS_ID"
ENV_COORDINATOR = "SPOTRL_COORDINATOR_ADDRESS"
ENV_MODE = "SPOTRL_DISTRIBUTED"
ENV_TIMEOUT = "SPOTRL_DISTRIBUTED_TIMEOUT"


class DistributedError(RuntimeError):
    pass


@dataclasses.dataclass(frozen=True)
class Topology:
    """What `jax.distributed.initialize` is given; None fields are left to JAX's cluster detection."""

    coordinator_address: str | None
    num_processes: int | None
    process_id: int | None
    timeout_seconds: int = 300


def _int_env(env, name: str) -> int | None:
    value = env.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise DistributedError(f"{name}={value!r} is not an integer") from None


def topology_from_env(env=None) -> Topology | None:
    """The topology the environment asks for, or None for a one-process run. Names the bad variable."""
    env = os.environ if env is None else env
    timeout = _int_env(env, ENV_TIMEOUT) or 300
    count = _int_env(env, ENV_NUM_PROCESSES)
    if count is not None and count > 1:
        coordinator = env.get(ENV_COORDINATOR) or env.get("JAX_COORDINATOR_ADDRESS")
        if not coordinator:
            raise DistributedError(f"{ENV_NUM_PROCESSES}={count} needs {ENV_COORDINATOR}=host:port (process 0's)")
        pid = _int_env(env, ENV_PROCESS_ID)
        pid = _int_env(env, "JOB_COMPLETION_INDEX") if pid is None else pid
        if pid is None or not 0 <= pid < count:
            raise DistributedError(
                f"{ENV_NUM_PROCESSES}={count} needs {ENV_PROCESS_ID} (or JOB_COMPLETION_INDEX) in 0..{count - 1}, "
                f"got {pid}"
            )
        return Topology(coordinator, count, pid, timeout)
    mode = env.get(ENV_MODE, "off")
    if mode == "auto":
        return Topology(None, None, None, timeout)
    if mode not in ("off", ""):
        raise DistributedError(f"{ENV_MODE}={mode!r}: expected 'auto' or 'off'")
    return None


_initialized: Topology | None = None


def initialize(env=None) -> Topology | None:
    """Join the processes of the run (idempotent); call before any JAX computation."""
    global _initialized
    topology = topology_from_env(env)
    if topology is None or _initialized is not None:
        return _initialized or topology
    # CPU processes reduce over gloo (TCP): the 2-process tests, and CPU-only hosts
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=topology.coordinator_address,
        num_processes=topology.num_processes,
        process_id=topology.process_id,
        initialization_timeout=topology.timeout_seconds,
    )
    _initialized = topology
    return topology


def _joined() -> bool:
    # without a join, asking JAX would start its backends, after which a join is refused
    return _initialized is not None or jax.distributed.is_initialized()


def process_count() -> int:
    return jax.process_count() if _joined() else 1


def process_index() -> int:
    return jax.process_index() if _joined() else 0


def is_primary() -> bool:
    """Process 0: the one that talks to Prefect and writes the run's records and weights."""
    return process_index() == 0


def spans_processes(x) -> bool:
    """An array with shards on other processes' devices (reading it needs them all)."""
    return isinstance(x, jax.Array) and not x.is_fully_addressable


def to_host(tree):
    """Every leaf as a numpy array. A leaf spanning processes is gathered from all of them, which
    is a collective: every process must call this with the same tree."""
    from jax.experimental import multihost_utils

    def one(x):
        if spans_processes(x) and not x.is_fully_replicated:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(x)

    return jax.tree.map(one, tree)


def put_global(host: np.ndarray, sharding: jax.sharding.Sharding) -> jax.Array:
    """A host array (the same value in every process) placed by `sharding`, each process filling
    the shards on its own devices (`jax.device_put` cannot address other processes' devices)."""
    host = np.asarray(host)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


# --- process 0 -> the others: which trainer stage to run next ------------------------------------
# Through the coordination service's key-value store (JAX's distributed client), not a device
# collective: a follower may wait minutes (rollouts run on process 0 only) without a collective timing out.

_KEY = "spotrl/call/{:08d}"
_sent = 0
_received = 0


def _client():
    from jax._src.distributed import global_state  # the client orbax and multihost_utils use too

    if global_state.client is None:
        raise DistributedError("not a multi-process run: spotrl.distributed.initialize() did not join one")
    return global_state.client


def announce(message: dict) -> None:
    """Process 0: tell the other processes the next call (JSON-able), in order."""
    global _sent
    _client().key_value_set(_KEY.format(_sent), json.dumps(message, sort_keys=True))
    _sent += 1


def next_call(timeout_seconds: float = 24 * 3600) -> dict:
    """A follower: the next call process 0 announced (blocks until it comes)."""
    global _received
    value = _client().blocking_key_value_get(_KEY.format(_received), int(timeout_seconds * 1000))
    _received += 1
    return json.loads(value)
