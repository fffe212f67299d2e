"""Run model-written Python against its tests in a sandbox; infrastructure failures are errors, not 0.

Every run starts a fresh interpreter (`python -I -S -B`, the base interpreter, not the trainer's
virtualenv) running `harness.py`, with an empty environment and a new private temporary
directory as cwd. What the candidate gets (Linux; `SandboxResult.isolation` says what was in force):

- its own mount namespace whose root is a fresh tmpfs holding only /usr, /lib*, /bin, /sbin and
  the interpreter's prefix (read-only), /dev/{null,zero,random,urandom}, and /sandbox (= /tmp, its
  cwd): a tmpfs of `tmpfs_mb`. No /proc, /sys, /etc, /home, no trainer files, no host disk writes;
- its own network namespace (only a loopback that is down: no connection leaves it), PID, IPC and
  UTS namespaces: it cannot see or signal the trainer or any other process; when it ends, the kernel
  kills everything it started (fork bombs included);
- an unprivileged identity with no capabilities and no_new_privs: as root, a dedicated uid per run
  (`uid_base` + the harness pid; every process of that uid is also killed at the end); unprivileged
  with user namespaces, uid 0 of a user namespace with every capability dropped;
- rlimits on CPU seconds, address space, file size, processes (counted per uid and namespace),
  open files and core size; a wall-clock limit enforced by the harness (SIGKILL of the namespace);
- an audit hook refusing sockets, ctypes, subprocesses, exec/spawn, signals, frame and gc
  introspection, and (only without a mount namespace) paths outside its directory.

Verdicts: `assert f(x) == <literal>` tests are compared here, in the trainer's process, against
literals that never enter the sandbox (see `code_tests`): exiting early (sys.exit(0), os._exit(0)),
objects whose __eq__ always says yes, or writing fake result records cannot pass them. Records
carry a per-run nonce; the harness binds what it calls before the candidate runs.

Honest limits:
- Other asserts (`assert pred(f(x))`, loops) are evaluated inside the candidate's interpreter; a
  candidate that deliberately reaches the harness's frames through objects the audit hook does not
  cover could forge those. `SandboxResult.trust` says which kind a test file used.
- Without user namespaces and without root, the sandbox refuses to run unless
  `require_isolation=False`; then it runs as the trainer's uid with rlimits and the audit hook only
  (an audit hook is not a security boundary: escapes to native code are blocked only as far as
  ctypes and subprocess are), and a process that calls setsid() can outlive the run.
- No seccomp filter and no cgroup: memory is bounded per process by RLIMIT_AS (so up to
  `processes` x `memory_mb` in total), tmpfs pages by `tmpfs_mb`; CPU time per process by
  RLIMIT_CPU and the whole run by the wall clock.
- A kernel exploit is out of scope; run the trainer itself without secrets it does not need.

A failure of the sandbox itself (could not start, harness crashed, did not report, could not set up
isolation) raises `SandboxError`; `Sandbox.run` retries it `retries` times and then raises, so a
reward stage fails (and is retried by Prefect) instead of scoring the candidate 0.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from spotrl.rewards.code_tests import TestPlan, judge, parse_records, plan_tests

log = logging.getLogger("spotrl.sandbox")

HARNESS = Path(__file__).with_name("harness.py")
HARNESS_GRACE_S = 15.0  # interpreter start, namespace setup and report, on top of the wall limit
STATUSES = ("passed", "failed", "timeout", "limit", "error")


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the candidate): never a reward of 0."""

    def __init__(self, message: str, attempts: int = 1):
        super().__init__(message)
        self.attempts = attempts


class SandboxUnavailable(SandboxError):
    """The required isolation cannot be set up on this machine (not transient: not retried)."""


@dataclass(frozen=True)
class Limits:
    cpu_s: int = 5
    wall_s: float = 10.0
    memory_mb: int = 512
    file_mb: int = 16
    processes: int = 32
    open_files: int = 64
    tmpfs_mb: int = 64
    tmpfs_inodes: int = 4096
    output_kb: int = 64

    def wire(self) -> dict:
        return {
            "cpu_s": int(self.cpu_s),
            "wall_s": float(self.wall_s),
            "memory_bytes": self.memory_mb << 20,
            "file_bytes": self.file_mb << 20,
            "processes": self.processes,
            "open_files": self.open_files,
            "tmpfs_mb": self.tmpfs_mb,
            "tmpfs_inodes": self.tmpfs_inodes,
            "output_bytes": self.output_kb << 10,
        }


