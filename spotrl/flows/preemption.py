"""Graceful preemption: SIGTERM lets the running task finish, then the run stops at a safe point.

Spot VMs and TPUs get SIGTERM about 30 s before they are taken away. Inside a flow run Prefect
replaces the SIGTERM handler with one that raises at once (the flow run would be Crashed mid-task),
so the train flow installs this guard for its body: SIGTERM only sets a flag; the flow checks it
between stages (`guard.check`) and stops with `Preempted` once the running stage has finished and
its outputs are checkpointed. If the stage does not finish within the grace period, the process
exits at the deadline: SIGKILL-equivalent, which loses at most that stage.

A SIGTERM that Prefect's runner sends to cancel a flow run (it marks a control intent first) is
passed on to Prefect's own handler, so cancelling from the UI still cancels.

`Preempted` is a BaseException: Prefect marks the flow run Crashed (infrastructure went away, not a
bug), which is what the crashed-run automation in deployments/ re-submits. The CLI exits with
`EXIT_PREEMPTED` (75, EX_TEMPFAIL: "temporary failure, try again").
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable

EXIT_PREEMPTED = 75


class Preempted(BaseException):
    """The run stopped at a safe point after SIGTERM; running the same command resumes it."""


def _prefect_control_intent() -> str | None:
    try:
        from prefect._internal import control_listener
    except ImportError:  # pragma: no cover - a Prefect without the control channel
        return None
    return control_listener.get_intent()


class PreemptionGuard:
    def __init__(self, grace_seconds: float, on_deadline: Callable[[], None] | None = None):
        self.grace_seconds = grace_seconds
        self.on_deadline = on_deadline
        self.requested_at: float | None = None
        self._previous = None
        self._installed = False
        self._timer: threading.Timer | None = None

    @property
    def requested(self) -> bool:
        return self.requested_at is not None

    def __enter__(self) -> PreemptionGuard:
        if threading.current_thread() is threading.main_thread():  # signals can only be set there
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
            self._installed = True
        return self

    def __exit__(self, *exc) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)

    def _on_sigterm(self, signum, frame) -> None:
        if _prefect_control_intent() is not None and callable(self._previous):
            self._previous(signum, frame)  # Prefect's runner is cancelling this flow run
            return
        if self.requested:
            return
        self.requested_at = time.monotonic()
        print(f"SIGTERM: finishing the running stage (up to {self.grace_seconds:g} s), then stopping", flush=True)
        self._timer = threading.Timer(self.grace_seconds, self._deadline)
        self._timer.daemon = True
        self._timer.start()

    def _deadline(self) -> None:
        print(
            f"preempted: the running stage did not finish within {self.grace_seconds:g} s; exiting, "
            "it will run again on resume",
            file=sys.stderr,
            flush=True,
        )
        if self.on_deadline is not None:
            self.on_deadline()
        os._exit(EXIT_PREEMPTED)

    def check(self, where: str) -> None:
        """Stop here if SIGTERM arrived: everything before this point is persisted."""
        if self.requested:
            if self._timer is not None:
                self._timer.cancel()
            waited = time.monotonic() - self.requested_at
            raise Preempted(
                f"preempted by SIGTERM; stopped {where} after {waited:.1f} s; run the same command to resume"
            )
