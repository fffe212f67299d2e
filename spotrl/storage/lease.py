"""An exclusive lease held as an object on an object store (the RUN/.lock of a gs:// run directory).

An object store has no flock, and nothing releases a lock when its holder is SIGKILLed. So the lock
is an object naming its holder and an expiry; the holder renews it every third of its lifetime, and
every write of it is conditional on the generation the writer last saw, so two processes cannot
both take it (the loser's write fails with 412 and it reads again). A lease left behind by a killed
process is taken over once it expires, or at once when its holder was on this host and its pid is
gone (the common case: the same machine runs the same command again after a kill).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time

from spotrl.storage.paths import RemotePath, delete_if_generation, generation, put_if_generation


class LeaseHeld(RuntimeError):
    pass


def worker_id() -> str:
    """This process as `host:pid`: the holder of its weight-store leases, and the worker a rollout
    reports (metrics' timing.rollout_workers)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _holder_text() -> str:
    return f"pid {os.getpid()} on {socket.gethostname()}"


def _body(ttl: float) -> bytes:
    return json.dumps(
        {"holder": _holder_text(), "pid": os.getpid(), "host": socket.gethostname(), "expires_unix": time.time() + ttl}
    ).encode()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stale(lease: dict) -> bool:
    if lease.get("expires_unix", 0) < time.time():
        return True
    return lease.get("host") == socket.gethostname() and not _pid_alive(int(lease.get("pid", -1)))


def _acquire(path: RemotePath, ttl: float) -> int:
    for _ in range(20):
        seen = generation(path)
        if seen:
            try:
                lease = json.loads(path.read_bytes())
            except FileNotFoundError:
                continue  # released between the two reads
            except ValueError:
                lease = {}  # not ours or damaged: treat as expired
            if not _stale(lease):
                left = lease["expires_unix"] - time.time()
                raise LeaseHeld(
                    f"{lease.get('holder', 'another process')} (lease {path}, expires in {left:.0f} s unless renewed)"
                )
        taken = put_if_generation(path, _body(ttl), seen)
        if taken is not None:
            return taken
    raise LeaseHeld(f"another process (lease {path} keeps changing)")


@contextlib.contextmanager
def object_lease(path: RemotePath, ttl: float = 60.0):
    """Hold the lease at `path` for the duration of the block; LeaseHeld names the current holder."""
    held = {"generation": _acquire(path, ttl)}
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(ttl / 3):
            new = put_if_generation(path, _body(ttl), held["generation"])
            if new is None:  # it expired while this process stalled, and another one took it
                print(f"warning: lost the lease {path} to another process", flush=True)
                return
            held["generation"] = new

    thread = threading.Thread(target=renew, name="lease-renewal", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        delete_if_generation(path, held["generation"])
