"""How many rollout workers each iteration uses (`rollout.workers`), and the record of each choice.

    null   every shard at once on the flow's task runner (the behaviour before this key existed)
    N      at most N shards at once
    auto   before each iteration the cost-aware policy (spotrl/fleet/sizing.py) picks the count from
           what the run has measured so far (metrics.jsonl) and the prices and objective in `fleet`

On threads the count bounds a thread pool the iteration's shards are mapped over; on Ray it is asked
of the autoscaler (`ray.autoscaler.sdk.request_resources`, one CPU bundle per worker) and Ray runs
the shards on the capacity there is. Either way the shards, and so the rollouts, are the same: the
worker count changes when work runs, never what it computes (the digest does not depend on it).

Each decision (workers, objective, inputs, predicted seconds and cost) and the iteration's actual
seconds and cost go in the iteration's metrics under `timing.fleet`: they depend on measured times,
so, like the rest of `timing`, they may differ between two runs of one config.
"""

from __future__ import annotations

import dataclasses

from spotrl.config import RunConfig
from spotrl.fleet import calibrate
from spotrl.fleet.sizing import choose_workers
from spotrl.flows import rundir
from spotrl.storage.paths import AnyPath
from spotrl.tasks.runlog import say


class RolloutFleet:
    def __init__(self, config: RunConfig, run_path: AnyPath, runner=None):
        self.config, self.run_path, self.base = config, run_path, runner
        self.pools: dict = {}  # workers -> an entered ThreadPoolTaskRunner of that many threads
        self.decisions: dict[int, dict] = {}
        self.requested: int | None = None  # the capacity last asked of Ray's autoscaler
        self.current = 0  # workers of the last decision (Ray workers past it start cold)

    def __enter__(self) -> RolloutFleet:
        return self

    def __exit__(self, *exc) -> None:
        for pool in self.pools.values():
            pool.__exit__(*exc)
        self.pools.clear()

    def runner(self, iteration: int):
        """The task runner to map `iteration`'s rollout shards over (None: the flow's own)."""
        if self.config.rollout.workers is None:
            return self.base
        if iteration not in self.decisions:
            self.decisions[iteration] = self.decide(iteration)
        workers = self.decisions[iteration]["workers"]
        if self.base is not None:
            self._request_capacity(workers)
            return self.base
        if workers not in self.pools:
            from prefect.task_runners import ThreadPoolTaskRunner

            self.pools[workers] = ThreadPoolTaskRunner(max_workers=workers).__enter__()
        return self.pools[workers]

    def decide(self, iteration: int) -> dict:
        config = self.config
        r, fleet = config.rollout, config.fleet
        if isinstance(r.workers, int):
            return {"workers": min(r.workers, r.shards), "policy": "fixed"}
        cap = min(r.shards, fleet.max_workers)
        size = calibrate.weight_bytes(self.run_path)
        measured = calibrate.measure(
            rundir.read_records(self.run_path, "metrics"), config, calibrate.network_for(fleet, size)
        )
        if measured is None:
            return {"workers": cap, "policy": "cost_aware", "reason": "nothing measured yet: every shard at once"}
        model = calibrate.model_from(config, measured, size)
        # threads share this process's compiled sampler: only Ray workers start cold
        warm = self.current if self.base is not None else cap
        decision = choose_workers(
            model,
            calibrate.objective_for(fleet),
            cap,
            staleness=r.max_staleness,
            current=warm,
            horizon=max(1, config.iterations - iteration + 1),
        )
        self.current = decision.workers
        say(
            f"iteration {iteration}: {decision.workers} rollout workers ({decision.objective}; predicted "
            f"{decision.predicted.seconds:.2f} s, {decision.predicted.cost:.4g} per iteration)"
        )
        return {
            "workers": decision.workers,
            "policy": "cost_aware",
            "objective": decision.objective,
            "limit": decision.limit,
            "feasible": decision.feasible,
            "predicted_seconds": decision.predicted.seconds,
            "predicted_cost": decision.predicted.cost,
            "inputs": dataclasses.asdict(measured),
        }

    def record(self, iteration: int, metrics: dict) -> None:
        """Put the iteration's decision, with its actual seconds and cost, under metrics' timing.fleet."""
        decision = self.decisions.pop(iteration, None)
        if decision is None:
            return
        fleet = self.config.fleet
        price = fleet.spot_price_per_hour if fleet.spot else fleet.on_demand_price_per_hour
        seconds = metrics["seconds"]
        metrics["timing"]["fleet"] = {
            **decision,
            "actual_seconds": seconds,
            "actual_cost": seconds * (decision["workers"] * price + fleet.trainer_price_per_hour) / 3600,
        }

    def _request_capacity(self, workers: int) -> None:
        if workers == self.requested:
            return
        from ray.autoscaler.sdk import request_resources

        request_resources(bundles=[{"CPU": 1}] * workers)
        self.requested = workers
