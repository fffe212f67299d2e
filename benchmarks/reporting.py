"""What the run's views cost an iteration: TensorBoard scalars, the Prefect artifacts, the end report.

    python benchmarks/reporting.py [--config tiny] [--iterations 30] [--eval-every 10]

Runs the train flow as `spotrl train` does (its private Prefect server) and times, inside that run,
every call the flow makes to write the views: `sync_tensorboard` after each metrics record and
evaluation, the `training-progress` update after each iteration, the `held-out-pass-at-k` table after
each evaluation, and `make_report` at the end. Each is reported as a share of the run's iteration
time (the sum of `seconds` in metrics.jsonl): `views_fraction` is all of them together, the report
spread over the iterations of the run as it is made once per run. A shorter iteration is the worse
case, so the default is the tiny preset (~0.6 s an iteration on 2 cores). The last line printed is
one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import defaultdict

from spotrl.configs import load_config


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="tiny")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--eval-every", type=int, default=10)
    args = parser.parse_args()
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    config = load_config(args.config, [f"iterations={args.iterations}", f"eval.every={args.eval_every}"])

    from spotrl.flows import artifacts, rundir
    from spotrl.flows import train as train_module
    from spotrl.flows.local_server import local_api_server

    spent: dict[str, list[float]] = defaultdict(list)

    def timed(owner, name: str, label: str) -> None:
        inner = getattr(owner, name)

        def wrapper(*a, **k):
            started = time.perf_counter()
            try:
                return inner(*a, **k)
            finally:
                spent[label].append(time.perf_counter() - started)

        setattr(owner, name, wrapper)

    timed(train_module, "sync_tensorboard", "tensorboard")
    timed(train_module, "make_report", "report")
    timed(artifacts.Progress, "update", "progress_artifact")
    timed(artifacts, "publish_evaluations", "eval_table_artifact")
    timed(artifacts, "publish_summary", "summary_artifact")

    run_dir = tempfile.mkdtemp(prefix="spotrl-bench-reporting-")
    with local_api_server():
        train_module.train(config=config, run_dir=run_dir)
    metrics = rundir.read_records(run_dir, "metrics")
    iteration_seconds = sum(m["seconds"] for m in metrics)
    figures = {
        "config": args.config,
        "iterations": len(metrics),
        "iteration_seconds_mean": iteration_seconds / len(metrics),
        **{f"{label}_ms_mean": 1e3 * sum(t) / len(t) for label, t in spent.items()},
        **{f"{label}_calls": len(t) for label, t in spent.items()},
        **{f"{label}_fraction": sum(t) / iteration_seconds for label, t in spent.items()},
    }
    figures["views_fraction"] = sum(sum(t) for t in spent.values()) / iteration_seconds
    for key, value in figures.items():
        print(f"{key:32s} {value:.4g}" if isinstance(value, float) else f"{key:32s} {value}")
    print(json.dumps(figures, sort_keys=True))


if __name__ == "__main__":
    main()
