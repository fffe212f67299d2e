"""The simulator over fleet sizes and policies: the table, the target check and the plots that
`spotrl simulate` and benchmarks/fleet.py print."""

from __future__ import annotations

import io
import json

from spotrl.fleet.fleet_model import FleetModel
from spotrl.fleet.simulator import SimResult, simulate
from spotrl.storage.atomic import atomic_write_bytes
from spotrl.storage.paths import AnyPath, as_path

FLEET_SIZES = (8, 64, 256, 1024)
POLICY_NAMES = ("fixed", "cost_aware", "async_k1", "async_k2")
PLOT_NAME = "fleet_simulation"


def sweep(
    model: FleetModel,
    sizes=FLEET_SIZES,
    policies=POLICY_NAMES,
    iterations: int = 10,
    seed: int = 0,
) -> list[SimResult]:
    return [simulate(model, size, policy, iterations, seed) for size in sizes for policy in policies]


def format_table(results: list[SimResult]) -> str:
    header = (
        f"{'W':>5} {'policy':<11} {'workers':>7} {'s/iter':>9} {'cost/iter':>10} "
        f"{'idle':>6} {'lost s/iter':>11} {'lost':>6} {'preempt':>7}"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        lines.append(
            f"{r.fleet_size:>5} {r.policy:<11} {r.workers_mean:>7.1f} {r.seconds_per_iteration:>9.1f} "
            f"{r.cost_per_iteration:>10.2f} {r.idle_fraction:>6.1%} {r.work_lost_s_per_iteration:>11.1f} "
            f"{r.work_lost_fraction:>6.1%} {r.preemptions:>7}"
        )
    return "\n".join(lines)


def target_check(results: list[SimResult], cheaper: float = 0.30, slower: float = 0.10) -> dict:
    """The cost-aware policy against the largest fixed fleet: at least `cheaper` cheaper, at most
    `slower` slower (per iteration)."""
    largest = max(r.fleet_size for r in results)
    pick = {r.policy: r for r in results if r.fleet_size == largest}
    fixed, aware = pick["fixed"], pick["cost_aware"]
    saving = 1 - aware.cost_per_iteration / fixed.cost_per_iteration
    time_ratio = aware.seconds_per_iteration / fixed.seconds_per_iteration
    return {
        "fleet_size": largest,
        "cost_aware_workers": aware.workers_mean,
        "cost_saving": round(saving, 4),
        "time_ratio": round(time_ratio, 4),
        "target_met": saving >= cheaper and time_ratio <= 1 + slower,
    }


def as_rows(results: list[SimResult]) -> list[dict]:
    keep = (
        "fleet_size",
        "policy",
        "workers_mean",
        "seconds_per_iteration",
        "cost_per_iteration",
        "idle_fraction",
        "work_lost_s_per_iteration",
        "work_lost_fraction",
        "preemptions",
    )
    return [{k: getattr(r, k) for k in keep} for r in results]


def render_png(results: list[SimResult], title: str) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (
        ("seconds_per_iteration", "seconds per iteration", True),
        ("cost_per_iteration", "cost per iteration", True),
        ("idle_fraction", "idle fraction of rollout workers", False),
        ("work_lost_s_per_iteration", "work lost to preemptions (worker-s / iteration)", False),
    )
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    policies = list(dict.fromkeys(r.policy for r in results))
    for ax, (key, label, log) in zip(axes.flat, panels):
        for policy in policies:
            rows = [r for r in results if r.policy == policy]
            ax.plot([r.fleet_size for r in rows], [getattr(r, key) for r in rows], marker="o", label=policy)
        ax.set_xscale("log", base=2)
        sizes = sorted({r.fleet_size for r in results})
        ax.set_xticks(sizes, [str(n) for n in sizes])
        if log:
            ax.set_yscale("log")
        ax.set_xlabel("fleet size W (rollout workers available)")
        ax.set_title(label, fontsize=10)
        ax.grid(True, alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    return buffer.getvalue()


def write_outputs(results: list[SimResult], out_dir: str | AnyPath, title: str, extra: dict) -> AnyPath:
    """OUT/fleet_simulation.png (the four panels) and OUT/fleet_simulation.json (the table and
    `extra`: the model, the validation, ...); the PNG's path."""
    out = as_path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    png = out / f"{PLOT_NAME}.png"
    atomic_write_bytes(png, render_png(results, title))
    body = {"rows": as_rows(results), **extra}
    atomic_write_bytes(out / f"{PLOT_NAME}.json", json.dumps(body, indent=1, sort_keys=True).encode())
    return png
