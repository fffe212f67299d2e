"""Prefect for the tests, the benchmarks and tools/screenshots.py: a home of its own, a real server.

    isolate_prefect(home)   before anything imports prefect (Prefect reads its settings at import)
    with harness_server() as api_url: ...   a real Prefect server on a fresh database
    documented_commands(path)   the `$` lines of deployments/prefect.yaml's header
    retry_unavailable_transport()   an httpx transport that waits out the server's 503s

Nothing here imports prefect at module level, so tests/conftest.py can call `isolate_prefect` first.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import time
from collections.abc import Iterator
from pathlib import Path


def isolate_prefect(home: str | os.PathLike) -> None:
    """Give this process, and the processes it starts, a Prefect home of its own (database, profile,
    results), quiet logs and no analytics; a PREFECT_API_URL from the shell is dropped."""
    home = Path(home)
    os.environ["PREFECT_HOME"] = str(home)
    os.environ["PREFECT_RESULTS_LOCAL_STORAGE_PATH"] = str(home / "results")
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    os.environ["PREFECT_LOGGING_LEVEL"] = "WARNING"
    os.environ.pop("PREFECT_API_URL", None)


@contextlib.contextmanager
def harness_server(startup_timeout: float = 120) -> Iterator[str]:
    """A real Prefect server (Prefect's test harness: a fresh SQLite database, a free port) for the
    duration, with this process pointed at it; yields its API URL, for the PREFECT_API_URL of child
    processes (`spotrl train`). Call `isolate_prefect` first."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=startup_timeout):
        from prefect.settings import PREFECT_API_URL

        yield PREFECT_API_URL.value()


def documented_commands(deployment_file: Path) -> list[list[str]]:
    """The `$` lines of deployments/prefect.yaml's header, in order, as argument lists (comments dropped)."""
    commands = []
    for line in Path(deployment_file).read_text().splitlines():
        if not line.startswith("#"):
            break
        if line.startswith("#   $ "):
            commands.append(shlex.split(line[len("#   $ ") :], comments=True))
    return commands


def retry_unavailable_transport(delays: tuple[float, ...] = (0.5, 1, 2, 4)):
    """An httpx transport that retries a 503 after each of `delays`: the server answers it while SQLite
    is locked by its own writers (as Prefect's own client does for its API calls; a CI run once
    failed on one create_flow_run)."""
    import httpx

    class RetryUnavailable(httpx.HTTPTransport):
        def handle_request(self, request):
            for delay in delays:
                response = super().handle_request(request)
                if response.status_code != 503:
                    return response
                response.read()
                response.close()
                time.sleep(delay)
            return super().handle_request(request)

    return RetryUnavailable()
