"""Test isolation: Prefect gets its own temporary home, quiet logs and no analytics.

Set before anything imports prefect, since Prefect reads its settings at import time.
"""

import os
import tempfile
from pathlib import Path

_HOME = Path(tempfile.mkdtemp(prefix="spotrl-tests-prefect-"))
os.environ["PREFECT_HOME"] = str(_HOME)
os.environ["PREFECT_RESULTS_LOCAL_STORAGE_PATH"] = str(_HOME / "results")
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["PREFECT_LOGGING_LEVEL"] = "WARNING"
os.environ.pop("PREFECT_API_URL", None)

import pytest  # noqa: E402

from spotrl.flows.config import build_config  # noqa: E402

TINY_OVERRIDES = [
    "iterations=2",
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.num_layers=2",
    "task.train_size=2000",
    "task.eval_size=40",
    "warmstart.max_steps=20",
    "warmstart.check_prompts=32",
    "rollout.prompts_per_iteration=8",
    "rollout.group_size=4",
    "rollout.shards=2",
    "algorithm.minibatches=2",
    "eval.n=4",
    "eval.k=2",
    "eval.prompts=16",
]


@pytest.fixture(scope="session")
def tiny_config():
    """A config whose whole flow runs in seconds: two RL iterations of a 2-layer model."""
    return build_config(None, TINY_OVERRIDES)


@pytest.fixture(scope="session")
def prefect_harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
