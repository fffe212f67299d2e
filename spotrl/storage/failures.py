"""Failures of the environment, told apart from bugs: a full disk, a read-only or unwritable run
directory, a store that stopped answering.

Such a failure is not the run's fault and loses nothing (every write commits atomically, and resume
takes the last complete iteration), so the user needs one line, not a traceback: what failed, where,
and what to do. `environment_failure` finds it in an exception however it arrived: an `OSError`
raised here, one chained under Prefect's or orbax's wrapper, or only as text, the way tensorstore
(orbax's writer) reports it (`RESOURCE_EXHAUSTED: ... "PATH" ... [os_error_code='28']`).
Retrying does not help either (a disk does not empty itself in seconds), so the stages' retry
condition asks `is_environment_failure` first.
"""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass

# sysexits.h EX_IOERR ("an error occurred while doing I/O on some file"), next to 75 (preempted)
EXIT_ENVIRONMENT = 74

_NO_SPACE = {errno.ENOSPC, errno.EDQUOT}
_NOT_WRITABLE = {errno.EROFS, errno.EACCES, errno.EPERM}
_UNREACHABLE = {errno.ECONNREFUSED, errno.ECONNRESET, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ETIMEDOUT}
_DEVICE = {errno.EIO}

_OS_ERROR_CODE = re.compile(r"os_error_code='(\d+)'")
_QUOTED_PATH = re.compile(r'"((?:/|gs://)[^"]+)"')
_MESSAGE_ERRNO = {
    "No space left on device": errno.ENOSPC,
    "Disk quota exceeded": errno.EDQUOT,
    "Read-only file system": errno.EROFS,
}
# the parts of the run directory a message can point at, for the advice ("free space under RUN/checkpoints")
_RUN_PARTS = re.compile(
    r"^(.*?/(?:checkpoints|weights|rollouts|prefect-results|data|eval|metrics|curation|difficulty|quarantine))(?:/|$)"
)


@dataclass(frozen=True)
class EnvironmentFailure:
    what: str  # "no space left on device"
    path: str | None  # the file the failing call named, else the run directory (None: neither is known)
    advice: str  # what to do, ending with how to continue

    def line(self) -> str:
        return f"{self.what}: {self.path}. {self.advice}" if self.path else f"{self.what}. {self.advice}"


def _chain(err: BaseException):
    """The exception, its causes and contexts, and the members of exception groups, each once."""
    seen, todo = set(), [err]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo.extend([e.__cause__, e.__context__, *getattr(e, "exceptions", ())])


def _errno_and_path(e: BaseException) -> tuple[int | None, str | None]:
    if isinstance(e, OSError) and e.errno is not None:
        return e.errno, e.filename if isinstance(e.filename, str) else None
    text = str(e)
    code = _OS_ERROR_CODE.search(text)
    number = int(code.group(1)) if code else next((n for m, n in _MESSAGE_ERRNO.items() if m in text), None)
    if number is None:
        return None, None
    paths = _QUOTED_PATH.findall(text)
    return number, paths[-1] if paths else None  # tensorstore names the database first, the failing file last


def _is_network_error(e: BaseException) -> bool:
    """A lost connection that carries no errno: aiohttp's (gcsfs) disconnects, fsspec's timeouts.

    By class name, so that this module imports neither; a plain TimeoutError is not one (a verifier's is its own).
    """
    return isinstance(e, ConnectionError) or any(
        c.__name__ in ("ClientConnectionError", "FSTimeoutError") for c in type(e).__mro__
    )


def _under(path: str | None) -> str | None:
    """The run-directory part a path lies in (RUN/checkpoints for RUN/checkpoints/iter_2.tmp/x), else the path."""
    if path is None:
        return None
    part = _RUN_PARTS.match(path)
    return part.group(1) if part else path


def environment_failure(err: BaseException, run_dir: str | None = None) -> EnvironmentFailure | None:
    """The environment failure behind `err`, or None when it is something else (a bug, bad data)."""
    for e in _chain(err):
        number, named = _errno_and_path(e)
        path = named or run_dir
        if number is None and _is_network_error(e):
            number = errno.ECONNREFUSED
        if number is None:
            continue
        again = "then run the same command again: it resumes after the last complete iteration"
        if number in _NO_SPACE:
            where = _under(named) or run_dir or "the run directory"
            return EnvironmentFailure("no space left on device", path, f"Free space under {where}, {again}.")
        if number in _NOT_WRITABLE:
            what = "read-only file system" if number == errno.EROFS else "permission denied"
            where = run_dir or path or "the run directory"
            return EnvironmentFailure(what, path, f"Make {where} writable for this user, {again}.")
        if number in _DEVICE:
            return EnvironmentFailure("input/output error", path, f"Check the disk under {path}, {again}.")
        if number in _UNREACHABLE:
            detail = f"{type(e).__name__}: {e}".splitlines()[0][:200]
            return EnvironmentFailure(
                f"storage not reachable ({detail})", run_dir, f"When {run_dir or 'it'} answers again, {again}."
            )
    return None


def is_environment_failure(err: BaseException) -> bool:
    """A full disk or an unwritable directory: retrying in seconds cannot help (a network hiccup can)."""
    for e in _chain(err):
        number, _ = _errno_and_path(e)
        if number in _NO_SPACE | _NOT_WRITABLE:
            return True
    return False
