"""Orchestration overhead: the train flow's iterations against the same work in a plain Python loop.

    python benchmarks/overhead.py [--iterations 16] [--skip 2] [--repeats 4]

The default config (spotrl/configs/tiny.yaml, `iterations` set to --iterations). Its warm start is made
once, by the flow with `iterations=0` (curate, supervised warm start, checkpoint and weights 0,
evaluation 0); every measured run
starts from it in a run directory of its own (`seed_from_warm_start`, what `spotrl train
--warm-start-from` does), in a fresh child process:
  flow  `spotrl.flows.train.train`, the Prefect flow, run as `spotrl train` runs it: under the
        private local Prefect server it starts (flows/local_server.py) and its default log level
        (WARNING); every stage a cached, persisted, retryable task, rollouts mapped over shards;
        it resumes after iteration 0;
  loop  the same iteration body (`spotrl.flows.iteration.run_iteration`) on the stage functions
        called directly (`Stages(direct=True)`: the bodies of those tasks), one after another from
        the same resume point, writing the same run directory: no Prefect.
An iteration's time is the flow's own `seconds` metric (rollout, reward, update, checkpoint,
publish, metrics record; evaluation excluded), and the loop times the same span.
prefect_overhead_fraction = (flow - loop) / flow on the mean iteration time over all runs of each
mode, leaving out the first `--skip` iterations of each (jit compilation). The modes run
`--repeats` times each, interleaved (loop flow flow loop ...): this machine's speed drifts by up to
~20% over minutes, more than the difference measured, so many short runs beat a few long ones.
Every run must end with the same weights (same digest): the loop is the same work, not a shortcut.

The five stage bodies of an iteration are timed in both modes (the worker wraps `stages.<name>.fn`),
which splits the overhead in two:
  engine      time outside the stage bodies, flow minus loop: Prefect's task-run machinery (cache
              key and lookup, state events, result persistence, futures) between the bodies;
  contention  time inside the stage bodies, flow minus loop: the same code slowed by what else runs
              on the cores meanwhile (the local server recording the task runs, the event threads).

The last line printed is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import functools
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
    from spotrl.config import RunConfig

    return RunConfig(iterations=iterations)


def run_flow(run_dir: str, iterations: int) -> dict:
    from spotrl.flows import rundir
    from spotrl.flows.local_server import local_api_server
    from spotrl.flows.train import train

    started = time.perf_counter()
    with local_api_server():  # the server `spotrl train` starts (flows/local_server.py)
        result = train(config=_config(iterations), run_dir=run_dir)
    metrics = rundir.read_records(Path(run_dir), "metrics")
    return {
        **_timings(metrics),
        "total_seconds": time.perf_counter() - started,
        "weights_sha256": result["weights_sha256"],
    }


STAGES = ("rollout", "reward", "update", "publish", "checkpoint")  # an iteration's, in order (1 shard)
_body_seconds: list[tuple[str, float]] = []


def _timed(name: str, body):
    @functools.wraps(body)  # same signature and source for Prefect: same parameters, same cache keys
    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return body(*args, **kwargs)
        finally:
            _body_seconds.append((name, time.perf_counter() - started))

    return timed


def time_stage_bodies() -> None:
    """In this worker process, record how long each call of an iteration's stage bodies takes."""
    from spotrl.tasks import stages

    for name in STAGES:
        getattr(stages, name).fn = _timed(name, getattr(stages, name).fn)


def _timings(metrics: list[dict]) -> dict:
    """Per iteration: its wall time, the time inside its five stage bodies (the same code in both
    modes), and jit compilations."""
    names = [name for name, _ in _body_seconds]
    if names != list(STAGES) * len(metrics):
        raise RuntimeError(
            f"expected {len(metrics)} iterations of the stages {STAGES} one after another (the "
            f"default config: 1 rollout shard, no dynamic sampling); the bodies ran as {names}"
        )
    seconds = [s for _, s in _body_seconds]
    return {
        "iteration_seconds": [m["seconds"] for m in metrics],
        "body_seconds": [sum(seconds[i : i + len(STAGES)]) for i in range(0, len(seconds), len(STAGES))],
        "compilations": [m["timing"]["compilations"] for m in metrics],
    }


