"""Rehearse preemption: run `spotrl train`, kill it at chosen or random moments, resume, compare.

Used by the chaos test and by benchmarks/preemption.py; also a tool for an operator who wants to
see a run survive before trusting it with spot capacity. A kill is either a failpoint (see
spotrl/faults.py: the process SIGKILLs itself at a named point) or an external SIGKILL sent a
random delay after a line appears in the run's output.
"""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

TIMING_MARKERS = ("seconds", "per_s", "time")


def strip_timing(record):
    """A metrics/eval record without its timing fields: keys containing 'seconds', 'per_s' or
    'time', and everything under a 'timing' key. What is left must be identical across runs."""
    if isinstance(record, dict):
        return {
            k: strip_timing(v)
            for k, v in record.items()
            if k != "timing" and not any(marker in k for marker in TIMING_MARKERS)
        }
    if isinstance(record, list):
        return [strip_timing(v) for v in record]
    return record


@dataclasses.dataclass(frozen=True)
class Kill:
    """`failpoint`: a SPOTRL_KILL_AT spec. Otherwise SIGKILL `delay` seconds after `after_line` is printed."""

    failpoint: str | None = None
    after_line: str | None = None
    delay: float = 0.0

    def describe(self) -> str:
        return (
            f"failpoint {self.failpoint}" if self.failpoint else f"SIGKILL {self.delay:.2f}s after {self.after_line!r}"
        )


@dataclasses.dataclass
class Attempt:
    kill: Kill | None
    returncode: int
    started: float  # unix time of the launch
    ended: float
    killed_at: float | None  # unix time the SIGKILL was sent (external kills) or observed (failpoints)
    output: str

    @property
    def was_killed(self) -> bool:
        return self.returncode == -signal.SIGKILL


def train_command(run_dir: Path, overrides: list[str], extra_args: list[str] = ()) -> list[str]:
    sets = [arg for item in overrides for arg in ("--set", item)]
    return [sys.executable, "-m", "spotrl", "train", "--run-dir", str(run_dir), *sets, *extra_args]


def run_attempt(
    run_dir: Path,
    overrides: list[str],
    kill: Kill | None = None,
    env: dict | None = None,
    timeout: float = 600.0,
    on_line=None,
    extra_args: list[str] = (),
) -> Attempt:
    """Run `spotrl train` once; kill it as `kill` says. Returns how it ended and what it printed."""
    env = dict(os.environ if env is None else env)
    env.pop("SPOTRL_KILL_AT", None)
    if kill is not None and kill.failpoint:
        env["SPOTRL_KILL_AT"] = kill.failpoint
    started = time.time()
    process = subprocess.Popen(
        train_command(run_dir, overrides, extra_args),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    )
    lines: list[str] = []
    killed_at: list[float] = []
    timer = threading.Timer(timeout, process.kill)
    timer.start()
    try:
        for line in process.stdout:
            lines.append(line)
            if on_line is not None:
                on_line(process, line)
            if kill is not None and kill.after_line and kill.after_line in line and not killed_at:

                def send(pid=process.pid):
                    killed_at.append(time.time())
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass

                threading.Timer(kill.delay, send).start()
        returncode = process.wait()
    finally:
        timer.cancel()
    ended = time.time()
    if kill is not None and kill.failpoint and returncode == -signal.SIGKILL:
        killed_at.append(ended)
    return Attempt(kill, returncode, started, ended, killed_at[0] if killed_at else None, "".join(lines))


def standard_kills(iterations: int, seed: int = 0) -> list[Kill]:
    """Kills inside rollout, update, checkpoint writing and weight publishing, then random ones."""
    rng = random.Random(seed)
    points = [
        Kill(failpoint="rollout.sample@2"),
        Kill(failpoint="update.step@2"),
        Kill(failpoint="checkpoint.save@3+0.01"),  # lands inside orbax's write
        Kill(failpoint="publish.write@3+0.002"),  # lands inside the safetensors write or just after
        Kill(failpoint="publish.flip@4"),  # version renamed into place, LATEST not flipped
        Kill(failpoint="checkpoint.seal@5"),
    ]
    points += [Kill(after_line=f"iteration {i:>4}/", delay=rng.uniform(0.0, 0.6)) for i in (5, iterations - 1)]
    return points
