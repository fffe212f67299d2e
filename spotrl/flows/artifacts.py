"""What a run shows in the Prefect UI beside its task runs: Prefect artifacts with stable keys, so
the UI keeps one per key and shows its history across runs.

    run-config         the resolved config and its digest (the parameters show only what was passed)
    training-progress  iterations done of the run's total, updated every iteration
    held-out-pass-at-k pass@1 and pass@k by iteration, one row per evaluation (eval.jsonl)
    run-summary        at the end: the before/after table `spotrl train` prints, time, weights digest
    continues          on a resumed run: the flow run it continues
"""

from __future__ import annotations

import time

import yaml

from spotrl.config import RunConfig


def publish_config(config: RunConfig) -> None:
    """The resolved config and its digest (a run's parameters show only what was passed)."""
    from prefect.artifacts import create_markdown_artifact

    body = yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
    create_markdown_artifact(
        key="run-config",
        markdown=f"### Resolved run config `{config.digest()}`\n\n```yaml\n{body}```\n",
        description=f"the config this run trains with (digest {config.digest()})",
    )


def link_flow_run(key: str, flow_run_id: str, text: str) -> None:
    """A link to another flow run in the UI (a markdown note with its id when no UI URL is configured)."""
    from prefect.artifacts import create_link_artifact, create_markdown_artifact
    from prefect.settings import PREFECT_UI_URL

    ui = PREFECT_UI_URL.value()
    if ui:
        create_link_artifact(key=key, link=f"{ui.rstrip('/')}/runs/flow-run/{flow_run_id}", link_text=text)
    else:
        create_markdown_artifact(key=key, markdown=f"{text}: flow run `{flow_run_id}`")


class Progress:
    """The `training-progress` artifact of this flow run: iterations done of the run's total.

    An update is a round trip to the server (measured: ~25-50 ms, as much as 8% of a 0.6 s
    iteration), so it is sent at most every `interval` seconds, and always for the last iteration.
    """

    def __init__(self, done: int, total: int, interval: float = 10.0):
        from prefect.artifacts import create_progress_artifact

        self.total, self.interval = max(total, 1), interval
        self.id = create_progress_artifact(
            progress=100.0 * done / self.total, key="training-progress", description=f"RL iterations of {total}"
        )
        self.sent = time.monotonic()

    def update(self, done: int) -> None:
        if done < self.total and time.monotonic() - self.sent < self.interval:
            return
        from prefect.artifacts import update_progress_artifact

        update_progress_artifact(self.id, progress=100.0 * done / self.total)
        self.sent = time.monotonic()


def publish_evaluations(records: list[dict]) -> None:
    """The held-out pass@k table so far, a row per evaluation."""
    from prefect.artifacts import create_table_artifact

    rows = [
        {
            "iteration": r["iteration"],
            "weights": f"v{r['weights_version']}",
            "pass@1": f"{r['pass_at_1']:.1%}",
            f"pass@{r['k']}": f"{r['pass_at_k']:.1%}",
        }
        for r in sorted({r["iteration"]: r for r in records}.values(), key=lambda r: r["iteration"])
    ]
    create_table_artifact(table=rows, key="held-out-pass-at-k", description="held-out pass@1 and pass@k by iteration")


def summary_table(result: dict) -> str:
    """The before/after table `spotrl train` ends with, from the train flow's result."""
    before, after = result["before"], result["after"]
    k = before["k"]

    def rel(a, b):
        return f"{(b - a) / a:+.1%}" if a > 0 else "n/a"

    rows = [
        ("", "before RL", "after RL", "change"),
        (
            "held-out pass@1",
            f"{before['pass_at_1']:.1%}",
            f"{after['pass_at_1']:.1%}",
            rel(before["pass_at_1"], after["pass_at_1"]),
        ),
        (
            f"held-out pass@{k}",
            f"{before['pass_at_k']:.1%}",
            f"{after['pass_at_k']:.1%}",
            rel(before["pass_at_k"], after["pass_at_k"]),
        ),
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [
        "  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(r, widths))) for r in rows
    ]
    lines.append(f"time taken: {result['seconds']:.1f} s")
    lines.append(f"run directory: {result['run_dir']}")
    if result.get("report"):
        lines.append(f"report: {result['report']}  (TensorBoard: tensorboard --logdir {result['run_dir']}/tensorboard)")
    return "\n".join(lines)


def publish_summary(result: dict, config: RunConfig) -> None:
    """The end of the run, as the terminal shows it, for a deployment's user who has no terminal."""
    from prefect.artifacts import create_markdown_artifact

    create_markdown_artifact(
        key="run-summary",
        markdown=(
            f"### {config.iterations} RL iterations, config `{config.digest()}`\n\n"
            f"```\n{summary_table(result)}\nweights sha256: {result['weights_sha256']}\n```\n"
        ),
        description="held-out pass@k before and after RL",
    )
