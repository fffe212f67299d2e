"""How many rollout workers an iteration should use: the analytic prediction and the cost-aware choice.

`predict(model, W)` is an iteration's time and cost on W workers, in closed form (the simulator
plays the same model event by event):

    rollout = pull(W) + waves x generation(shard) + preemption delay   (+ cold start / horizon if W grows)
    train   = update(tokens) + overhead + publish
    seconds = rollout + train          (staleness 0: generation waits for the new weights)
              max(rollout, train)      (staleness k >= 1: generation overlaps the updates)
    cost    = seconds x (W x worker price + trainer price) (+ new workers' cold start / horizon)

A shard's generation is bound by throughput (its tokens / tokens_per_s) or by its longest completion
(length / sequence_tokens_per_s): past some W more workers only wait for the long tail, and on a big
fleet the weight pull is bound by the store's egress shared by W workers. Those two are why the
largest fleet is rarely the fastest per dollar (RLHFless's "function imbalance").

`choose_workers` picks W for an objective: least cost within an iteration deadline (absolute, or
`deadline_slack` over the fastest W), or least time within a per-iteration budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from spotrl.fleet.fleet_model import FleetModel
from spotrl.registry import Registry

HORIZON = 10  # iterations a new worker is expected to serve: its cold start is spread over them


@dataclass(frozen=True)
class Prediction:
    workers: int
    seconds: float
    cost: float
    rollout_seconds: float
    train_seconds: float


def predict(
    model: FleetModel, workers: int, staleness: int = 0, new_workers: int = 0, horizon: int = HORIZON
) -> Prediction:
    """One iteration on `workers` rollout workers, `new_workers` of which start cold: their cold
    start's time and cost are spread over the `horizon` iterations they will serve."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    w, speed, market = model.workload, model.worker, model.market
    shards = shard_count(model, workers)
    waves = math.ceil(shards / workers)
    per_shard = math.ceil(w.prompts / shards) * w.group_size
    mean_tokens = per_shard * w.lengths.mean()
    slowest_tokens = w.lengths.slowest_sum(per_shard, shards)  # lengths vary: some shard gets more
    longest = w.lengths.longest(w.samples)
    generation = (waves - 1) * speed.shard_seconds(mean_tokens, 0.0) + speed.shard_seconds(slowest_tokens, longest)
    # a shard hit by a preemption is redone from the start on an idle worker: the iteration ends about
    # as much later as the hit came after the shard's start, half a shard on average
    hit = 1 - math.exp(-market.preemption_rate * min(workers, shards) * generation)
    rollout = model.network.pull_seconds(workers) + generation + hit * generation / 2
    if new_workers:
        rollout += speed.cold_start_s / horizon
    train = model.trainer.iteration_seconds(w.mean_tokens()) + model.network.publish_seconds()
    seconds = rollout + train if staleness == 0 else max(rollout, train)
    per_hour = workers * market.worker_per_hour + market.trainer_per_hour
    cost = (seconds * per_hour + new_workers * speed.cold_start_s * market.worker_per_hour / horizon) / 3600
    return Prediction(workers, seconds, cost, rollout, train)


def shard_count(model: FleetModel, workers: int) -> int:
    """Shards of an iteration: the workload's fixed count, else one per worker (at most one per prompt)."""
    return model.workload.shards or min(workers, model.workload.prompts)


@dataclass(frozen=True)
class Objective:
    kind: Literal["min_cost", "min_time"] = "min_cost"
    deadline_s: float | None = None  # min_cost: the iteration time allowed; None: deadline_slack over the fastest
    deadline_slack: float = 0.1
    budget: float | None = None  # min_time: the cost per iteration allowed; None: no limit

    def describe(self) -> str:
        if self.kind == "min_time":
            return "least time" + (f" within ${self.budget:g}/iteration" if self.budget is not None else "")
        limit = f"{self.deadline_s:g} s" if self.deadline_s is not None else f"{1 + self.deadline_slack:g}x the fastest"
        return f"least cost within {limit}"


@dataclass(frozen=True)
class Decision:
    workers: int
    predicted: Prediction
    objective: str
    feasible: bool  # False: nothing met the deadline (the fastest) or the budget (the cheapest)
    limit: float | None  # the deadline (seconds) or budget (cost) applied


def choose_workers(
    model: FleetModel,
    objective: Objective,
    max_workers: int,
    staleness: int = 0,
    current: int = 0,
    horizon: int = HORIZON,
) -> Decision:
    """The number of rollout workers (1..max_workers) that best meets `objective`; `current` workers
    are warm, more start cold (amortised over `horizon` iterations). Ties go to fewer workers."""
    if max_workers < 1:
        raise ValueError(f"max_workers must be >= 1, got {max_workers}")
    candidates = [predict(model, n, staleness, max(0, n - current), horizon) for n in range(1, max_workers + 1)]
    if objective.kind == "min_time":
        limit = objective.budget
        ok = [p for p in candidates if limit is None or p.cost <= limit]
        best = min(ok or candidates, key=(lambda p: (p.seconds, p.cost)) if ok else (lambda p: (p.cost, p.seconds)))
    else:
        fastest = min(p.seconds for p in candidates)
        limit = objective.deadline_s if objective.deadline_s is not None else fastest * (1 + objective.deadline_slack)
        ok = [p for p in candidates if p.seconds <= limit]
        best = min(ok or candidates, key=(lambda p: (p.cost, p.seconds)) if ok else (lambda p: (p.seconds, p.cost)))
    return Decision(best.workers, best, objective.describe(), bool(ok), limit)


# --- the policies the simulator compares ------------------------------------------------------------
@dataclass(frozen=True)
class FleetPolicy:
    """`workers(model, fleet_size, current)`: the workers an iteration uses on a fleet of at most
    `fleet_size`; `staleness`: the weights lag (0 synchronous, k: iteration i samples with i-1-k)."""

    name: str
    staleness: int
    workers: Callable[[FleetModel, int, int], int]


POLICIES: Registry[FleetPolicy] = Registry("fleet policy")


def _all(model: FleetModel, fleet_size: int, current: int) -> int:
    return fleet_size


def _cost_aware(objective: Objective) -> Callable[[FleetModel, int, int], int]:
    def workers(model: FleetModel, fleet_size: int, current: int) -> int:
        return choose_workers(model, objective, fleet_size, 0, current).workers

    return workers


for _policy in (
    FleetPolicy("fixed", 0, _all),
    FleetPolicy("cost_aware", 0, _cost_aware(Objective())),
    FleetPolicy("async_k1", 1, _all),
    FleetPolicy("async_k2", 2, _all),
):
    POLICIES.register(_policy.name)(_policy)
