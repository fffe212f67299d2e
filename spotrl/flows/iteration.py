"""One RL iteration of the train flow, as its DAG:

    rollout-plan -> rollout (x shards) -> reward (x shards) -> update -> publish -> checkpoint

The update's train state is published from memory and saved in the background: the checkpoint
stage, which seals it, runs while the next iteration's rollouts do.

`Stages` calls the stage tasks (spotrl/tasks/stages.py) of one run directory; `LookAhead` owns the
rounds of rollouts launched ahead of training; `run_iteration` is an iteration's body. The train
flow (flows/train.py) runs it under Prefect; benchmarks/overhead.py runs the same body on the
tasks' bodies alone (`Stages(..., direct=True)`) to measure what Prefect costs.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from prefect import unmapped
from prefect.utilities.annotations import quote

from spotrl.config import RunConfig
from spotrl.curation.curriculum import estimate_iteration
from spotrl.flows.fleet import RolloutFleet
from spotrl.flows.results import result_storage
from spotrl.model.compiles import compile_count
from spotrl.rollout.shards import idle_fraction
from spotrl.storage.paths import AnyPath
from spotrl.tasks import stages as stage_tasks
from spotrl.tasks.context import get_context
from spotrl.tasks.runlog import say

STAGE_NAMES = (
    "curate",
    "warm_start",
    "rollout_plan",
    "rollout",
    "reward",
    "update",
    "checkpoint",
    "publish",
    "evaluate",
    "difficulty",
)


class _Deferred:
    """A result computed when first asked for: a direct round's rollouts run when the iteration
    collects them, where the flow's futures would be waited on."""

    def __init__(self, compute: Callable[[], list]):
        self._compute, self._value = compute, None

    def result(self) -> list:
        if self._value is None:
            self._value = self._compute()
        return self._value


@dataclasses.dataclass(frozen=True)
class Round:
    """One launched round of an iteration's rollouts: its plan and its shards, sampled then scored
    (futures, or deferred results in direct mode). Round 0 is the iteration's; dynamic sampling
    (DAPO) adds rounds with the same weights."""

    iteration: int
    number: int
    weights: dict
    difficulty: dict | None
    plan: dict
    sampled: Any
    rewarded: Any


@dataclasses.dataclass(frozen=True)
class Collected:
    """What an iteration's rounds produced: a reference per rollout shard and scored shard, and the plans."""

    rollouts: list[dict]
    scored: list[dict]
    plans: list[dict]


class Stages:
    """The stage tasks of one run directory, called as the iteration's DAG calls them.

    Results persist under RUN/prefect-results. `refresh` runs the tasks even where a cached result
    exists: the iterations after a damaged artifact, whose cached results may point at what was
    quarantined. `direct` calls the tasks' bodies in this thread instead, with no Prefect.
    """

    def __init__(self, config: RunConfig, run_path: AnyPath, *, refresh: bool = False, direct: bool = False):
        self.config, self.run_path, self.root, self.direct = config, run_path, str(run_path), direct
        if direct:
            self._tasks = {name: getattr(stage_tasks, name).fn for name in STAGE_NAMES}
            self._config = config
            return
        storage = result_storage(run_path / "prefect-results")
        self._tasks = {
            name: getattr(stage_tasks, name).with_options(result_storage=storage, refresh_cache=refresh)
            for name in STAGE_NAMES
        }
        self._fresh_update = stage_tasks.update.with_options(result_storage=storage, refresh_cache=True)
        # Unwrapped, Prefect walks the nested config twice on every task call, looking for futures
        # to wait on (~3 ms of the ~10 ms a task run costs the flow; benchmarks/README.md). The task
        # still receives the RunConfig, and its cache key is computed from it as unwrapped.
        self._config = quote(config)

    def refreshed(self) -> Stages:
        """The same stages, run even where a cached result exists."""
        return Stages(self.config, self.run_path, refresh=True, direct=self.direct)

    def curate(self) -> dict:
        return self._tasks["curate"](self._config, self.root)

    def warm_start(self, data: dict) -> dict:
        return self._tasks["warm_start"](self._config, self.root, data)

    def difficulty(self, iteration: int, weights_version: int) -> dict:
        return self._tasks["difficulty"](self._config, self.root, iteration, weights_version)

    def launch(self, iteration: int, number: int, weights: dict, runner=None, difficulty: dict | None = None) -> Round:
        """Plan round `number` of `iteration`'s rollouts and submit its shards and their scoring."""
        config, root = self.config, self.root
        plan = self._tasks["rollout_plan"](self._config, root, iteration, number, difficulty)
        shards = range(config.rollout.shards)
        if self.direct:
            rollout, reward = self._tasks["rollout"], self._tasks["reward"]
            sampled = _Deferred(lambda: [rollout(config, root, iteration, s, weights, plan, number) for s in shards])
            rewarded = _Deferred(lambda: [reward(config, root, r) for r in sampled.result()])
            return Round(iteration, number, weights, difficulty, plan, sampled, rewarded)
        parameters = {
            # Ray pickles the arguments with the quote still on (a bare tuple arrives): it gets the config as is
            "config": unmapped(config if runner else self._config),
            "run_dir": unmapped(root),
            "iteration": unmapped(iteration),
            "shard": shards,
            "weights": unmapped(weights),
            "plan": unmapped(plan),
            "generation_round": unmapped(number),
        }
        if runner is None:
            sampled = self._tasks["rollout"].map(**parameters)
        else:
            sampled = runner.map(self._tasks["rollout"], parameters)
        rewarded = self._tasks["reward"].map(unmapped(self._config), unmapped(root), sampled)
        return Round(iteration, number, weights, difficulty, plan, sampled, rewarded)

    def update(self, iteration: int, previous: dict, scored: list[dict]) -> dict:
        # The update's state is in memory only until its checkpoint is sealed: a cached update
        # without a sealed checkpoint (killed while saving) has nothing behind it, so it runs again
        # (deterministic: the same state).
        sealed = self.direct or get_context(self.root, self.config).checkpoints.sealed(iteration)
        task = self._tasks["update"] if sealed else self._fresh_update
        return task(self._config, self.root, iteration, previous, scored)

    def checkpoint(self, updated: dict) -> dict:
        return self._tasks["checkpoint"](self._config, self.root, updated)

    def publish(self, checkpoint: dict) -> dict:
        return self._tasks["publish"](self._config, self.root, checkpoint)

    def evaluate(self, weights: dict, iteration: int) -> dict:
        return self._tasks["evaluate"](self._config, self.root, weights, iteration)


