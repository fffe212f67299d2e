"""A FleetModel from a run's own measurements, and the simulator checked against that run.

What the train flow records per iteration (metrics.jsonl): `rollout_tokens`, `seconds` (the whole
iteration), and under `timing` the rollout's seconds (the slowest shard's sampling), the update's
seconds and the number of jit compilations (0 in steady state). From those:

    worker tokens/s     completion tokens per shard / rollout seconds, over the steady iterations
    update s/token      update seconds / completion tokens, over the steady iterations
    trainer overhead    iteration seconds - rollout waves - update, less the modelled publish and pull
                        (rewards, checkpoint, bookkeeping: what the other stages cost)
    worker cold start   the first iteration's rollout seconds beyond the steady rate (compilation),
                        unless fleet.cold_start_seconds is given
    trainer cold start  the first iteration's update and overhead beyond the steady ones

Completion lengths come from the rollout shards (RUN/rollouts/iter_*/rollouts_*.parquet, `length`),
the weight version's size from RUN/weights, prices, bandwidths and preemptions from the `fleet`
section of the run's config.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pyarrow.parquet as pq

from spotrl.config import FleetConfig, RunConfig
from spotrl.configs import read_resolved_config
from spotrl.fleet.fleet_model import FleetModel, Lengths, Market, Network, TrainerSpeed, WorkerSpeed, Workload
from spotrl.fleet.simulator import simulate
from spotrl.fleet.sizing import Objective
from spotrl.storage.paths import AnyPath, RemotePath, as_path
from spotrl.storage.records import read_jsonl


@dataclass(frozen=True)
class Measured:
    """What a run measured, as the model's inputs (a decision records them)."""

    iterations: int  # records used
    steady_iterations: int  # of those, without compilations
    tokens_per_iteration: float
    completion_length_mean: float
    worker_tokens_per_s: float
    update_s_per_token: float
    trainer_overhead_s: float
    worker_cold_start_s: float
    trainer_cold_start_s: float


def concurrent_workers(config: RunConfig) -> int:
    """Rollout shards the run ran at once: its worker bound, else all of its shards."""
    workers = config.rollout.workers
    return workers if isinstance(workers, int) else config.rollout.shards


def network_for(fleet: FleetConfig, weight_bytes: float) -> Network:
    return Network(
        weight_bytes=weight_bytes,
        publish_bytes_per_s=fleet.weight_publish_bytes_per_s,
        pull_bytes_per_s=fleet.weight_pull_bytes_per_s,
        store_bytes_per_s=fleet.store_bytes_per_s,
    )


def market_for(fleet: FleetConfig) -> Market:
    return Market(
        spot_per_hour=fleet.spot_price_per_hour,
        on_demand_per_hour=fleet.on_demand_price_per_hour,
        trainer_per_hour=fleet.trainer_price_per_hour,
        spot=fleet.spot,
        preemptions_per_hour=fleet.preemptions_per_hour,
        notice_s=fleet.preemption_notice_seconds,
    )


def objective_for(fleet: FleetConfig) -> Objective:
    return Objective(
        kind=fleet.objective,
        deadline_s=fleet.deadline_seconds,
        deadline_slack=fleet.deadline_slack,
        budget=fleet.budget_per_iteration,
    )


def measure(records: list[dict], config: RunConfig, network: Network) -> Measured | None:
    """The model's inputs from metrics records (None: no record to measure from)."""
    records = [r for r in records if r.get("rollout_tokens") and r.get("timing", {}).get("rollout_seconds")]
    if not records:
        return None
    records = sorted(records, key=lambda r: r["iteration"])
    steady = [r for r in records if not r["timing"].get("compilations")] or records
    shards, workers = config.rollout.shards, concurrent_workers(config)

    def waves(r):  # rollout rounds of the iteration: its shards over the workers it ran on
        return math.ceil(shards / r["timing"].get("fleet", {}).get("workers", workers))

    def tokens(r):
        return r["rollout_tokens"]

    def rollout(r):
        return r["timing"]["rollout_seconds"]

    def update(r):
        return r["timing"].get("update_seconds", 0.0)

    def other(r):
        return max(0.0, r["seconds"] - waves(r) * rollout(r) - update(r))

    rate = sum(tokens(r) for r in steady) / shards / sum(rollout(r) for r in steady)
    per_token = sum(update(r) for r in steady) / sum(tokens(r) for r in steady)
    other_steady = float(np.mean([other(r) for r in steady]))
    modelled = network.publish_seconds() + network.pull_seconds(workers)
    first = records[0]
    cold = first is not steady[0]  # the first record compiled (steady ones do not)
    return Measured(
        iterations=len(records),
        steady_iterations=len(steady) if steady is not records else 0,
        tokens_per_iteration=float(np.mean([tokens(r) for r in records])),
        completion_length_mean=float(np.mean([r.get("completion_length_mean", 0.0) for r in records])),
        worker_tokens_per_s=rate,
        update_s_per_token=per_token,
        trainer_overhead_s=max(0.0, other_steady - modelled),
        worker_cold_start_s=max(0.0, rollout(first) - tokens(first) / shards / rate) if cold else 0.0,
        trainer_cold_start_s=(
            max(0.0, update(first) - per_token * tokens(first)) + max(0.0, other(first) - other_steady) if cold else 0.0
        ),
    )


