"""The default run's steady iteration and what it is made of, against an earlier commit on the same machine.

    python benchmarks/iteration.py [--baseline REF] [--iterations 30] [--skip 3] [--repeats 3] [--set KEY=VALUE]

Two sides: this working tree, and REF checked out as a git worktree (a temporary one, removed at the
end). Each side makes its own warm start once (the train flow with `iterations=0`), then trains
`--iterations` RL iterations from it in a fresh process, `--repeats` times, the sides alternating
(base this this base ...: this machine's speed drifts by up to ~20% over minutes). A run is the train
flow under the private local Prefect server, as `spotrl train` runs it; a side runs its own code
(PYTHONPATH points at its tree), this script only times it.

An iteration is the flow's `seconds` metric (rollout, reward, update, checkpoint, publish, records;
evaluation excluded), the first `--skip` iterations left out (compilation). Its parts are timed by
wrapping the library functions the stage tasks call, whichever of them a side has, and counted in
the iteration during which they started:
  sample        rollout.completions.sample_completions (the rollout stage's generation)
  score         rewards.score.score (the reward stage's verifier calls)
  old_logprobs  the trainer's rescoring pass (the function rl.train_step.build_scoring_fn builds,
                as rl.iteration_update calls it; 0 where it is skipped)
  steps         rl.update.policy_update (the optimizer steps, advantages included)
  checkpoint    storage.checkpoints.CheckpointStore save + seal + prune
  publish       storage.weights.WeightStore.publish
  rest          the iteration minus those: Prefect's task runs, reading and writing shards, plans,
                records (rollouts of the next iteration overlap it, so parts can sum past the whole)
orchestration = (iteration - sample - steps) / iteration: everything but generation and the optimizer
steps, the share the issue-32 target bounds at 15%.

Every run of a side must end with the same weights (same digest): determinism is part of the figure.
The last line printed is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from common import run_child  # this script's directory is sys.path[0]; no ROOT on it: a side's PYTHONPATH must win

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("sample", "score", "old_logprobs", "steps", "checkpoint", "publish")

_calls: list[tuple[str, float, float]] = []  # (part, started, seconds)
_iterations: list[tuple[float, float]] = []  # (started, ended) of each run_iteration call


def _timed(part: str, body, sync: bool = False):
    @functools.wraps(body)
    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            result = body(*args, **kwargs)
            if sync:  # a jitted function returns before its work is done
                import jax

                jax.block_until_ready(result)
            return result
        finally:
            _calls.append((part, started, time.perf_counter() - started))

    return timed


def _wrap(module, name: str, part: str, sync: bool = False) -> None:
    if hasattr(module, name):
        setattr(module, name, _timed(part, getattr(module, name), sync))


def _instrument() -> None:
    """Time the parts of an iteration in this worker (the side's own code, wrapped where it has it)."""
    from spotrl.flows import train as train_flow
    from spotrl.rl import iteration_update
    from spotrl.storage.checkpoints import CheckpointStore
    from spotrl.storage.weights import WeightStore
    from spotrl.tasks import stages

    _wrap(stages, "sample_completions", "sample")
    _wrap(stages, "score", "score")
    _wrap(iteration_update, "policy_update", "steps")
    build = iteration_update.build_scoring_fn
    iteration_update.build_scoring_fn = lambda *a, **k: _timed("old_logprobs", build(*a, **k), sync=True)
    for name in ("save", "seal", "prune"):
        _wrap(CheckpointStore, name, "checkpoint")
    _wrap(WeightStore, "publish", "publish")
    run_iteration = train_flow.run_iteration

    def iteration(*args, **kwargs):
        started = time.perf_counter()
        try:
            return run_iteration(*args, **kwargs)
        finally:
            _iterations.append((started, time.perf_counter()))

    train_flow.run_iteration = iteration


def _parts_per_iteration() -> list[dict]:
    """Seconds of each part that started within each iteration's window."""
    out = []
    for started, ended in _iterations:
        parts = collections.Counter()
        for part, at, seconds in _calls:
            if started <= at < ended:
                parts[part] += seconds
        out.append({part: parts.get(part, 0.0) for part in PARTS})
    return out


def _config(overrides: list[str], iterations: int):
    from spotrl.configs import load_config

    return load_config(None, [*overrides, f"iterations={iterations}"])


def worker(args) -> dict:
    import spotrl
    from spotrl.flows import rundir
    from spotrl.flows.local_server import local_api_server
    from spotrl.flows.train import train

    config = _config(args.set, args.iterations)
    if args.warm_start:
        from spotrl.flows.resume import seed_from_warm_start

        seed_from_warm_start(Path(args.run_dir), config, Path(args.warm_start))
    _instrument()
    with local_api_server():  # the server `spotrl train` starts
        result = train(config=config, run_dir=args.run_dir)
    metrics = rundir.read_records(Path(args.run_dir), "metrics")
    return {
        "code": str(Path(spotrl.__file__).parent),
        "iteration_seconds": [m["seconds"] for m in metrics],
        "parts": _parts_per_iteration(),
        "weights_sha256": result["weights_sha256"],
    }


def _run_side(tree: Path, *args: str) -> dict:
    """A worker run of this script on `tree`'s code (PYTHONPATH first, before the installed spotrl)."""
    return run_child(__file__, "--worker", *args, env={**os.environ, "PYTHONPATH": str(tree)}, cwd=str(tree))


def _summary(runs: list[dict], skip: int) -> dict:
    iterations = [s for r in runs for s in r["iteration_seconds"][skip:]]
    parts = [p for r in runs for p in r["parts"][skip:]]
    median = {part: statistics.median(p[part] for p in parts) for part in PARTS}
    whole = statistics.median(iterations)
    median["rest"] = max(whole - sum(median.values()), 0.0)
    orchestration = [
        (s - p["sample"] - p["steps"]) / s
        for r in runs
        for s, p in zip(r["iteration_seconds"][skip:], r["parts"][skip:])
    ]
    return {
        "iteration_s": whole,
        "iteration_s_per_run": [statistics.median(r["iteration_seconds"][skip:]) for r in runs],
        "parts_s": median,
        "orchestration_fraction": statistics.median(orchestration),
        "same_weights": len({r["weights_sha256"] for r in runs}) == 1,
        "weights_sha256": runs[0]["weights_sha256"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default="HEAD", help="the commit to compare with (a git ref)")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--skip", type=int, default=3, help="first iterations left out (jit compilation)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side, alternating")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override, both sides")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    parser.add_argument("--warm-start", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    if args.iterations <= args.skip:
        parser.error("--iterations must be greater than --skip")

    with tempfile.TemporaryDirectory() as tmp:
        base_tree = Path(tmp) / "baseline"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base_tree), args.baseline], check=True
        )
        try:
            trees = {"this": ROOT, "baseline": base_tree}
            os.environ.setdefault("PREFECT_HOME", str(Path(tmp) / "prefect-home"))
            os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")  # `spotrl train`'s default
            sets = [a for kv in args.set for a in ("--set", kv)]
            warm = {}
            for side, tree in trees.items():
                warm[side] = str(Path(tmp) / f"warm-{side}")
                _run_side(tree, "--run-dir", warm[side], "--iterations", "0", *sets)
            runs: dict[str, list[dict]] = {side: [] for side in trees}
            order = [
                s for r in range(args.repeats) for s in (("baseline", "this") if r % 2 == 0 else ("this", "baseline"))
            ]
            for n, side in enumerate(order):
                run_dir = str(Path(tmp) / f"{side}-{n}")
                runs[side].append(
                    _run_side(
                        trees[side],
                        *("--run-dir", run_dir, "--warm-start", warm[side]),
                        *("--iterations", str(args.iterations), *sets),
                    )
                )
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_tree)], check=False)

    summary = {side: _summary(rs, args.skip) for side, rs in runs.items()}
    ratio = summary["this"]["iteration_s"] / summary["baseline"]["iteration_s"]
    print(
        f"default config{' with ' + ' '.join(args.set) if args.set else ''}: {args.iterations} iterations, first "
        f"{args.skip} left out, {args.repeats} runs a side in the order {' '.join(order)}; {os.cpu_count()} CPUs"
    )
    print(f"{'':>14} {'baseline':>10} {'this':>10}")
    print(f"{'iteration':>14} {summary['baseline']['iteration_s']:>9.3f}s {summary['this']['iteration_s']:>9.3f}s")
    for part in (*PARTS, "rest"):
        b, t = summary["baseline"]["parts_s"][part], summary["this"]["parts_s"][part]
        print(f"{part:>14} {b:>9.3f}s {t:>9.3f}s")
    print(
        f"{'orchestration':>14} {summary['baseline']['orchestration_fraction']:>10.1%} "
        f"{summary['this']['orchestration_fraction']:>10.1%}"
    )
    print(
        f"this / baseline ({args.baseline}): {ratio:.3f}; same weights in every run of a side: "
        f"{summary['baseline']['same_weights']} / {summary['this']['same_weights']}"
    )
    print(json.dumps({"ratio": round(ratio, 4), "baseline_ref": args.baseline, "order": order, **summary}))


if __name__ == "__main__":
    main()
