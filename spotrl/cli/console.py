"""What `spotrl train` prints without --verbose: the run's own lines, and at most one line per failure.

A stage that fails is reported by three parties at once: the thread that failed (orbax logs its
writer threads' exceptions through absl, gcsfs its last retry), Prefect (the task run, then the flow run, each with the
traceback) and finally the exception the CLI receives. The CLI reports it once, as one line when it
is a failure of the environment and with its traceback when it is a bug, so the console keeps none
of the others. Prefect's API handler is left alone: the UI still gets every record, traceback included.
A retry stays visible as one line: a run that heals itself should still say it had to.

orbax's asyncio writer leaves tensorstore callbacks behind when a write fails; they fire on the
closed loop and Python prints each as an unraisable "RuntimeError: Event loop is closed" (132 lines
in one run that filled its disk). Those say nothing the failure did not, and are dropped.
"""

from __future__ import annotations

import logging
import sys

from spotrl.storage.failures import environment_failure

_RUN_LOGGERS = ("prefect.task_runs", "prefect.flow_runs", "absl", "gcsfs")


class _OneReport(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or not record.name.startswith(_RUN_LOGGERS):
            return True
        message = record.getMessage()
        if record.levelno < logging.ERROR:  # "Failed to write result: No space left": the CLI's line will say it
            return environment_failure(Exception(message)) is None
        if " will start " in message and "Retry " in message:  # Prefect's "Retry 1/2 will start in 1 s"
            record.msg, record.args, record.exc_info, record.exc_text = message.splitlines()[0], None, None, None
            return True
        return False


def _is_closed_loop_noise(unraisable) -> bool:
    return isinstance(unraisable.exc_value, RuntimeError) and str(unraisable.exc_value) == "Event loop is closed"


def quiet() -> None:
    """Keep the console to the run's lines and the CLI's own report of a failure (call after importing Prefect)."""
    loggers = [logging.getLogger()] + [
        lg for lg in logging.root.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]
    for handler in {h for lg in loggers for h in lg.handlers}:
        if type(handler).__name__ == "PrefectConsoleHandler" and not any(
            isinstance(f, _OneReport) for f in handler.filters
        ):
            handler.addFilter(_OneReport())
    if getattr(sys.unraisablehook, "spotrl_quiet", False):
        return
    default = sys.unraisablehook

    def unraisable(u):
        if not _is_closed_loop_noise(u):
            default(u)

    unraisable.spotrl_quiet = True
    sys.unraisablehook = unraisable
