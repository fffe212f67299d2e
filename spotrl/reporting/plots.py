"""The curves of a run as PNGs and one self-contained HTML page: `make_report(run_dir, out=None)`.

One PNG per panel (reward, held-out pass@k, loss and clipping, KL and entropy, throughput and the
time split per stage, staleness and importance ratios); a panel whose keys are all missing is left
out. index.html embeds the PNGs as base64 data URIs (the one file can be moved anywhere), and shows
the resolved config and the eval table. Plain HTML and a little CSS: no script, nothing fetched.
Works on a run of one iteration and on an unfinished one; a gs:// run directory is written through.
"""

from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")  # no display; before pyplot is imported

import matplotlib.pyplot as plt  # noqa: E402

from spotrl.reporting import flatten, step_of  # noqa: E402
from spotrl.storage.atomic import atomic_write_bytes  # noqa: E402
from spotrl.storage.paths import AnyPath, as_path  # noqa: E402
from spotrl.storage.records import read_records  # noqa: E402

REPORT_DIR = "report"
Series = list[tuple[int, float]]  # (iteration, value), in iteration order


@dataclass(frozen=True)
class Axis:
    """One subplot: the series (label, source, key) drawn on it; `stacked` draws them as stacked areas."""

    ylabel: str
    series: tuple[tuple[str, str, str], ...]
    stacked: bool = False


@dataclass(frozen=True)
class Panel:
    name: str  # the PNG's file name, without .png
    title: str
    axes: tuple[Axis, ...]


# sources: "metrics" (metrics.jsonl, flattened), "eval" (eval.jsonl), "derived" (computed below)
PANELS = (
    Panel(
        "reward",
        "Reward",
        (Axis("reward", (("reward", "metrics", "reward_mean"), ("shaped reward", "metrics", "shaped_reward_mean"))),),
    ),
    Panel(
        "pass_at_k",
        "Held-out pass@k",
        (Axis("pass rate", (("pass@1", "eval", "pass_at_1"), ("pass@k", "eval", "pass_at_k"))),),
    ),
    Panel(
        "loss",
        "Loss and clipping",
        (Axis("loss", (("loss", "metrics", "loss"),)), Axis("clip fraction", (("clip frac", "metrics", "clip_frac"),))),
    ),
    Panel(
        "kl_entropy",
        "KL and entropy",
        (
            Axis("KL", (("kl", "metrics", "kl"), ("approx kl", "metrics", "approx_kl"))),
            Axis("entropy", (("entropy", "metrics", "entropy"),)),
        ),
    ),
    Panel(
        "throughput",
        "Throughput and iteration time",
        (
            Axis("tokens / s", (("tokens/s", "metrics", "tokens_per_s"),)),
            Axis(
                "seconds",
                (
                    ("rollout", "metrics", "timing/rollout_seconds"),
                    ("update", "metrics", "timing/update_seconds"),
                    ("rest", "derived", "rest_seconds"),
                ),
                stacked=True,
            ),
        ),
    ),
    Panel(
        "staleness",
        "Staleness and importance ratios",
        (
            Axis("staleness", (("staleness", "metrics", "staleness"),)),
            Axis(
                "importance ratio",
                (
                    ("min", "metrics", "importance_ratio_min"),
                    ("mean", "metrics", "importance_ratio_mean"),
                    ("max", "metrics", "importance_ratio_max"),
                ),
            ),
        ),
    ),
)


# --- pure parts ------------------------------------------------------------------------------------
def series_table(metrics: list[dict], evals: list[dict]) -> dict[str, dict[str, Series]]:
    """Every numeric key per source as (iteration, value) pairs, in iteration order (records without one skipped)."""
    table: dict[str, dict[str, Series]] = {"metrics": {}, "eval": {}, "derived": {}}
    for source, records in (("metrics", metrics), ("eval", evals)):
        for record in sorted((r for r in records if step_of(r) is not None), key=step_of):
            for key, value in flatten(record).items():
                table[source].setdefault(key, []).append((step_of(record), value))
    for record in sorted((r for r in metrics if step_of(r) is not None), key=step_of):
        flat = flatten(record)
        if "seconds" in flat and ("timing/rollout_seconds" in flat or "timing/update_seconds" in flat):
            staged = flat.get("timing/rollout_seconds", 0.0) + flat.get("timing/update_seconds", 0.0)
            table["derived"].setdefault("rest_seconds", []).append(
                (step_of(record), max(flat["seconds"] - staged, 0.0))
            )
    return table


def present_panels(table: dict[str, dict[str, Series]], panels=PANELS) -> list[Panel]:
    """The panels with at least one series present, each cut to its present axes and series."""
    out = []
    for panel in panels:
        axes = []
        for axis in panel.axes:
            series = tuple(s for s in axis.series if table[s[1]].get(s[2]))
            if series and not (axis.stacked and all(s[1] == "derived" for s in series)):
                axes.append(Axis(axis.ylabel, series, axis.stacked))
        if axes:
            out.append(Panel(panel.name, panel.title, tuple(axes)))
    return out


