"""Counting XLA compilations, so that "no recompilation in steady state" is a measured metric.

JAX reports every backend compilation through `jax.monitoring` (the event
`/jax/core/compile/backend_compile_duration`, with the jitted function's name). Importing this
module registers one process-wide listener that counts them, in total and per function name:

    mark = compile_count()                 # before an iteration
    ...                                    # rollout, update
    metrics["compilations"] = compile_count() - mark

or, around one piece of work in the current process,

    with CompileCounter() as c:
        generate_groups(...)
    c.count, c.by_name, c.seconds

The count is process-wide: work running concurrently in other threads (overlapping rollouts)
is counted too. (`spotrl.rollout.sampler.jit_cache_sizes()` reads the sampler's jit caches directly,
independent of the listener.)
"""

from __future__ import annotations

import collections
import threading

import jax

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"

_lock = threading.Lock()
_total = 0
_seconds = 0.0
_by_name: collections.Counter = collections.Counter()


def _listener(event: str, duration: float, **kwargs) -> None:
    global _total, _seconds
    if event != BACKEND_COMPILE_EVENT:
        return
    with _lock:
        _total += 1
        _seconds += duration
        _by_name[str(kwargs.get("fun_name", "?"))] += 1


jax.monitoring.register_event_duration_secs_listener(_listener)


def compile_count() -> int:
    """XLA compilations in this process since this module was imported."""
    with _lock:
        return _total


def compile_seconds() -> float:
    """Seconds spent in XLA compilation in this process since this module was imported."""
    with _lock:
        return _seconds


def compile_counts_by_name() -> dict[str, int]:
    """Compilations per jitted function name (e.g. `_generate_groups`, `step`, `score`)."""
    with _lock:
        return dict(_by_name)


class CompileCounter:
    """Compilations between __enter__ and __exit__ (or `reset()` and now): count, seconds, by_name."""

    def __init__(self):
        self.reset()

    def reset(self) -> CompileCounter:
        with _lock:
            self._start = (_total, _seconds, collections.Counter(_by_name))
        self._end = None
        return self

    def __enter__(self) -> CompileCounter:
        return self.reset()

    def __exit__(self, *exc) -> None:
        with _lock:
            self._end = (_total, _seconds, collections.Counter(_by_name))

    def _now(self):
        if self._end is not None:
            return self._end
        with _lock:
            return (_total, _seconds, collections.Counter(_by_name))

    @property
    def count(self) -> int:
        return self._now()[0] - self._start[0]

    @property
    def seconds(self) -> float:
        return self._now()[1] - self._start[1]

    @property
    def by_name(self) -> dict[str, int]:
        return dict(self._now()[2] - self._start[2])