def run_loop(run_dir: str, iterations: int) -> dict:
    from spotrl.flows import rundir
    from spotrl.flows.fleet import RolloutFleet
    from spotrl.flows.iteration import LookAhead, Stages, run_iteration
    from spotrl.flows.resume import eval_due, find_resume_point
    from spotrl.tasks.context import get_context

    started = time.perf_counter()
    config = _config(iterations)
    run_path = rundir.prepare(run_dir, config)
    records = []
    with rundir.exclusive(run_path), RolloutFleet(config, run_path) as fleet:
        ctx = get_context(str(run_path), config)
        point = find_resume_point(run_path, config, ctx.checkpoints, ctx.weights)
        stages = Stages(config, run_path, direct=True)  # the train flow's iteration body, on the tasks' bodies
        ahead = LookAhead(stages, fleet, point.iteration + 1, point.weights, ctx.weights)
        previous, weights = point.checkpoint, point.weights
        for iteration in range(point.iteration + 1, iterations + 1):
            done = run_iteration(stages, ahead, iteration, previous, check=lambda where: None)
            previous, weights = done.sealed, done.weights
            rundir.write_record(run_path, "metrics", iteration, done.metrics)
            records.append(done.metrics)
            if eval_due(config, iteration):
                rundir.write_record(run_path, "eval", iteration, stages.evaluate(weights, iteration))
    return {**_timings(records), "total_seconds": time.perf_counter() - started, "weights_sha256": weights["sha256"]}


def _seeded(run_dir: str, iterations: int, warm_start: str) -> None:
    from spotrl.flows.resume import seed_from_warm_start

    seed_from_warm_start(Path(run_dir), _config(iterations), Path(warm_start))


