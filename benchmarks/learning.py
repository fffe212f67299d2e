"""RL against its baselines from one warm start: held-out pass@1 and pass@k against training time.

One warm start is made once (`spotrl train ... --set iterations=0`); every arm starts from its
checkpoint (the same weights), on the same prompts and verifier, for the same training-time budget:

  (a) grpo: RL as `spotrl train` runs it (`algorithm.name=grpo`, the run's defaults);
  (b) rft:  rejection-sampling fine-tuning (`algorithm.name=rft`): G samples per prompt, the
            verified ones trained on with the warm start's supervised step;
  (c) sft:  continued supervised training on the labels (the warm start continued: its step, its
            learning rate and batch size, on the training prompts' target completions). Only for a
            problem with labels: one whose warm-start targets the verifier accepts; otherwise
            skipped with a note (a problem whose warm start teaches the format, not solutions).

The budget counts training time only: the sum of the iterations' `seconds` for (a) and (b) (the
first includes its compilation; process start-up and the warm start do not count), the supervised
steps' wall time for (c). Arms run one after another (the CPU is shared). Evaluation is kept out of
the budget: each arm keeps every weight version, and afterwards the newest version trained within
t is evaluated for t on a grid of `--points` times, by the run's own evaluation (the `evaluate`
stage's function: `eval.prompts` held-out prompts, `eval.n` samples each, pass@1 and pass@`eval.k`).

    python benchmarks/learning.py [--budget-seconds 300] [--points 6] [--preset tiny]
        [--problem arithmetic] [--set KEY=VALUE ...] [--arm-set rft:KEY=VALUE ...] [--out DIR]

Prints a table per arm, saves a plot (OUT/learning.png), and prints one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spotrl.chaos import run_attempt, train_command  # noqa: E402
from spotrl.flows.preemption import EXIT_PREEMPTED  # noqa: E402
from spotrl.flows.testing import harness_server, isolate_prefect  # noqa: E402
from spotrl.storage.records import read_jsonl  # noqa: E402

ITERATION_LINE = re.compile(r"^iteration\s+(\d+)/\d+\s.*\s([\d.]+)s$")
LABELLED = 0.95  # the share of warm-start targets the verifier must accept for the problem to have labels


def _train_for(run_dir: Path, overrides: list[str], extra: list[str], budget: float, env: dict) -> list[tuple]:
    """Run `spotrl train` until its iterations' seconds add up to `budget` (then SIGTERM: the
    running stage finishes, exit code 75); returns (iteration, training seconds so far) per iteration."""
    command = train_command(run_dir, overrides, extra)
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    progress, tail, total = [(0, 0.0)], [], 0.0
    for line in process.stdout:
        tail = (tail + [line])[-40:]
        match = ITERATION_LINE.match(line.strip())
        if match:
            total += float(match.group(2))
            progress.append((int(match.group(1)), total))
            if total >= budget and process.poll() is None:
                process.send_signal(signal.SIGTERM)
    code = process.wait()
    if code not in (0, EXIT_PREEMPTED):
        raise RuntimeError(f"{run_dir}: spotrl train exited with {code}:\n{''.join(tail)}")
    return progress


def newest_within(progress: list[tuple], t: float) -> tuple:
    """(version, seconds) of the newest (version, seconds so far) pair trained within `t` seconds."""
    return max((p for p in progress if p[1] <= t), key=lambda p: p[1])


def _evaluate(run_dir: Path, versions: list[int]) -> dict[int, dict]:
    """The run's evaluation (the `evaluate` stage's function) of each weight version."""
    from spotrl.flows import rundir
    from spotrl.storage.weights import WeightStore
    from spotrl.tasks.stages import evaluate

    config = rundir.read_config(run_dir)
    store = WeightStore(run_dir / "weights")
    results = {}
    for version in sorted(set(versions)):
        ref = {"version": version, "sha256": store.digest(version)}
        results[version] = evaluate.fn(config, str(run_dir.resolve()), ref, version)
    return results


def _labels_verify(ctx) -> float:
    """The share of (up to 256) training prompts whose warm-start target the verifier accepts."""
    from spotrl.rewards.score import score

    prompts, answers, targets = ctx.problem_spec.warm_start_examples(ctx.split("train"))
    if not targets:
        return 0.0
    answers, targets = answers[:256], targets[:256]
    return float(score(ctx.problem_spec.verifier, targets, [True] * len(targets), answers).mean())


def _continued_sft(warm_dir: Path, run_dir: Path, budget: float, grid: list[float]) -> tuple[list[tuple], str | None]:
    """Arm (c) in this process: the warm start's supervised steps continued from its checkpoint on the
    labels; the weights at each grid time are published as versions 1, 2, ... of `run_dir` (seeded
    from the warm start: same data, version 0 the warm-start weights). Returns ((version, seconds,
    steps) per grid time, or a note why the arm was skipped)."""
    import jax

    from spotrl.flows import rundir
    from spotrl.flows.resume import seed_from_warm_start
    from spotrl.rl.warmstart import supervised_steps
    from spotrl.rng import derive_numpy_rng
    from spotrl.tasks.context import RunContext

    config = rundir.read_config(warm_dir)
    config = config.model_copy(update={"weights": config.weights.model_copy(update={"keep": len(grid) + 1})})
    seed_from_warm_start(run_dir, config, warm_dir)
    ctx = RunContext(run_dir, config)
    verified = _labels_verify(ctx)
    if verified < LABELLED:
        return [], f"skipped: {verified:.0%} of the warm start's targets verify, so they are no labels"
    state, _ = ctx.checkpoints.restore(0, ctx.state_template())
    prompts, _, targets = ctx.problem_spec.warm_start_examples(ctx.split("train"))
    steps = supervised_steps(
        ctx.policy.graphdef,
        state["params"],
        ctx.tokenizer,
        prompts,
        targets,
        config.warmstart,
        derive_numpy_rng(config.seed, "continued-sft"),
        config.rollout.max_new_tokens,
    )
    points, pending, started = [(0, 0.0, 0)], list(grid), time.perf_counter()
    for step, params, loss in steps:
        jax.block_until_ready(loss)
        elapsed = time.perf_counter() - started
        while pending and elapsed >= pending[0]:
            pending.pop(0)
            publishing = time.perf_counter()
            keep = jax.device_get(params)  # the next step donates these
            version = len(points)
            ctx.weights.publish(version, ctx.policy.to_pure(keep), {"continued_sft_steps": step})
            points.append((version, elapsed, step))
            started += time.perf_counter() - publishing  # publishing is not training time
        if not pending:
            break
    return points, None


def _table(arms: dict, k: int) -> str:
    lines = []
    for name, arm in arms.items():
        lines.append(f"\n({name}) {arm['label']}")
        if arm.get("note"):
            lines.append(f"  {arm['note']}")
            continue
        lines.append(f"  {'at s':>6}{'trained s':>10}{arm['unit']:>11}{'pass@1':>9}{f'pass@{k}':>9}")
        for p in arm["points"]:
            lines.append(
                f"  {p['at']:>6.0f}{p['seconds']:>10.1f}{p['progress']:>11}{p['pass_at_1']:>9.1%}{p['pass_at_k']:>9.1%}"
            )
    return "\n".join(lines)


def _plot(arms: dict, k: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, arm in arms.items():
        if not arm["points"]:
            continue
        xs = [p["seconds"] for p in arm["points"]]
        for ax, key in zip(axes, ("pass_at_1", "pass_at_k")):
            ax.plot(xs, [p[key] for p in arm["points"]], marker="o", label=name)
    for ax, title in zip(axes, ("held-out pass@1", f"held-out pass@{k}")):
        ax.set_xlabel("training time (s)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget-seconds", type=float, default=300.0, help="training seconds per arm")
    parser.add_argument("--points", type=int, default=6, help="evaluations per arm after the warm start's")
    parser.add_argument("--preset", default=None, help="a shipped preset or YAML file (spotrl train --config)")
    parser.add_argument("--problem", default=None, help="problem.name (default: the preset's)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--arm-set",
        action="append",
        default=[],
        metavar="ARM:KEY=VALUE",
        help="an override for one of the arms grpo and rft only (not the warm-start sections)",
    )
    parser.add_argument("--out", default=None, help="where the runs and the plot go (default: a temporary directory)")
    args = parser.parse_args()

    home = Path(args.out or tempfile.mkdtemp(prefix="spotrl-bench-learning-")).resolve()
    home.mkdir(parents=True, exist_ok=True)
    overrides = args.overrides + ([f"problem.name={args.problem}"] if args.problem else [])
    extra = ["--config", args.preset] if args.preset else []
    arm_sets: dict[str, list[str]] = {}
    for item in args.arm_set:
        arm, _, setting = item.partition(":")
        arm_sets.setdefault(arm, []).append(setting)
    budget, grid = args.budget_seconds, [args.budget_seconds * (j + 1) / args.points for j in range(args.points)]

    isolate_prefect(home / "prefect")
    with harness_server() as api_url:
        env = {**os.environ, "PREFECT_API_URL": api_url}
        warm_dir = home / "warm"
        started = time.perf_counter()
        warm = run_attempt(warm_dir, overrides + ["iterations=0"], env=env, extra_args=extra, timeout=3600)
        assert warm.returncode == 0, warm.output[-4000:]
        warm_seconds = time.perf_counter() - started
        before = read_jsonl(warm_dir / "eval.jsonl")[0]
        k = before["k"]
        print(f"warm start: {warm_seconds:.0f} s, pass@1 {before['pass_at_1']:.1%}, pass@{k} {before['pass_at_k']:.1%}")

        arms = {}
        labels = {"grpo": "GRPO, as spotrl train runs it", "rft": "rejection-sampling fine-tuning (algorithm.name=rft)"}
        for name in ("grpo", "rft"):
            run_dir = home / name
            arm_overrides = overrides + arm_sets.get(name, [])
            arm_overrides += ["iterations=1000000", f"algorithm.name={name}", "weights.keep=1000000"]
            progress = _train_for(run_dir, arm_overrides, extra + ["--warm-start-from", str(warm_dir)], budget, env)
            chosen = [newest_within(progress, t) for t in grid]
            results = _evaluate(run_dir, [v for v, _ in chosen])
            points = [{"at": 0.0, "seconds": 0.0, "progress": 0, **before}]
            points += [{"at": t, "seconds": s, "progress": v, **results[v]} for t, (v, s) in zip(grid, chosen)]
            arms[name] = {"label": labels[name], "unit": "iteration", "points": points, "iterations": progress[-1][0]}
            print(f"{name}: {progress[-1][0]} iterations in {progress[-1][1]:.1f} s of training", flush=True)

        sft_points, note = _continued_sft(warm_dir, home / "sft", budget, grid)
        arm = {"label": "continued supervised training on the labels", "unit": "step", "points": []}
        if note:
            arm["note"] = note
        else:
            results = {0: before, **_evaluate(home / "sft", [v for v, _, _ in sft_points[1:]])}
            arm["points"] = [
                {"at": t, "seconds": s, "progress": n, **results[v]} for t, (v, s, n) in zip([0.0, *grid], sft_points)
            ]
            arm["steps"] = sft_points[-1][2]
        arms["sft"] = arm

    print(
        f"\nfrom one warm start (held-out pass@1 {before['pass_at_1']:.1%}, pass@{k} {before['pass_at_k']:.1%}), "
        f"{budget:.0f} s of training each. At each time: the newest weights trained within it (trained s), "
        "after how many RL iterations or supervised steps"
    )
    print(_table(arms, k))
    plot = home / "learning.png"
    _plot(arms, k, plot)
    print(f"\nplot: {plot}\nruns: {home}")
    keys = ("at", "seconds", "progress", "pass_at_1", "pass_at_k")
    summary = {
        "budget_seconds": budget,
        "k": k,
        "warm_start": {"pass_at_1": before["pass_at_1"], "pass_at_k": before["pass_at_k"], "seconds": warm_seconds},
        "arms": {
            name: {
                "points": [{key: round(p[key], 4) for key in keys} for p in arm["points"]],
                **({"note": arm["note"]} if arm.get("note") else {}),
                **(
                    {"pass_at_k_relative_gain": round(arm["points"][-1]["pass_at_k"] / before["pass_at_k"] - 1, 4)}
                    if arm["points"] and before["pass_at_k"]
                    else {}
                ),
            }
            for name, arm in arms.items()
        },
        "plot": str(plot),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