def model_from(config: RunConfig, measured: Measured, weight_bytes: float, lengths: tuple[int, ...] = ()) -> FleetModel:
    """The FleetModel of a run: its workload (measured lengths, else every completion at the mean
    length), its measured speeds, and the network and prices of its `fleet` section."""
    r, fleet = config.rollout, config.fleet
    cold = fleet.cold_start_seconds if fleet.cold_start_seconds is not None else measured.worker_cold_start_s
    return FleetModel(
        workload=Workload(
            prompts=r.prompts_per_iteration,
            group_size=r.group_size,
            lengths=Lengths(
                median=max(measured.completion_length_mean, 1.0),
                sigma=0.0,
                max_tokens=r.max_new_tokens,
                samples=tuple(int(x) for x in lengths),
            ),
            shards=r.shards,
        ),
        worker=WorkerSpeed(
            tokens_per_s=measured.worker_tokens_per_s,
            sequence_tokens_per_s=None,  # a single sequence's rate is not measured: no latency floor
            shard_overhead_s=0.0,  # in the trainer overhead: the flow times sampling only
            cold_start_s=cold,
        ),
        trainer=TrainerSpeed(
            update_s_per_token=measured.update_s_per_token,
            update_fixed_s=0.0,
            overhead_s=measured.trainer_overhead_s,
            cold_start_s=measured.trainer_cold_start_s,
        ),
        network=network_for(fleet, weight_bytes),
        market=market_for(fleet),
    )


# --- a run directory ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Calibration:
    run_dir: str
    config: RunConfig
    records: list[dict]
    measured: Measured
    model: FleetModel


def read_metrics(run_dir: AnyPath) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: not a run directory, or no iteration finished yet")
    return read_jsonl(path)


def completion_lengths(run_dir: AnyPath) -> list[int]:
    """Every completion's length in the run's rollout shards."""
    out: list[int] = []
    for path in sorted((run_dir / "rollouts").glob("iter_*/rollouts_*.parquet")):
        with path.open("rb") as f:
            out += pq.read_table(f, columns=["length"]).column("length").to_pylist()
    return out


def weight_bytes(run_dir: AnyPath) -> float:
    """Size of the newest published weight version (its files)."""
    versions = sorted(p for p in (run_dir / "weights").glob("v*") if p.is_dir())
    if not versions:
        return 0.0
    if isinstance(versions[-1], RemotePath):
        return float(versions[-1].fs.du(versions[-1].url))
    return float(sum(p.stat().st_size for p in versions[-1].rglob("*") if p.is_file()))


def calibrate(run_dir: str | AnyPath) -> Calibration:
    """The FleetModel of a run directory, from its config and its measurements."""
    path = as_path(run_dir)
    config_path = path / "config.yaml"
    if not config_path.exists():
        raise FileNotFoundError(f"{config_path} does not exist: not a run directory")
    config = read_resolved_config(config_path)
    records = read_metrics(path)
    size = weight_bytes(path)
    measured = measure(records, config, network_for(config.fleet, size))
    if measured is None:
        raise ValueError(f"{path / 'metrics.jsonl'}: no iteration with rollout timings to calibrate from")
    return Calibration(
        str(path), config, records, measured, model_from(config, measured, size, completion_lengths(path))
    )


@dataclass(frozen=True)
class Validation:
    actual_seconds: float  # the run's mean iteration time
    predicted_seconds: float  # the simulator's, calibrated on the run, for as many iterations
    error: float  # |predicted - actual| / actual
    actual: tuple[float, ...]
    predicted: tuple[float, ...]


def validate(calibration: Calibration, seed: int = 0) -> Validation:
    """Simulate the run as it ran (its workers, its iterations, no preemptions: a local run has none)
    and compare the mean iteration time with the measured one."""
    records = sorted(calibration.records, key=lambda r: r["iteration"])
    model = dataclasses.replace(
        calibration.model, market=dataclasses.replace(calibration.model.market, preemptions_per_hour=0.0)
    )
    k = calibration.config.rollout.max_staleness
    policy = {0: "fixed", 1: "async_k1", 2: "async_k2"}.get(k)
    if policy is None:
        raise ValueError(f"rollout.max_staleness {k}: the simulator's policies cover 0, 1 and 2")
    result = simulate(model, concurrent_workers(calibration.config), policy, iterations=len(records), seed=seed)
    actual = tuple(float(r["seconds"]) for r in records)
    mean = float(np.mean(actual))
    return Validation(
        actual_seconds=mean,
        predicted_seconds=result.seconds_per_iteration,
        error=abs(result.seconds_per_iteration - mean) / mean,
        actual=actual,
        predicted=result.iteration_seconds,
    )