class LookAhead:
    """Generation running ahead of training by up to rollout.max_staleness iterations.

    Iteration j samples with weights version j-1-staleness (deterministic, so a resumed run
    regenerates the same rollouts), and its round 0 is launched as soon as that version is
    published, while the trainer still updates the iterations before j. Owns the rounds in flight,
    the published versions they may sample with, and the difficulty estimates that filter their
    prompts (curation/curriculum.py).
    """

    def __init__(self, stages: Stages, fleet: RolloutFleet, start: int, weights: dict, weight_store):
        """`weights`: the newest published version (start - 1); the older ones iteration `start`
        and its look-ahead may sample with come from `weight_store`."""
        self.stages, self.config, self.fleet = stages, stages.config, fleet
        self.published = {weights["version"]: weights}
        self.published.update({v: weight_store.ref(v) for v in range(self.sampling_version(start), start - 1)})
        self.in_flight: dict[int, Round] = {}
        self.estimates: dict[int, dict] = {}

    def sampling_version(self, iteration: int) -> int:
        """The weights version `iteration` samples with."""
        return max(0, iteration - 1 - self.config.rollout.max_staleness)

    def publish(self, weights: dict) -> None:
        """A new version is published: launch every iteration it makes ready."""
        self.published[weights["version"]] = weights
        self.launch_ready(weights["version"] + 1)

    def launch_ready(self, first: int) -> None:
        """Launch round 0 of iterations first, first + 1, ... whose weights are published."""
        for j in range(first, self.config.iterations + 1):
            version = self.sampling_version(j)
            if version not in self.published:
                break
            if j not in self.in_flight:
                runner = self.fleet.runner(j)
                self.in_flight[j] = self.stages.launch(j, 0, self.published[version], runner, self.difficulty_for(j))

    def difficulty_for(self, iteration: int) -> dict | None:
        """The difficulty estimate filtering `iteration`'s prompts, made with the weights the
        estimating iteration samples with (curation/curriculum.py)."""
        schedule = self.config.curation.difficulty
        if schedule is None:
            return None
        estimated_at = estimate_iteration(iteration, schedule.every)
        if estimated_at not in self.estimates:
            estimate = self.estimates[estimated_at] = self.stages.difficulty(
                estimated_at, self.sampling_version(estimated_at)
            )
            say(
                f"difficulty before iteration {estimated_at}: {estimate['stream_rows']} prompts in the stream "
                f"({estimate['never_solved']} never, {estimate['always_solved']} always solved of "
                f"{estimate['estimated']} estimated)"
            )
        return self.estimates[estimated_at]

    def collect(self, iteration: int) -> Collected:
        """Wait for `iteration`'s rollouts and scores. With dynamic sampling (DAPO), further rounds
        (same weights) run until enough groups have signal or `max_rounds` is reached."""
        self.launch_ready(iteration)
        first, runner = self.in_flight.pop(iteration), self.fleet.runner(iteration)
        r, ds = self.config.rollout, self.config.algorithm.dynamic_sampling
        rollouts, scored, plans, launched = [], [], [], first
        for number in range(1 + (ds.max_rounds if ds.enabled else 0)):
            if number:
                if sum(s["groups_with_signal"] for s in scored) >= r.prompts_per_iteration:
                    break
                launched = self.stages.launch(iteration, number, first.weights, runner, first.difficulty)
            plans.append(launched.plan)
            scored += launched.rewarded.result()
            rollouts += launched.sampled.result()
        return Collected(rollouts, scored, plans)