@dataclass(frozen=True)
class SandboxResult:
    status: str  # passed, failed, timeout, limit
    reward: float
    tests_passed: int
    tests_total: int
    detail: str = ""
    limit: str | None = None  # which limit: cpu, memory, file_size, disk, processes, open_files, output
    trust: str = "out-of-process"
    seconds: float = 0.0
    cpu_s: float | None = None
    stdout: str = ""
    stderr: str = ""
    isolation: dict = field(default_factory=dict)
    attempts: int = 1

    def to_json(self) -> dict:
        return asdict(self)


class Sandbox:
    """Runs candidates; counts runs, infrastructure errors and retries in `stats`.

    `mode`: "auto" (namespaces; as root a dedicated uid, otherwise a user namespace), "userns" (a
    user namespace even as root: it then maps to uid 0, which RLIMIT_NPROC exempts, so it is meant
    for testing that path, not for use as root), "none" (no namespaces, on purpose: rlimits, a dedicated uid as root,
    the audit hook with path filtering). When "auto"/"userns" cannot create the namespaces, the run
    raises `SandboxUnavailable` unless `require_isolation=False`, which falls back to "none".
    `audit=False` leaves out the audit hook (tests use it to check that the namespaces alone contain
    a program)."""

    def __init__(
        self,
        limits: Limits | None = None,
        *,
        retries: int = 2,
        backoff_s: float = 0.2,
        require_isolation: bool = True,
        mode: str = "auto",
        audit: bool = True,
        python: str | None = None,
        uid_base: int = 1_000_000,
        harness: str | Path | None = None,
    ):
        self.limits = limits or Limits()
        self.retries, self.backoff_s = retries, backoff_s
        if mode not in ("auto", "userns", "none"):
            raise ValueError(f"sandbox mode must be auto, userns or none, got {mode!r}")
        self.require_isolation, self.mode, self.audit = require_isolation, mode, audit
        self.python = python or getattr(sys, "_base_executable", None) or sys.executable
        self.uid_base = uid_base
        self.harness = Path(harness) if harness else HARNESS
        self.stats = {"runs": 0, "infra_errors": 0, "retries": 0}
        self._stats_lock = threading.Lock()

    def _count(self, key: str) -> None:
        with self._stats_lock:
            self.stats[key] += 1

    def run(self, solution: str, tests: str | TestPlan) -> SandboxResult:
        """Run `solution`, then `tests`; retries sandbox failures, raises `SandboxError` after the last."""
        plan = tests if isinstance(tests, TestPlan) else plan_tests(tests)
        attempt = 0
        while True:
            attempt += 1
            try:
                result = self._run_once(solution, plan)
            except SandboxUnavailable as err:
                self._count("infra_errors")
                err.attempts = attempt
                raise
            except SandboxError as err:
                self._count("infra_errors")
                if attempt > self.retries:
                    raise SandboxError(f"sandbox failed {attempt} time(s); last: {err}", attempts=attempt) from err
                self._count("retries")
                log.warning("sandbox failure (attempt %d of %d), retrying: %s", attempt, self.retries + 1, err)
                time.sleep(self.backoff_s * attempt)
                continue
            self._count("runs")
            return SandboxResult(**{**result.to_json(), "attempts": attempt})

    def run_many(self, jobs: list[tuple[str, str | TestPlan]], workers: int = 1) -> list[SandboxResult]:
        """Run (solution, tests) pairs over a pool of `workers` threads (each run is its own process)."""
        if workers <= 1:
            return [self.run(s, t) for s, t in jobs]
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(lambda job: self.run(*job), jobs))

    # -------------------------------------------------------------------------------------------

    def _job(self, solution: str, plan: TestPlan, nonce: str) -> dict:
        return {
            "solution": solution,
            "steps": [step.wire() for step in plan.steps],
            "nonce": nonce,
            "limits": self.limits.wire(),
            "isolation": {
                "mode": self.mode,
                "audit": self.audit,
                "require": self.require_isolation,
                "uid_base": self.uid_base,
            },
        }

    def _run_once(self, solution: str, plan: TestPlan) -> SandboxResult:
        nonce = secrets.token_hex(16)
        payload = json.dumps(self._job(solution, plan, nonce)).encode()
        workdir = tempfile.mkdtemp(prefix="spotrl-sandbox-")
        started = time.monotonic()
        try:
            try:
                proc = subprocess.Popen(
                    [self.python, "-I", "-S", "-B", str(self.harness)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    cwd=workdir,
                    env={},
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as err:
                raise SandboxError(f"could not start the sandbox ({self.python}): {err}") from None
            try:
                out, err = proc.communicate(payload, timeout=self.limits.wall_s + HARNESS_GRACE_S)
            except subprocess.TimeoutExpired:
                self._kill(proc)
                proc.communicate()
                waited = self.limits.wall_s + HARNESS_GRACE_S
                raise SandboxError(f"the sandbox harness did not report within {waited:.0f} s") from None
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        report = _report(out)
        if proc.returncode != 0 or report is None:
            tail = err.decode(errors="replace").strip().splitlines()[-3:]
            raise SandboxError(
                f"the sandbox harness exited with {proc.returncode} without a report: "
                + (" | ".join(tail) or "no output")
            )
        if "unavailable" in report:
            raise SandboxUnavailable(
                f"sandbox isolation is not available here ({report['unavailable']}); "
                "needs root or unprivileged user namespaces, or require_isolation=False"
            )
        try:
            return self._verdict(plan, report, nonce, time.monotonic() - started)
        except (KeyError, TypeError, AttributeError) as err:
            raise SandboxError(f"malformed sandbox report ({type(err).__name__}: {err})") from None

    def _verdict(self, plan: TestPlan, report: dict, nonce: str, seconds: float) -> SandboxResult:
        control = {}
        for message in report.get("control", []):
            control.update(message)
        if "setup_error" in control:
            raise SandboxError(f"sandbox setup failed: {control['setup_error']}")
        ready, records, problem = parse_records(report["records"], nonce)
        if problem and problem.startswith("setup:"):
            raise SandboxError(f"sandbox setup failed: {problem[6:]}")
        if ready is None:
            raise SandboxError(
                "the sandbox did not start the candidate (no ready record); harness stderr: "
                + report.get("stderr", "")[-300:]
            )
        common = {
            "tests_total": plan.tests_total,
            "trust": plan.trust,
            "seconds": seconds,
            "cpu_s": control.get("cpu_s"),
            "stdout": report["stdout"],
            "stderr": report["stderr"],
            "isolation": {**report["isolation"], "uid_seen": ready.get("uid"), "caps": ready.get("caps")},
        }
        verdict = judge(plan, records)
        if verdict.passed and not problem and not report["records_truncated"]:
            return SandboxResult("passed", 1.0, verdict.tests_passed, detail="", **common)

        def failed(status, detail, limit=None):
            return SandboxResult(status, 0.0, verdict.tests_passed, detail=detail, limit=limit, **common)

        if report["timed_out"]:
            return failed("timeout", f"killed after the wall-clock limit of {self.limits.wall_s:g} s")
        status = control.get("c_status")
        cpu = control.get("cpu_s") or 0.0
        if status in (-signal.SIGKILL, -signal.SIGXCPU) and cpu >= 0.9 * self.limits.cpu_s:
            return failed("limit", f"killed at the CPU limit of {self.limits.cpu_s} s", "cpu")
        if report["records_truncated"]:
            return failed("failed", "the candidate flooded the result channel", "output")
        if problem:
            return failed("failed", f"invalid result records: {problem}")
        if verdict.limit:
            return failed("limit", verdict.detail, verdict.limit)
        if isinstance(status, int) and status < 0 and "MemoryError" in report["stderr"]:
            return failed("limit", verdict.detail or "ran out of memory", "memory")
        detail = verdict.detail
        if isinstance(status, int) and status < 0 and not verdict.done:
            detail = f"killed by signal {-status}" + (f"; {detail}" if detail else "")
        return failed("failed", detail or "tests failed")

    def _kill(self, proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the harness and PID 1 of the namespace
        except ProcessLookupError:
            pass
        if os.geteuid() == 0 and self.mode != "userns":  # and every process of the run's dedicated uid
            kill_uid(self.uid_base + proc.pid)


def kill_uid(uid: int, rounds: int = 50) -> int:
    """SIGKILL every process whose real uid is `uid` (a run's dedicated uid; root only), until none is left."""
    killed = 0
    for _ in range(rounds):
        found = 0
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/status") as f:
                    status = f.read()
                if int(status.split("Uid:")[1].split()[0]) == uid:
                    os.kill(int(pid), signal.SIGKILL)
                    found += 1
            except (OSError, IndexError, ValueError):
                continue
        killed += found
        if not found:
            break
        time.sleep(0.01)
    return killed


def _report(out: bytes) -> dict | None:
    for line in reversed(out.decode(errors="replace").splitlines()):
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("event") == "result":
            return obj
    return None


_DEFAULT: Sandbox | None = None


def default_sandbox() -> Sandbox:
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Sandbox()
    return _DEFAULT
