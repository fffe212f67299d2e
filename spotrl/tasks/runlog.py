"""The run's own lines (warm start, iterations, evaluations, resume): on the terminal as plain lines,
and in the Prefect logs of the flow or task run that said them, at INFO. A long step (the warm start)
is one updating progress bar on a terminal (an evaluation too), and plain lines where the output is not one (CI, a
Prefect worker's log): no control characters there.

Independent of PREFECT_LOGGING_LEVEL: `spotrl train` quiets Prefect's per-task chatter to WARNING, and
these lines must still reach the UI. The terminal gets the bare line (no timestamp or level), as a
print would, on whatever `sys.stdout` is at that moment; Prefect's API handler gets the record, and
only inside a flow or task run (a stage called as a plain function, `spotrl eval`, logs to the
terminal alone).
"""

from __future__ import annotations

import logging
import shutil
import sys


class _Terminal(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "api_only", False):  # a progress bar shows it on the terminal
            return
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


class Progress:
    """`progress(step, {"loss": "2.449", ...})` for a loop of `total` steps at most: on a terminal a
    tqdm bar (steps/s and the fields), else the line "<what> step N: loss 2.449, ..."; the Prefect
    logs get the line either way. `plain=False`: no lines off a terminal (a short step whose result
    gets its own line), and `unit` names what is counted on the bar."""

    def __init__(self, what: str, total: int, unit: str = "step", plain: bool = True):
        self.what, self.total, self.unit, self.plain, self.bar = what, total, unit, plain, None

    def __enter__(self) -> Progress:
        if sys.stdout.isatty():
            from tqdm import tqdm

            # a terminal that reports a size of 0 (a bare pty) gets shutil's fallback, not a hidden bar
            size = shutil.get_terminal_size()
            self.bar = tqdm(
                total=self.total,
                desc=self.what,
                unit=self.unit,
                file=sys.stdout,
                leave=False,
                ncols=size.columns,
                nrows=size.lines,
            )
        return self

    def __call__(self, step: int, fields: dict) -> None:
        line = f"{self.what} {self.unit} {step}: " + ", ".join(f"{k} {v}" for k, v in fields.items())
        if self.bar is None:
            if self.plain:
                say(line)
            return
        self.bar.update(step - self.bar.n)
        self.bar.set_postfix(fields, refresh=True)
        _logger().info(line, extra={"api_only": True})

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()