def render_png(panel: Panel, table: dict[str, dict[str, Series]]) -> bytes:
    width, height = 5.5 * len(panel.axes), 3.6
    fig, axes = plt.subplots(1, len(panel.axes), figsize=(width, height), squeeze=False)
    # fixed margins in inches (room for tick labels, the axis labels and the title): tight_layout would
    # draw every figure once more to measure it, 40% of the report's time
    fig.subplots_adjust(left=0.85 / width, right=1 - 0.2 / width, bottom=0.55 / height, top=1 - 0.5 / height)
    fig.subplots_adjust(wspace=0.9 * len(panel.axes) / width)
    try:
        fig.suptitle(panel.title)
        for ax, axis in zip(axes[0], panel.axes):
            marker = "o" if max(len(table[s][k]) for _, s, k in axis.series) <= 30 else None
            if axis.stacked:
                _stacked(ax, axis, table)
            else:
                for label, source, key in axis.series:
                    xs, ys = zip(*table[source][key])
                    ax.plot(xs, ys, label=label, marker=marker, markersize=3)
            ax.set_xlabel("iteration")
            ax.set_ylabel(axis.ylabel)
            ax.grid(alpha=0.3)
            if len(axis.series) > 1:
                ax.legend(fontsize="small")
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=100)
        return buffer.getvalue()
    finally:
        plt.close(fig)


def _stacked(ax, axis: Axis, table: dict[str, dict[str, Series]]) -> None:
    """Stacked areas over the iterations any of the series has (a missing value counts 0)."""
    steps = sorted({step for _, s, k in axis.series for step, _ in table[s][k]})
    columns = [dict(table[s][k]) for _, s, k in axis.series]
    values = [[column.get(step, 0.0) for step in steps] for column in columns]
    if len(steps) == 1:  # an area needs two points: one iteration is a stacked bar
        bottom = 0.0
        for (label, _, _), ys in zip(axis.series, values):
            ax.bar(steps, ys, bottom=bottom, label=label, width=0.6)
            bottom += ys[0]
    else:
        ax.stackplot(steps, values, labels=[label for label, _, _ in axis.series], alpha=0.8)


def eval_rows(evals: list[dict]) -> list[tuple[str, str, str, str]]:
    """The eval table's rows (iteration, weights version, pass@1, pass@k), as text, in iteration order."""

    def cell(value, percent=False):
        if value is None:
            return ""
        if percent and isinstance(value, int | float) and not isinstance(value, bool):
            return f"{100 * value:.1f}%"
        return str(value)

    return [
        (
            cell(r.get("iteration")),
            cell(r.get("weights_version")),
            cell(r.get("pass_at_1"), True),
            cell(r.get("pass_at_k"), True),
        )
        for r in sorted(evals, key=lambda r: (step_of(r) is None, step_of(r) or 0))
    ]


CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.5em; }
img { max-width: 100%; display: block; margin: 0.5em 0; border: 1px solid #ddd; }
table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: right; }
pre { background: #f6f6f6; padding: 1em; overflow-x: auto; font-size: 0.85em; }
"""


def render_html(title: str, summary: str, images: list[tuple[Panel, bytes]], evals: list[dict], config: str) -> str:
    """The one page: plots as data URIs (with a link to each PNG file next to it), eval table, config."""
    esc = html.escape
    parts = [
        "<!DOCTYPE html>",
        f'<html><head><meta charset="utf-8"><title>{esc(title)}</title><style>{CSS}</style></head><body>',
        f"<h1>{esc(title)}</h1>",
        f"<p>{esc(summary)}</p>",
    ]
    for panel, png in images:
        data = base64.b64encode(png).decode()
        parts.append(
            f'<h2>{esc(panel.title)} <small>(<a href="{esc(panel.name)}.png">{esc(panel.name)}.png</a>)</small></h2>'
        )
        parts.append(f'<img alt="{esc(panel.title)}" src="data:image/png;base64,{data}">')
    parts.append("<h2>Held-out evaluation</h2>")
    rows = eval_rows(evals)
    if rows:
        parts.append("<table><tr><th>iteration</th><th>weights version</th><th>pass@1</th><th>pass@k</th></tr>")
        parts += ["<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows]
        parts.append("</table>")
    else:
        parts.append("<p>No evaluation yet.</p>")
    parts.append("<h2>Resolved config</h2>")
    parts.append(f"<pre>{esc(config)}</pre>" if config else "<p>No config.yaml.</p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


# PNGs other commands write into RUN/report/, shown on the page when present
EXTRA_PANELS = (Panel("fleet_simulation", "Fleet simulation (spotrl simulate --run-dir)", ()),)


# --- I/O ------------------------------------------------------------------------------------------
def make_report(run_dir: str | AnyPath, out: str | AnyPath | None = None) -> AnyPath:
    """Write the PNGs and index.html of a run into `out` (default RUN/report/); the path of index.html.

    Raises FileNotFoundError naming the path when the run directory has no metrics.jsonl.
    """
    run_dir = as_path(run_dir)
    metrics_path = run_dir / "metrics.jsonl"
    if not metrics_path.exists():
        raise FileNotFoundError(f"{metrics_path} does not exist: not a run directory, or no iteration finished yet")
    out = as_path(out) if out is not None else run_dir / REPORT_DIR
    metrics, evals = read_records(run_dir, "metrics"), read_records(run_dir, "eval")
    config_path = run_dir / "config.yaml"
    config = config_path.read_text() if config_path.exists() else ""

    table = series_table(metrics, evals)
    images = [(panel, render_png(panel, table)) for panel in present_panels(table)]
    out.mkdir(parents=True, exist_ok=True)
    for panel, png in images:
        atomic_write_bytes(out / f"{panel.name}.png", png)
    images += [(p, (out / f"{p.name}.png").read_bytes()) for p in EXTRA_PANELS if (out / f"{p.name}.png").exists()]
    steps = [s for s in (step_of(r) for r in metrics) if s is not None]
    summary = f"{len(metrics)} iterations recorded" + (f" (last: {max(steps)})" if steps else "")
    summary += f", {len(evals)} evaluations. Run directory: {run_dir}"
    index = out / "index.html"
    atomic_write_bytes(index, render_html(f"spotrl report: {run_dir.name}", summary, images, evals, config).encode())
    return index
