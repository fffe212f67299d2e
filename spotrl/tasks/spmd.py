"""The trainer's stages on every process of a multi-host run (SPMD: one program, all processes).

In a multi-controller JAX run every process must issue the same computations on the global mesh,
in the same order. Process 0 runs the Prefect flow; a stage that computes on the trainer's mesh
(warm start, update, publish) is marked `@on_every_process`: when process 0 runs its body (not on a
Prefect cache hit, which runs nothing), it first announces the call (stage name and its
reference arguments, through JAX's coordination service), and every other process, in `follow`,
runs the same body with the same arguments. So the other processes follow Prefect's decisions
(cache hits, retries, resume) without talking to Prefect. Rollouts, rewards and evaluations run
in process 0 only, on its own devices (Policy.to_state), and are never announced.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import signal
from collections.abc import Callable

from spotrl import distributed
from spotrl.config import RunConfig

STAGES: dict[str, Callable] = {}  # name -> body, for the followers
STOP = "stop"


def on_every_process(fn: Callable) -> Callable:
    """Mark a stage body that computes on the trainer's global mesh (see the module's docstring).

    Its arguments must be a RunConfig and JSON values (the references stages pass around)."""
    STAGES[fn.__name__] = fn
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def announced(*args, **kwargs):
        if distributed.process_count() > 1 and distributed.is_primary():
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            distributed.announce({"stage": fn.__name__, "arguments": _encode(bound.arguments)})
        return fn(*args, **kwargs)

    return announced


def _encode(arguments: dict) -> dict:
    return {k: v.model_dump(mode="json") if isinstance(v, RunConfig) else v for k, v in arguments.items()}


def _decode(fn: Callable, arguments: dict) -> dict:
    hints = inspect.signature(fn).parameters
    return {
        k: RunConfig.model_validate(v) if hints[k].annotation in (RunConfig, "RunConfig") else v
        for k, v in arguments.items()
    }


def stop(reason: str = "done") -> None:
    """Process 0, at the end of the run: the followers return."""
    if distributed.process_count() > 1 and distributed.is_primary():
        distributed.announce({"stage": STOP, "reason": reason})


@contextlib.contextmanager
def leading():
    """Process 0's run: the followers stop when it ends, also when it fails or is preempted. (When
    process 0 is killed outright, the others abort at once: JAX's coordination service lived in it.)"""
    try:
        yield
    except BaseException as err:
        stop(f"{type(err).__name__}: {err}")
        raise
    stop()


def follow(say=print) -> int:
    """A process other than 0: run the announced stages until process 0 says stop; returns how many ran.

    SIGTERM (a preemption notice: every host of a slice gets it) does not stop a follower: process 0
    finishes the running stage, which needs every process, checkpoints, and then says stop."""
    signal.signal(signal.SIGTERM, lambda *_: say(f"process {distributed.process_index()}: SIGTERM, process 0 decides"))
    done = 0
    while True:
        call = distributed.next_call()
        if call["stage"] == STOP:
            say(f"process {distributed.process_index()}: process 0 ended the run ({call['reason']}); ran {done} stages")
            return done
        fn = STAGES[call["stage"]]
        say(f"process {distributed.process_index()}: {call['stage']}")
        fn(**_decode(fn, call["arguments"]))
        done += 1
