"""Orchestration overhead: the train flow's iterations against the same work in a plain Python loop.

    python benchmarks/overhead.py [--iterations 8] [--skip 2]

Both run the default config (configs/tiny.yaml, `iterations` set to --iterations) from scratch in
a run directory of their own, each in a fresh child process:
  flow  `spotrl.flows.train.train`, the Prefect flow, run as `spotrl train` runs it: under the
        private local Prefect server it starts (flows/local_server.py) and its default log level
        (WARNING); every stage a cached, persisted, retryable task, rollouts mapped over shards;
  loop  the same stage functions called directly (`stages.<name>.fn`, the bodies of those tasks),
        one after another, writing the same run directory: no Prefect at all.
An iteration's time is the flow's own `seconds` metric (rollout, reward, update, checkpoint,
publish, metrics record; evaluation excluded), and the loop times the same span.
prefect_overhead_fraction = (flow - loop) / flow on the mean iteration time, leaving out the first
`--skip` iterations (jit compilation). Both runs must end with the same weights (same digest):
the loop is the same work, not a shortcut. The flow's fixed cost per run (server start, flow-run
creation) is reported apart, from the two processes' wall times before their first iteration.

The last line printed is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import run_child  # noqa: E402


def _config(iterations: int):
    from spotrl.flows.config import RunConfig

    return RunConfig(iterations=iterations)


def run_flow(run_dir: str, iterations: int) -> dict:
    from spotrl.flows import rundir
    from spotrl.flows.local_server import local_api_server
    from spotrl.flows.train import train

    started = time.perf_counter()
    with local_api_server():  # the server `spotrl train` starts (flows/local_server.py)
        result = train(config=_config(iterations), run_dir=run_dir)
    metrics = rundir.read_records(Path(run_dir), "metrics")
    return {"iteration_seconds": [m["seconds"] for m in metrics], "total_seconds": time.perf_counter() - started,
            "compilations": [m["timing"]["compilations"] for m in metrics], "weights_sha256": result["weights_sha256"]}


def run_loop(run_dir: str, iterations: int) -> dict:
    from spotrl.flows import rundir
    from spotrl.flows.resume import eval_due
    from spotrl.flows.train import _iteration_metrics
    from spotrl.model.compiles import compile_count
    from spotrl.tasks import stages

    started = time.perf_counter()
    config = _config(iterations)
    run_path = rundir.prepare(run_dir, config)
    root = str(run_path)
    seconds, compilations = [], []
    with rundir.exclusive(run_path):
        data = stages.curate.fn(config, root)
        previous = stages.checkpoint.fn(config, root, stages.warm_start.fn(config, root, data))
        weights = stages.publish.fn(config, root, previous)
        rundir.write_record(run_path, "eval", 0, stages.evaluate.fn(config, root, weights, 0))
        for iteration in range(1, iterations + 1):
            iteration_started, compiles_before = time.perf_counter(), compile_count()
            rollouts = [stages.rollout.fn(config, root, iteration, shard, weights, 0)
                        for shard in range(config.rollout.shards)]
            scored = [stages.reward.fn(config, root, r) for r in rollouts]
            updated = stages.update.fn(config, root, iteration, previous, scored)
            previous = stages.checkpoint.fn(config, root, updated)
            weights = stages.publish.fn(config, root, previous)
            metrics = _iteration_metrics(iteration, rollouts, scored, updated, weights,
                                         time.perf_counter() - iteration_started, compile_count() - compiles_before)
            rundir.write_record(run_path, "metrics", iteration, metrics)
            seconds.append(metrics["seconds"])
            compilations.append(metrics["timing"]["compilations"])
            if eval_due(config, iteration):
                rundir.write_record(run_path, "eval", iteration, stages.evaluate.fn(config, root, weights, iteration))
    return {"iteration_seconds": seconds, "total_seconds": time.perf_counter() - started,
            "compilations": compilations, "weights_sha256": weights["sha256"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--skip", type=int, default=2, help="first iterations left out (jit compilation)")
    parser.add_argument("--worker", choices=("flow", "loop"), help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run = run_flow if args.worker == "flow" else run_loop
        print(json.dumps(run(args.run_dir, args.iterations)))
        return
    if args.iterations <= args.skip:
        parser.error("--iterations must be greater than --skip")

    with tempfile.TemporaryDirectory() as tmp:
        # a private Prefect home: the ephemeral server and its database start fresh, as on a new machine
        os.environ.setdefault("PREFECT_HOME", str(Path(tmp) / "prefect-home"))
        os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
        os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")  # `spotrl train`'s default (cli.py)
        results = {}
        for mode in ("loop", "flow"):
            started = time.perf_counter()
            results[mode] = run_child(__file__, "--worker", mode, "--run-dir", str(Path(tmp) / mode),
                                      "--iterations", str(args.iterations))
            results[mode]["process_seconds"] = time.perf_counter() - started
    steady = {m: r["iteration_seconds"][args.skip:] for m, r in results.items()}
    mean = {m: statistics.mean(s) for m, s in steady.items()}
    fraction = (mean["flow"] - mean["loop"]) / mean["flow"]
    same = results["flow"]["weights_sha256"] == results["loop"]["weights_sha256"]
    print(f"default config, {args.iterations} iterations, first {args.skip} left out; {os.cpu_count()} CPUs")
    for m in ("loop", "flow"):
        s = steady[m]
        print(f"  {m}: iteration mean {mean[m]:.3f} s (min {min(s):.3f}, max {max(s):.3f}); "
              f"process {results[m]['process_seconds']:.1f} s, run {results[m]['total_seconds']:.1f} s; "
              f"jit compilations per iteration {results[m]['compilations']}")
    print(f"  Prefect overhead per iteration: {mean['flow'] - mean['loop']:+.3f} s = {fraction:.1%} of the flow's "
          f"iteration time; same final weights: {same} ({results['flow']['weights_sha256'][:16]}...)")
    figures = {
        "prefect_overhead_fraction": round(fraction, 4),
        "flow_iteration_s": round(mean["flow"], 4), "loop_iteration_s": round(mean["loop"], 4),
        "flow_iteration_s_all": [round(x, 3) for x in results["flow"]["iteration_seconds"]],
        "loop_iteration_s_all": [round(x, 3) for x in results["loop"]["iteration_seconds"]],
        "flow_process_s": round(results["flow"]["process_seconds"], 1),
        "loop_process_s": round(results["loop"]["process_seconds"], 1),
        "flow_fixed_extra_s": round(results["flow"]["process_seconds"] - results["loop"]["process_seconds"]
                                    - (sum(results["flow"]["iteration_seconds"]) - sum(results["loop"]["iteration_seconds"])), 1),
        "flow_compilations_per_iteration": results["flow"]["compilations"],
        "loop_compilations_per_iteration": results["loop"]["compilations"],
        "same_weights": same, "weights_sha256": results["flow"]["weights_sha256"], "iterations": args.iterations,
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