@dataclasses.dataclass(frozen=True)
class Iteration:
    """A finished iteration: its sealed checkpoint, its published weights and its metrics record."""

    sealed: dict
    weights: dict
    metrics: dict


def run_iteration(
    stages: Stages, ahead: LookAhead, iteration: int, previous: dict, check: Callable[[str], None]
) -> Iteration:
    """One iteration: collect its rollouts, update, publish, checkpoint. `previous` is the sealed
    checkpoint it continues; `check(where)` stops the run where a preemption is pending."""
    started, compiles_before = time.perf_counter(), compile_count()
    collected = ahead.collect(iteration)
    check(f"in iteration {iteration} after its rollouts were scored")
    updated = stages.update(iteration, previous, collected.scored)
    weights = stages.publish(updated)
    ahead.publish(weights)  # the next iterations' rollouts run while the checkpoint is written and sealed
    sealed = stages.checkpoint(updated)
    check(f"in iteration {iteration} after its checkpoint was sealed")
    seconds, compilations = time.perf_counter() - started, compile_count() - compiles_before
    return Iteration(sealed, weights, iteration_metrics(iteration, collected, updated, weights, seconds, compilations))


def iteration_metrics(
    iteration: int, collected: Collected, updated: dict, weights: dict, seconds: float, compilations: int
) -> dict:
    """The iteration's record in RUN/metrics.jsonl."""
    rollouts, scored = collected.rollouts, collected.scored
    rows = sum(s["rows"] for s in scored)
    tokens = sum(r["tokens"] for r in rollouts)
    rounds = {r["round"] for r in rollouts}  # shards of a round run in parallel, rounds one after another
    rollout_seconds = sum(max(r["rollout_seconds"] for r in rollouts if r["round"] == k) for k in rounds)
    skip = {"uri", "iteration", "update_seconds"}
    return {
        "iteration": iteration,
        "weights_version": weights["version"],
        "rollout_weights_versions": sorted({r["weights_version"] for r in rollouts}),
        "staleness": iteration - 1 - min(r["weights_version"] for r in rollouts),
        "reward_mean": sum(s["reward_sum"] for s in scored) / rows,
        "shaped_reward_mean": sum(s["shaped_reward_sum"] for s in scored) / rows,
        "generation_rounds": 1 + max(r["round"] for r in rollouts),
        "completion_length_mean": sum(s["length_sum"] for s in scored) / rows,
        "rollout_tokens": tokens,
        "rollout_plan": [{k: p[k] for k in ("round", "sizes", "predicted_costs")} for p in collected.plans],
        **{k: v for k, v in updated.items() if k not in skip},
        "tokens_per_s": tokens / max(rollout_seconds, 1e-9),
        "seconds": seconds,
        # how the work was executed (varies from run to run, unlike everything above)
        # (jit compilations in this process during the iteration: 0 in steady state, more after a restart)
        "timing": {
            "rollout_seconds": rollout_seconds,
            "rollout_idle_fraction": idle_fraction(
                [[r["rollout_seconds"] for r in rollouts if r["round"] == k] for k in sorted(rounds)]
            ),
            "update_seconds": updated["update_seconds"],
            "compilations": compilations,
            "rollout_workers": sorted({r.get("worker", "") for r in rollouts}),
        },
    }


def iteration_line(metrics: dict, iterations: int) -> str:
    """The iteration's line in the run's log."""
    # rft: no loss when nothing verified (no step), and the share of the rollouts it kept
    loss = f"{metrics['loss']:+.4f}" if "loss" in metrics else "   none"
    if "kept_fraction" in metrics:
        update = f"kept {metrics['kept_fraction']:.3f}"
    else:
        update = f"clip {metrics['clip_frac']:.3f}"
    return (
        f"iteration {metrics['iteration']:>4}/{iterations}  reward {metrics['reward_mean']:.3f}  "
        f"loss {loss}  {update}  {metrics['tokens_per_s']:,.0f} tok/s  {metrics['seconds']:.2f}s"
    )
