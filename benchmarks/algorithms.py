"""Algorithm presets side by side: held-out pass@1 and pass@k after the same wall-time budget.

One warm start (the default config's supervised start, seed 0) is made once; every preset starts
from it (`spotrl train --warm-start-from`), trains for `--budget` seconds of wall time, and is then
stopped with SIGTERM (the preemption path: the running stage finishes, exit code 75). The newest
published weights are evaluated on the held-out prompts (`spotrl eval`). Same seed, same data
order, same starting policy; only `algorithm.name` differs.

    python benchmarks/algorithms.py [--budget 60] [--presets grpo,dapo,...] [--set key=value ...]

Prints a table, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spotrl.algorithm_presets import ALGORITHMS  # noqa: E402
from spotrl.chaos import run_attempt, train_command  # noqa: E402
from spotrl.flows.preemption import EXIT_PREEMPTED  # noqa: E402
from spotrl.flows.testing import harness_server, isolate_prefect  # noqa: E402
from spotrl.storage.records import read_jsonl  # noqa: E402


def _train_for(run_dir: Path, overrides: list[str], warm_dir: Path, budget: float, env: dict) -> dict:
    command = train_command(run_dir, overrides) + ["--warm-start-from", str(warm_dir)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started = {}

    def watch():
        for line in process.stdout:
            if line.startswith("iteration") and "t" not in started:
                started["t"] = time.monotonic()  # the budget counts from the first RL iteration

    reader = threading.Thread(target=watch, daemon=True)
    reader.start()
    while "t" not in started and process.poll() is None:
        time.sleep(0.05)
    if process.poll() is None:
        time.sleep(max(0.0, budget - (time.monotonic() - started["t"])))
        process.send_signal(signal.SIGTERM)
    code = process.wait()
    reader.join(timeout=5)
    if code not in (0, EXIT_PREEMPTED):
        raise RuntimeError(f"{run_dir}: spotrl train exited with {code}")
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    return {
        "iterations": len(metrics),
        "seconds": round(time.monotonic() - started["t"], 1),
        "train_reward_last10": round(sum(m["reward_mean"] for m in metrics[-10:]) / max(len(metrics[-10:]), 1), 4),
    }


def _evaluate(run_dir: Path, env: dict) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "spotrl", "eval", "--run-dir", str(run_dir), "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget", type=float, default=60.0, help="seconds of RL per preset")
    parser.add_argument("--presets", default=",".join(ALGORITHMS))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="spotrl-bench-algorithms-"))
    isolate_prefect(home / "prefect")
    with harness_server() as api_url:
        env = {**os.environ, "PREFECT_API_URL": api_url}
        warm_dir = home / "warm"
        warm = run_attempt(warm_dir, args.overrides + ["iterations=0"], env=env)
        assert warm.returncode == 0, warm.output
        before = read_jsonl(warm_dir / "eval.jsonl")[0]
        rows = []
        for name in args.presets.split(","):
            run_dir = home / name
            trained = _train_for(
                run_dir, args.overrides + ["iterations=100000", f"algorithm.name={name}"], warm_dir, args.budget, env
            )
            result = _evaluate(run_dir, env)
            rows.append(
                {
                    "preset": name,
                    **trained,
                    "pass_at_1": round(result["pass_at_1"], 4),
                    "pass_at_k": round(result["pass_at_k"], 4),
                    "k": result["k"],
                }
            )
            print(f"{name}: {rows[-1]}", flush=True)

    k = before["k"]
    print(
        f"\nfrom the same warm start (held-out pass@1 {before['pass_at_1']:.1%}, pass@{k} {before['pass_at_k']:.1%}), "
        f"{args.budget:.0f} s of RL each:"
    )
    print(f"{'preset':<14}{'iterations':>11}{'pass@1':>9}{f'pass@{k}':>9}{'train reward (last 10)':>24}")
    for row in rows:
        print(
            f"{row['preset']:<14}{row['iterations']:>11}{row['pass_at_1']:>9.1%}{row['pass_at_k']:>9.1%}"
            f"{row['train_reward_last10']:>24.3f}"
        )
    print(
        json.dumps(
            {
                "budget_seconds": args.budget,
                "before": {"pass_at_1": before["pass_at_1"], "pass_at_k": before["pass_at_k"], "k": k},
                "presets": rows,
            }
        )
    )


if __name__ == "__main__":
    main()
