"""FleetModel: the numbers a rollout fleet and its trainer are described by.

Measured on a run (calibrate.py) or given (`spotrl simulate --set worker.tokens_per_s=2500`). Times
in seconds, sizes in bytes, prices per hour. One iteration: `prompts` prompts x `group_size`
completions, whose lengths follow `lengths`; each prompt's group is generated on one worker (its
prefix is shared), so a shard is a block of whole groups.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np


@dataclass(frozen=True)
class Lengths:
    """Completion lengths in tokens: lognormal (median, sigma) capped at `max_tokens`, or, when
    `samples` is given, drawn from those measured lengths."""

    median: float = 600.0
    sigma: float = 1.0
    max_tokens: int = 8192
    samples: tuple[int, ...] = ()

    def draw(self, rng: np.random.Generator, shape) -> np.ndarray:
        if self.samples:
            return rng.choice(np.asarray(self.samples, dtype=np.int64), size=shape)
        raw = rng.lognormal(math.log(self.median), self.sigma, size=shape)
        return np.clip(np.rint(raw), 1, self.max_tokens).astype(np.int64)

    def mean(self) -> float:
        """E[min(X, cap)] for X lognormal: exp(mu + s^2/2) Phi((ln c - mu - s^2)/s) + c (1 - Phi((ln c - mu)/s))."""
        if self.samples:
            return float(np.mean(self.samples))
        mu, s, cap = math.log(self.median), self.sigma, float(self.max_tokens)
        if s == 0:
            return min(self.median, cap)
        phi = NormalDist().cdf
        z = (math.log(cap) - mu) / s
        return math.exp(mu + s * s / 2) * phi(z - s) + cap * (1 - phi(z))

    def std(self) -> float:
        """Standard deviation of min(X, cap): E[min(X, c)^2] = exp(2 mu + 2 s^2) Phi((ln c - mu - 2 s^2)/s)
        + c^2 (1 - Phi((ln c - mu)/s)), less the squared mean."""
        if self.samples:
            return float(np.std(self.samples))
        mu, s, cap = math.log(self.median), self.sigma, float(self.max_tokens)
        if s == 0:
            return 0.0
        phi = NormalDist().cdf
        z = (math.log(cap) - mu) / s
        second = math.exp(2 * mu + 2 * s * s) * phi(z - 2 * s) + cap * cap * (1 - phi(z))
        return math.sqrt(max(0.0, second - self.mean() ** 2))

    def slowest_sum(self, n: int, blocks: int) -> float:
        """About the largest of `blocks` sums of n completions each: mean + z sd sqrt(n), z the normal
        1 - 1/(blocks+1) quantile (0 for one block), at most n x the cap."""
        z = NormalDist().inv_cdf(1 - 1 / (blocks + 1)) if blocks > 1 else 0.0
        return min(n * self.mean() + z * self.std() * math.sqrt(n), n * float(self.max_tokens))

    def longest(self, n: int) -> float:
        """About the longest of n completions: the 1 - 1/(n+1) quantile."""
        q = 1 - 1 / (n + 1)
        if self.samples:
            return float(np.quantile(self.samples, q))
        return min(float(self.max_tokens), self.median * math.exp(self.sigma * NormalDist().inv_cdf(q)))


@dataclass(frozen=True)
class Workload:
    prompts: int = 1024
    group_size: int = 8
    lengths: Lengths = field(default_factory=Lengths)
    shards: int | None = None  # a fixed number of shards (a run's rollout.shards); None: one per worker

    @property
    def samples(self) -> int:
        return self.prompts * self.group_size

    def mean_tokens(self) -> float:
        """Completion tokens of one iteration, on average."""
        return self.samples * self.lengths.mean()


@dataclass(frozen=True)
class WorkerSpeed:
    """One rollout worker."""

    tokens_per_s: float = 2500.0  # decode throughput with a full batch
    sequence_tokens_per_s: float | None = 30.0  # one sequence's decode rate: a long tail's floor (None: none)
    shard_overhead_s: float = 2.0  # per shard: dispatch, prefill, writing the shard
    cold_start_s: float = 90.0  # process start and compilation (the weight pull comes on top)

    def shard_seconds(self, tokens: float, longest: float) -> float:
        """Generation time of a shard: bound by throughput, or by its longest completion."""
        floor = longest / self.sequence_tokens_per_s if self.sequence_tokens_per_s else 0.0
        return self.shard_overhead_s + max(tokens / self.tokens_per_s, floor)


@dataclass(frozen=True)
class TrainerSpeed:
    update_s_per_token: float = 6e-6  # the update's time grows with the iteration's completion tokens
    update_fixed_s: float = 10.0
    overhead_s: float = 5.0  # per iteration besides update and publish: rewards, checkpoint, bookkeeping
    cold_start_s: float = 120.0  # the first update's compilation

    def iteration_seconds(self, tokens: float) -> float:
        return self.update_fixed_s + self.update_s_per_token * tokens + self.overhead_s


@dataclass(frozen=True)
class Network:
    weight_bytes: float = 15e9  # one published weight version (a 7B model in bfloat16)
    publish_bytes_per_s: float = 2.5e9  # trainer -> weight store
    pull_bytes_per_s: float = 1.25e9  # weight store -> one worker
    store_bytes_per_s: float | None = 100e9  # the store's total egress, shared by workers pulling at once

    def publish_seconds(self) -> float:
        return self.weight_bytes / self.publish_bytes_per_s

    def pull_seconds(self, pulling: int) -> float:
        """A worker's pull while `pulling` workers pull the same version at once."""
        rate = self.pull_bytes_per_s
        if self.store_bytes_per_s:
            rate = min(rate, self.store_bytes_per_s / max(pulling, 1))
        return self.weight_bytes / rate


