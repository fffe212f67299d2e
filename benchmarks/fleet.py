"""Fleet simulator on a long-tailed workload: time, cost, idle fraction and lost work for W = 8, 64,
256, 1024 rollout workers under each policy (fixed W, cost-aware, asynchronous k = 1, 2).

The workload and fleet are the built-in example (spotrl/fleet/fleet_model.py, LONG_TAILED): a 7B policy,
1024 prompts x 8 completions per iteration, completion lengths lognormal (median 600 tokens,
sigma 1) capped at 8192; a rollout worker decodes 2,500 tok/s with a full batch and one sequence at
30 tok/s; cold start 90 s plus a 15 GB weight pull at 1.25 GB/s from a store of 100 GB/s egress;
the update 10 s + 6 us/token, 5 s of other trainer work, publish at 2.5 GB/s; spot workers at $1/h
preempted 0.05 times per hour with 30 s notice, the trainer at $24/h. Illustrative magnitudes, not
measurements: `spotrl simulate --run-dir RUN` calibrates the same model on a real run.

Target: the cost-aware policy (least cost within 1.1x the fastest predicted iteration) at least
30% cheaper than the largest fixed fleet, at no more than 10% more time per iteration.

    python benchmarks/fleet.py [--iterations 10] [--seed 0] [--set worker.sequence_tokens_per_s=60 ...]

Prints the table, the target check, and one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spotrl.fleet.fleet_model import LONG_TAILED, with_overrides  # noqa: E402
from spotrl.fleet.sweep import FLEET_SIZES, as_rows, format_table, sweep, target_check  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    model = with_overrides(LONG_TAILED, dict(item.split("=", 1) for item in args.overrides))
    started = time.perf_counter()
    results = sweep(model, FLEET_SIZES, iterations=args.iterations, seed=args.seed)
    wall = time.perf_counter() - started
    print(format_table(results))
    check = target_check(results)
    print(
        f"\ncost_aware at W={check['fleet_size']} uses {check['cost_aware_workers']:.1f} workers: "
        f"{check['cost_saving']:.1%} cheaper than fixed W={check['fleet_size']} (target >= 30%), "
        f"{check['time_ratio']:.3f}x its time per iteration (target <= 1.10): "
        f"{'met' if check['target_met'] else 'NOT met'}"
    )
    print(f"simulated {len(results)} configurations x {args.iterations} iterations in {wall:.1f} s")
    by = {(r["fleet_size"], r["policy"]): r for r in as_rows(results)}
    summary = {
        **check,
        "iterations": args.iterations,
        "seed": args.seed,
        "simulation_wall_s": round(wall, 2),
        **{
            f"{policy}_{size}_{key}": round(by[(size, policy)][key], 4)
            for size in FLEET_SIZES
            for policy in ("fixed", "cost_aware", "async_k1", "async_k2")
            for key in ("seconds_per_iteration", "cost_per_iteration", "idle_fraction")
        },
    }
    print(json.dumps(summary, sort_keys=True))


if __name__ == "__main__":
    main()
