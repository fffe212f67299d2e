"""What a run shows in the Prefect UI beside its task runs: Prefect artifacts with stable keys, so
the UI keeps one per key and shows its history across runs."""

from __future__ import annotations

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