@dataclass(frozen=True)
class Market:
    spot_per_hour: float = 1.0  # a rollout worker on spot capacity
    on_demand_per_hour: float = 3.0  # a rollout worker on on-demand capacity
    trainer_per_hour: float = 24.0  # the trainer (all its accelerators), on demand
    spot: bool = True  # rollout workers run on spot capacity (cheaper, preemptible)
    preemptions_per_hour: float = 0.05  # per spot worker-hour (Poisson)
    notice_s: float = 30.0  # warning before a preemption: a shard that ends within it is kept
    replace_s: float = 60.0  # a preempted worker's replacement is requested this long after

    @property
    def worker_per_hour(self) -> float:
        return self.spot_per_hour if self.spot else self.on_demand_per_hour

    @property
    def preemption_rate(self) -> float:
        """Preemptions per worker-second (0 on demand)."""
        return self.preemptions_per_hour / 3600 if self.spot else 0.0


@dataclass(frozen=True)
class FleetModel:
    workload: Workload = field(default_factory=Workload)
    worker: WorkerSpeed = field(default_factory=WorkerSpeed)
    trainer: TrainerSpeed = field(default_factory=TrainerSpeed)
    network: Network = field(default_factory=Network)
    market: Market = field(default_factory=Market)


# The defaults above: a 7B policy's RL on a long-tailed math workload (1024 prompts x 8 completions,
# median 600 tokens, lognormal sigma 1, capped at 8192), spot rollout GPUs at $1/h, an 8-GPU trainer
# on demand. Illustrative magnitudes, not a measurement: benchmarks/fleet.py states them.
LONG_TAILED = FleetModel()


def with_overrides(model: FleetModel, overrides: dict[str, object]) -> FleetModel:
    """`model` with dotted keys replaced: {"worker.tokens_per_s": 3000, "workload.lengths.sigma": 1.5}.
    An unknown key is a KeyError naming it; values are converted to the field's current type."""
    for key, value in overrides.items():
        model = _replace(model, key.split("."), value, key)
    return model


def _replace(node, path: list[str], value, key: str):
    names = {f.name for f in dataclasses.fields(node)}
    if path[0] not in names:
        raise KeyError(f"no fleet model key {key!r} (at {path[0]!r}; known here: {sorted(names)})")
    current = getattr(node, path[0])
    if len(path) > 1:
        if not dataclasses.is_dataclass(current):
            raise KeyError(f"no fleet model key {key!r}: {path[0]!r} is a number")
        return dataclasses.replace(node, **{path[0]: _replace(current, path[1:], value, key)})
    return dataclasses.replace(node, **{path[0]: _convert(value, current, key)})


def _convert(value, current, key: str):
    if not isinstance(value, str):
        return value
    if value.lower() in ("none", "null"):
        return None
    if isinstance(current, bool):
        if value.lower() not in ("true", "false"):
            raise ValueError(f"{key}: expected true or false, got {value!r}")
        return value.lower() == "true"
    if isinstance(current, int):
        return int(value)
    if isinstance(current, tuple):
        return tuple(int(v) for v in value.split(",") if v)
    if current is None:  # an optional number: an integer if it reads as one
        return int(value) if value.lstrip("-").isdigit() else float(value)
    return float(value)


def as_dict(model: FleetModel) -> dict:
    """The model as plain data (measured lengths summarised: there may be many)."""
    out = dataclasses.asdict(model)
    samples = out["workload"]["lengths"].pop("samples")
    if samples:
        out["workload"]["lengths"]["measured"] = {
            "count": len(samples),
            "mean": float(np.mean(samples)),
            "max": int(max(samples)),
        }
    return out
