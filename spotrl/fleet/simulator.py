"""A discrete-event simulation (simpy) of RL iterations on a fleet of rollout workers plus the trainer.

    trainer:  wait for iteration i's shards -> update (+ overhead) -> publish version i
              -> launch iteration i + 1 + k (its rollouts sample with version i)
    worker:   cold start -> [take a shard -> pull its weights version if not held -> generate] ...

Before an iteration is launched the policy says how many workers it uses: the fleet grows (new
workers start cold) or shrinks (idle workers above the count leave). Shards wait in one queue,
oldest iteration first; a worker takes the next one when it is free. Spot workers are preempted at
Poisson times (`market.preemptions_per_hour` per worker); at the notice a worker finishes its shard
if it ends before the kill, else the shard goes back to the queue and the time spent on it is lost;
a replacement is requested `replace_s` after the kill and starts cold. Workers are billed from their
start to their end (a preempted one until the kill), the trainer for the whole run.

Completion lengths of iteration i are drawn from (seed, i), so every fleet size and policy sees the
same workload (common random numbers); preemption times from (seed, slot, instance). Same inputs,
same result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import simpy

from spotrl.fleet.fleet_model import FleetModel
from spotrl.fleet.sizing import POLICIES, FleetPolicy, shard_count


@dataclass(frozen=True)
class SimResult:
    policy: str
    fleet_size: int  # the most workers the policy may use
    iterations: int
    seconds_per_iteration: float  # the whole run (first cold start included) / iterations
    cost_per_iteration: float
    idle_fraction: float  # 1 - generating worker-seconds / billed worker-seconds
    work_lost_s_per_iteration: float  # worker-seconds of generation thrown away by preemptions
    work_lost_fraction: float  # of all generating worker-seconds
    preemptions: int
    workers_mean: float  # workers the policy chose, averaged over iterations
    iteration_seconds: tuple[float, ...]  # between consecutive publishes (the first from the start)


@dataclass
class _Shard:
    iteration: int
    index: int
    tokens: int
    longest: int


class _Fleet:
    def __init__(self, model: FleetModel, policy: FleetPolicy, fleet_size: int, iterations: int, seed: int):
        self.model, self.policy, self.fleet_size = model, policy, fleet_size
        self.iterations, self.seed = iterations, seed
        self.env = simpy.Environment()
        self.queue = simpy.PriorityStore(self.env)
        self.target = 0
        self.slots: set[int] = set()  # slots with a worker (or one being replaced)
        self.procs: dict[int, simpy.Process] = {}
        self.state: dict[int, str] = {}
        self.started: dict[int, float] = {}  # slot -> when its current worker started billing
        self.billed = self.busy = self.lost = 0.0
        self.preemptions = 0
        self.remaining: dict[int, int] = {}
        self.done = {i: self.env.event() for i in range(1, iterations + 1)}
        self.tokens: dict[int, int] = {}
        self.workers_used: dict[int, int] = {}
        self.published = [0.0]
        self.finished = False

    # --- the trainer ----------------------------------------------------------------------------
    def version(self, iteration: int) -> int:
        return max(0, iteration - 1 - self.policy.staleness)

    def launch(self, iteration: int) -> None:
        model = self.model
        workers = max(1, min(self.fleet_size, self.policy.workers(model, self.fleet_size, len(self.slots))))
        self.workers_used[iteration] = workers
        self.resize(workers)
        w = model.workload
        lengths = w.lengths.draw(np.random.default_rng([self.seed, 1, iteration]), (w.prompts, w.group_size))
        self.tokens[iteration] = int(lengths.sum())
        blocks = np.array_split(np.arange(w.prompts), shard_count(model, workers))
        self.remaining[iteration] = len(blocks)
        for index, block in enumerate(blocks):
            shard = _Shard(iteration, index, int(lengths[block].sum()), int(lengths[block].max()))
            self.queue.put(simpy.PriorityItem((iteration, index), shard))

    def trainer(self):
        env, trainer = self.env, self.model.trainer
        k = self.policy.staleness
        for i in range(1, min(self.iterations, 1 + k) + 1):
            self.launch(i)
        for i in range(1, self.iterations + 1):
            yield self.done[i]
            seconds = trainer.iteration_seconds(self.tokens[i]) + self.model.network.publish_seconds()
            yield env.timeout(seconds + (trainer.cold_start_s if i == 1 else 0.0))
            self.published.append(env.now)
            if i + 1 + k <= self.iterations:
                self.launch(i + 1 + k)
        self.finished = True

    def complete(self, shard: _Shard) -> None:
        self.remaining[shard.iteration] -= 1
        if self.remaining[shard.iteration] == 0:
            self.done[shard.iteration].succeed()

    # --- the fleet ------------------------------------------------------------------------------
    def resize(self, workers: int) -> None:
        self.target = workers
        for slot in range(workers):
            if slot not in self.slots:
                self.slots.add(slot)
                self.env.process(self.slot(slot))
        for slot in list(self.slots):  # idle workers above the count leave now, busy ones after their shard
            if slot >= workers and self.state.get(slot) == "idle" and self.procs[slot].is_alive:
                self.procs[slot].interrupt("retire")

    def slot(self, slot: int):
        """One worker after another in this slot: a preempted worker is replaced until the slot is let go."""
        env, market = self.env, self.model.market
        instance = 0
        while not self.finished and slot < self.target:
            rng = np.random.default_rng([self.seed, 2, slot, instance])
            rate = market.preemption_rate
            kill_at = env.now + rng.exponential(1 / rate) if rate > 0 else math.inf
            self.started[slot] = env.now
            proc = self.procs[slot] = env.process(self.worker(slot, kill_at))
            if kill_at < math.inf:
                env.process(self.preempt(proc, max(env.now, kill_at - market.notice_s)))
            ended = yield proc
            self.billed += env.now - self.started.pop(slot)
            if ended == "preempted":
                yield env.timeout(market.replace_s)
            instance += 1  # a worker let go while the count grew again in the same instant starts anew
        self.slots.discard(slot)
        self.state.pop(slot, None)

    def preempt(self, proc: simpy.Process, notice_at: float):
        yield self.env.timeout(notice_at - self.env.now)
        if proc.is_alive:
            proc.interrupt("preempt")

    def worker(self, slot: int, kill_at: float):
        env, speed, network = self.env, self.model.worker, self.model.network
        held, shard, started, seconds = -1, None, 0.0, 0.0
        phase = self.state[slot] = "cold"
        try:
            yield env.timeout(speed.cold_start_s)
            while not self.finished and slot < self.target:
                phase = self.state[slot] = "idle"
                get = self.queue.get()
                try:
                    shard = (yield get).item
                except simpy.Interrupt:
                    if get.triggered:  # the shard was handed over in the same instant: give it back
                        self.queue.put(get.value)
                    else:
                        get.cancel()
                    raise
                version = self.version(shard.iteration)
                if held < version:
                    phase = self.state[slot] = "pull"
                    yield env.timeout(network.pull_seconds(self.target))
                    held = version
                phase = self.state[slot] = "generate"
                started, seconds = env.now, speed.shard_seconds(shard.tokens, shard.longest)
                yield env.timeout(seconds)
                self.busy += seconds
                self.complete(shard)
                shard = None
            return "retired"
        except simpy.Interrupt as interrupt:
            if interrupt.cause == "retire":
                return "retired"
            self.preemptions += 1
            self.state[slot] = "leaving"
            if phase == "generate" and started + seconds <= kill_at:  # it ends within the notice: keep it
                yield env.timeout(started + seconds - env.now)
                self.busy += seconds
                self.complete(shard)
            elif phase in ("generate", "pull"):  # back to the queue; what was generated is lost
                if phase == "generate":
                    self.lost += env.now - started
                    self.busy += env.now - started
                self.queue.put(simpy.PriorityItem((shard.iteration, shard.index), shard))
            yield env.timeout(max(0.0, kill_at - env.now))
            return "preempted"

    def run(self, policy_name: str) -> SimResult:
        trainer = self.env.process(self.trainer())
        self.env.run(until=trainer)
        end = self.env.now
        billed = self.billed + sum(end - t for t in self.started.values())
        market, n = self.model.market, self.iterations
        cost = (billed * market.worker_per_hour + end * market.trainer_per_hour) / 3600
        return SimResult(
            policy=policy_name,
            fleet_size=self.fleet_size,
            iterations=n,
            seconds_per_iteration=end / n,
            cost_per_iteration=cost / n,
            idle_fraction=1 - self.busy / billed if billed else 0.0,
            work_lost_s_per_iteration=self.lost / n,
            work_lost_fraction=self.lost / self.busy if self.busy else 0.0,
            preemptions=self.preemptions,
            workers_mean=float(np.mean(list(self.workers_used.values()))),
            iteration_seconds=tuple(float(b - a) for a, b in zip(self.published, self.published[1:])),
        )


def simulate(
    model: FleetModel, fleet_size: int, policy: str | FleetPolicy = "fixed", iterations: int = 10, seed: int = 0
) -> SimResult:
    """Simulate `iterations` RL iterations on at most `fleet_size` rollout workers under `policy`
    (a name in POLICIES: fixed, cost_aware, async_k1, async_k2, or a FleetPolicy)."""
    if fleet_size < 1 or iterations < 1:
        raise ValueError(f"fleet_size and iterations must be >= 1, got {fleet_size} and {iterations}")
    chosen = POLICIES[policy] if isinstance(policy, str) else policy
    return _Fleet(model, chosen, fleet_size, iterations, seed).run(chosen.name)