def _order(repeats: int) -> list[str]:
    """loop, flow, flow, loop, ...: on a machine whose speed drifts over minutes (a shared VM), a
    linear drift then weighs on both modes alike."""
    pairs = [("loop", "flow") if r % 2 == 0 else ("flow", "loop") for r in range(repeats)]
    return [mode for pair in pairs for mode in pair]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=16)
    parser.add_argument("--skip", type=int, default=2, help="first iterations left out (jit compilation)")
    parser.add_argument("--repeats", type=int, default=4, help="runs of each mode, interleaved")
    parser.add_argument("--worker", choices=("flow", "loop", "warm-start"), help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    parser.add_argument("--warm-start", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        if args.worker == "warm-start":  # the flow itself, with no RL iterations (as benchmarks/algorithms.py)
            print(json.dumps(run_flow(args.run_dir, 0)))
            return
        _seeded(args.run_dir, args.iterations, args.warm_start)
        time_stage_bodies()
        run = run_flow if args.worker == "flow" else run_loop
        print(json.dumps(run(args.run_dir, args.iterations)))
        return
    if args.iterations <= args.skip:
        parser.error("--iterations must be greater than --skip")

    runs: dict[str, list[dict]] = {"loop": [], "flow": []}
    with tempfile.TemporaryDirectory() as tmp:
        # a private Prefect home: the ephemeral server and its database start fresh, as on a new machine
        os.environ.setdefault("PREFECT_HOME", str(Path(tmp) / "prefect-home"))
        os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
        os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")  # `spotrl train`'s default (cli.py)
        warm_start = str(Path(tmp) / "warm-start")
        run_child(__file__, "--worker", "warm-start", "--run-dir", warm_start)
        for n, mode in enumerate(_order(args.repeats)):
            started = time.perf_counter()
            run = run_child(
                __file__,
                "--worker",
                mode,
                "--run-dir",
                str(Path(tmp) / f"{mode}-{n}"),
                "--iterations",
                str(args.iterations),
                "--warm-start",
                warm_start,
            )
            run["process_seconds"] = time.perf_counter() - started
            runs[mode].append(run)
    steady = {m: [r["iteration_seconds"][args.skip :] for r in rs] for m, rs in runs.items()}
    mean = {m: statistics.mean(x for s in ss for x in s) for m, ss in steady.items()}
    bodies = {m: [r["body_seconds"][args.skip :] for r in rs] for m, rs in runs.items()}
    body = {m: statistics.mean(x for s in ss for x in s) for m, ss in bodies.items()}
    fraction = (mean["flow"] - mean["loop"]) / mean["flow"]
    engine = ((mean["flow"] - body["flow"]) - (mean["loop"] - body["loop"])) / mean["flow"]
    contention = (body["flow"] - body["loop"]) / mean["flow"]
    pairs = list(
        zip(
            *(
                [(statistics.mean(i), statistics.mean(b)) for i, b in zip(steady[m], bodies[m])]
                for m in ("flow", "loop")
            )
        )
    )
    per_pair = [(f_ - l_) / f_ for (f_, _), (l_, _) in pairs]
    engine_per_pair = [((f_ - fb) - (l_ - lb)) / f_ for (f_, fb), (l_, lb) in pairs]
    digests = {r["weights_sha256"] for rs in runs.values() for r in rs}
    print(
        f"default config, {args.iterations} iterations, first {args.skip} left out, {args.repeats} runs of each "
        f"mode in the order {' '.join(_order(args.repeats))}; {os.cpu_count()} CPUs"
    )
    for m in ("loop", "flow"):
        for r, s in zip(runs[m], steady[m]):
            print(
                f"  {m}: iteration mean {statistics.mean(s):.3f} s (min {min(s):.3f}, max {max(s):.3f}); process "
                f"{r['process_seconds']:.1f} s; jit compilations per iteration {r['compilations']}"
            )
    print(
        f"  Prefect overhead per iteration: {mean['flow'] - mean['loop']:+.3f} s = {fraction:.1%} of the flow's "
        f"iteration time (per pair: {', '.join(f'{x:.1%}' for x in per_pair)}; median "
        f"{statistics.median(per_pair):.1%}); "
        f"same final weights in every run: {len(digests) == 1}"
    )
    print(
        f"  engine (outside the five stage bodies): loop {mean['loop'] - body['loop']:.3f} s, flow "
        f"{mean['flow'] - body['flow']:.3f} s = {engine:.1%} (per pair: "
        f"{', '.join(f'{x:.1%}' for x in engine_per_pair)})"
    )
    print(
        f"  contention (inside the stage bodies, the same code): loop {body['loop']:.3f} s, flow {body['flow']:.3f} s"
        f" = {contention:.1%}"
    )
    figures = {
        "prefect_overhead_fraction": round(fraction, 4),
        "prefect_overhead_fraction_per_pair": [round(x, 4) for x in per_pair],
        "prefect_overhead_fraction_median_pair": round(statistics.median(per_pair), 4),
        "prefect_engine_fraction": round(engine, 4),
        "prefect_engine_fraction_per_pair": [round(x, 4) for x in engine_per_pair],
        "contention_fraction": round(contention, 4),
        "flow_iteration_s": round(mean["flow"], 4),
        "loop_iteration_s": round(mean["loop"], 4),
        "flow_body_s": round(body["flow"], 4),
        "loop_body_s": round(body["loop"], 4),
        "flow_iteration_s_all": [[round(x, 3) for x in r["iteration_seconds"]] for r in runs["flow"]],
        "loop_iteration_s_all": [[round(x, 3) for x in r["iteration_seconds"]] for r in runs["loop"]],
        "flow_process_s": [round(r["process_seconds"], 1) for r in runs["flow"]],
        "loop_process_s": [round(r["process_seconds"], 1) for r in runs["loop"]],
        "flow_compilations_per_iteration": runs["flow"][0]["compilations"],
        "loop_compilations_per_iteration": runs["loop"][0]["compilations"],
        "same_weights": len(digests) == 1,
        "weights_sha256": sorted(digests),
        "iterations": args.iterations,
        "repeats": args.repeats,
        "order": _order(args.repeats),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
