"""The run's own lines (warm start, iterations, evaluations, resume): on the terminal as plain lines,
and in the Prefect logs of the flow or task run that said them, at INFO.

Independent of PREFECT_LOGGING_LEVEL: `spotrl train` quiets Prefect's per-task chatter to WARNING, and
these lines must still reach the UI. The terminal gets the bare line (no timestamp or level), as a
print would, on whatever `sys.stdout` is at that moment; Prefect's API handler gets the record, and
only inside a flow or task run (a stage called as a plain function, `spotrl eval`, logs to the
terminal alone).
"""

from __future__ import annotations

import logging
import sys


class _Terminal(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        prefix = "" if record.levelno < logging.WARNING else f"{record.levelname.lower()}: "
        print(prefix + record.getMessage(), file=sys.stdout, flush=True)


class _InRun(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        from prefect.context import FlowRunContext, TaskRunContext

        return FlowRunContext.get() is not None or TaskRunContext.get() is not None


def _logger() -> logging.Logger:
    logger = logging.getLogger("spotrl.run")
    if not logger.handlers:
        from prefect.logging.handlers import APILogHandler

        api = APILogHandler()
        api.addFilter(_InRun())
        logger.addHandler(_Terminal())
        logger.addHandler(api)
        logger.setLevel(logging.INFO)
        logger.propagate = False  # the root's console handler would print it a second time
    return logger


def say(message: str) -> None:
    """One line of the run's progress, for the terminal and the Prefect UI."""
    _logger().info(message)


def warn(message: str) -> None:
    _logger().warning(message)
