"""Failpoints for chaos tests: SIGKILL this process at a named point of the pipeline.

Preemption is the normal case for spotrl, so the code carries named points where a test (or an
operator rehearsing a failure) can kill the process deterministically, the way etcd's gofail and
FoundationDB's simulation do. With the environment variable unset a failpoint costs one dict lookup.

    SPOTRL_KILL_AT="<point>@<iteration>[+<delay seconds>]"     e.g. "publish.flip@3", "checkpoint.save@2+0.02"

kills the process with SIGKILL when `<point>` is reached at `<iteration>`; with a delay, a timer
fires that long after the point is reached, so the kill lands *inside* the work that follows
(an orbax write, a safetensors write). With `SPOTRL_KILL_ONCE=<path>` it fires only if `<path>` does
not exist, and creates it first (holding the killed pid), so a resubmitted run, or the retry of
a Ray task on another worker, gets past the point.

Points: rollout.sample, reward.score, update.step, checkpoint.save, checkpoint.seal, publish.write,
publish.flip (see `POINTS`).
"""

from __future__ import annotations

import os
import signal
import threading

POINTS = (
    "rollout.sample",  # after generating a shard, before writing it
    "reward.score",  # after scoring, before writing the scored shard
    "update.step",  # after the optimizer steps, before the checkpoint is saved
    "checkpoint.save",  # orbax is about to write the train state (use a delay to land inside)
    "checkpoint.seal",  # the checkpoint is committed, its seal not yet written
    "publish.write",  # a weight version is about to be written (use a delay to land inside)
    "publish.flip",  # the version is renamed into place, LATEST not yet flipped
)


def parse(spec: str) -> tuple[str, int, float]:
    """'<point>@<iteration>[+<delay>]' -> (point, iteration, delay); ValueError names what is wrong."""
    try:
        point, rest = spec.split("@", 1)
        iteration, _, delay = rest.partition("+")
        parsed = point, int(iteration), float(delay or 0.0)
    except ValueError:
        raise ValueError(f"SPOTRL_KILL_AT={spec!r}: expected '<point>@<iteration>[+<delay seconds>]'") from None
    if point not in POINTS:
        raise ValueError(f"SPOTRL_KILL_AT={spec!r}: unknown point {point!r}; known: {', '.join(POINTS)}")
    return parsed


def failpoint(point: str, iteration: int) -> None:
    """Kill the process here if SPOTRL_KILL_AT names this point and iteration."""
    spec = os.environ.get("SPOTRL_KILL_AT")
    if not spec:
        return
    target, at, delay = parse(spec)
    if target != point or at != iteration:
        return
    once = os.environ.get("SPOTRL_KILL_ONCE")
    if once:
        try:
            with open(once, "x") as record:
                record.write(str(os.getpid()))  # which process the kill took
        except FileExistsError:
            return
    kill = lambda: os.kill(os.getpid(), signal.SIGKILL)  # noqa: E731
    if delay > 0:
        threading.Timer(delay, kill).start()
    else:
        kill()
