"""The sandbox harness: runs one untrusted Python candidate against its test steps.

Started by `spotrl.rewards.sandbox.runner` as `python -I -S -B harness.py` with an empty
environment, a private temporary directory as cwd and the job (JSON) on stdin. Standard library
only: with -I -S nothing of the trainer's environment (site-packages, PYTHON* variables, the
script's directory) is importable. Three processes:

  H  this process, in the trainer's PID namespace. It creates the namespaces, enforces the
     wall-clock limit and writes the report (JSON lines on stdout: "started", then "result").
  B  H's child: PID 1 of the new PID namespace. It builds the private root (mount namespace),
     forks C, waits for it and exits; when B exits the kernel kills everything left in the
     namespace, so nothing the candidate started outlives it.
  C  B's child: drops to an unprivileged identity, sets resource limits and an audit hook, then
     runs the candidate and the test steps, reporting each step on fd 3.

Isolation (reported in the result's "isolation": which namespaces, and C's "identity"):
  dedicated_uid  the trainer is root: new mount, network, PID, IPC and UTS namespaces; C runs as a
                 dedicated uid (uid_base + H's pid) with no capabilities (without a PID namespace
                 every process of that uid is killed at the end).
  userns_root    the trainer is unprivileged (or mode "userns"): the same namespaces inside a new
                 user namespace; C is uid 0 *inside* it with every capability dropped (outside it
                 is still the trainer's uid, but it sees neither the trainer's files nor processes).
  caller         no namespaces and not root (only if the caller accepted it): resource limits and
                 an audit hook that also filters file paths.
"""

import ctypes
import errno
import json
import os
import resource
import select
import signal
import sys
import time

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
ST_KEEP = 8 | 1024 | 2048 | 4096  # noexec, noatime, nodiratime, relatime: keep them on a read-only remount
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_SET_SECUREBITS = 1, 38, 24, 28
SECUREBITS_LOCKED_NOROOT = 0xEF  # noroot, no_setuid_fixup, keep_caps_locked, no_cap_ambient_raise, all locked
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
RECORD_FD = 3
MAX_RECORDS = 4 << 20
MAX_VALUE_CHARS = 1 << 20

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
libc.unshare.argtypes = [ctypes.c_int]
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _b(s):
    return s.encode() if isinstance(s, str) else s


def mount(source, target, fstype, flags, data=None):
    _check(libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data)), f"mount {target}")


def prctl(option, arg):
    _check(libc.prctl(option, arg, 0, 0, 0), f"prctl {option}")


def capabilities():
    """(effective, permitted) capability masks of this process."""
    header, data = CapHeader(0x20080522, 0), (CapData * 2)()
    _check(libc.capget(ctypes.byref(header), data), "capget")
    return (data[0].effective | data[1].effective << 32, data[0].permitted | data[1].permitted << 32)


def drop_bounding_set(securebits):
    """No capability can come back through exec; with `securebits` (uid 0 of a user namespace) not by
    being uid 0 either, and a later uid change keeps the (empty) sets."""
    if securebits:
        prctl(PR_SET_SECUREBITS, SECUREBITS_LOCKED_NOROOT)
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            if ctypes.get_errno() == errno.EINVAL:
                break  # past the last capability this kernel knows
            raise OSError(ctypes.get_errno(), f"prctl(PR_CAPBSET_DROP, {cap})")


def clear_capabilities():
    header, data = CapHeader(0x20080522, 0), (CapData * 2)()
    _check(libc.capset(ctypes.byref(header), data), "capset")


def write_file(path, text):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------- H


def write_all(fd, data, _write=os.write):
    view = memoryview(data)
    while view:
        view = view[_write(fd, view) :]


def emit(obj):
    write_all(1, (json.dumps(obj) + "\n").encode())


def isolate(job):
    """Enter new namespaces (in H, before forking B). Returns (isolation report, why not or None).

    mode "auto": as root, namespaces without a user namespace and a dedicated uid; otherwise a user
    namespace. "userns": a user namespace even as root (mapping the caller's own uid). "none": no
    namespaces (as root still a dedicated uid)."""
    mode = job["isolation"].get("mode", "auto")
    iso = {
        "identity": "caller",
        "mount": False,
        "net": False,
        "pid": False,
        "ipc": False,
        "uts": False,
        "uid": os.getuid(),
        "audit_hook": bool(job["isolation"].get("audit", True)),
    }
    if mode == "none":
        if os.geteuid() == 0:
            iso["identity"], iso["uid"] = "dedicated_uid", job["isolation"]["uid_base"] + os.getpid()
        return iso, None
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    if mode == "auto" and os.geteuid() == 0:
        if libc.unshare(flags) != 0:
            return iso, f"unshare as root: {os.strerror(ctypes.get_errno())}"
        iso["identity"], iso["uid"] = "dedicated_uid", job["isolation"]["uid_base"] + os.getpid()
    else:
        uid, gid = os.geteuid(), os.getegid()
        if libc.unshare(flags | CLONE_NEWUSER) != 0:
            return iso, f"unshare with a user namespace: {os.strerror(ctypes.get_errno())}"
        write_file("/proc/self/setgroups", "deny")
        write_file("/proc/self/uid_map", f"0 {uid} 1")
        write_file("/proc/self/gid_map", f"0 {gid} 1")
        iso["identity"], iso["uid"] = "userns_root", uid
    iso.update(mount=True, net=True, pid=True, ipc=True, uts=True)
    return iso, None


def harness_main():
    job = json.loads(sys.stdin.buffer.read())
    limits = job["limits"]
    iso, why_not = isolate(job)
    if why_not is not None:
        if job["isolation"].get("require", True):
            emit({"event": "result", "unavailable": why_not, "isolation": iso})
            return 0
        iso["fallback_reason"] = why_not
        if os.geteuid() == 0:  # never run a candidate as root
            iso["identity"], iso["uid"] = "dedicated_uid", job["isolation"]["uid_base"] + os.getpid()
    pipes = {name: os.pipe() for name in ("records", "stdout", "stderr", "control")}
    started = time.monotonic()
    b_pid = os.fork()
    if b_pid == 0:
        code = 70
        try:
            code = reaper_main(job, iso, pipes)
        except BaseException as err:  # noqa: BLE001 - reported to H on the control pipe
            _control(pipes, {"setup_error": f"{type(err).__name__}: {err}"})
        os._exit(code)
    for _, w in pipes.values():
        os.close(w)
    emit({"event": "started", "pid": b_pid})
    report = collect(job, iso, pipes, b_pid, started, limits)
    emit(report)
    return 0


def collect(job, iso, pipes, b_pid, started, limits):
    """Read C's records, output and B's control messages until B exits or the wall clock runs out."""
    deadline = started + limits["wall_s"]
    caps = {
        "records": MAX_RECORDS,
        "stdout": limits["output_bytes"],
        "stderr": limits["output_bytes"],
        "control": 1 << 16,
    }
    bufs = {name: bytearray() for name in pipes}
    truncated = {name: False for name in pipes}
    fd_name = {pipes[name][0]: name for name in pipes}
    open_fds = set(fd_name)
    pidfd = os.pidfd_open(b_pid)
    b_status, timed_out, drain_until = None, False, None
    while open_fds or b_status is None:
        now = time.monotonic()
        if b_status is None and now >= deadline:
            timed_out = True
            kill_sandbox(iso, b_pid, bufs["control"])
            b_status = wait_status(b_pid)
            drain_until = time.monotonic() + 0.5
        if drain_until is not None and now >= drain_until:
            break
        wait_for = [pidfd] if b_status is None else []
        limit = (deadline if drain_until is None else drain_until) - now
        ready, _, _ = select.select(list(open_fds) + wait_for, [], [], max(limit, 0))
        for fd in ready:
            if fd == pidfd:
                b_status = wait_status(b_pid)
                drain_until = time.monotonic() + 0.5  # grandchildren die with B's namespace
                continue
            data = os.read(fd, 65536)
            name = fd_name[fd]
            if not data:
                open_fds.discard(fd)
                continue
            room = caps[name] - len(bufs[name])
            if len(data) > room:
                truncated[name] = True
            bufs[name] += data[: max(room, 0)]
            if name == "records" and truncated[name] and b_status is None:
                kill_sandbox(iso, b_pid, bufs["control"])  # a flood of records is the candidate's doing
    os.close(pidfd)
    if b_status is None:
        kill_sandbox(iso, b_pid, bufs["control"])
        b_status = wait_status(b_pid)
    sweep_uid(iso)
    control = [json.loads(line) for line in bufs["control"].decode(errors="replace").splitlines() if line.strip()]
    text = lambda name: bufs[name].decode(errors="replace")  # noqa: E731
    return {
        "event": "result",
        "isolation": iso,
        "timed_out": timed_out,
        "wall_s": time.monotonic() - started,
        "reaper_status": b_status,
        "control": control,
        "records": text("records"),
        "records_truncated": truncated["records"],
        "stdout": text("stdout"),
        "stderr": text("stderr"),
        "output_truncated": truncated["stdout"] or truncated["stderr"],
    }


def wait_status(pid):
    _, status, _ = os.wait4(pid, 0)
    return os.waitstatus_to_exitcode(status)


def kill_sandbox(iso, b_pid, control):
    """SIGKILL B (PID 1: the kernel then kills its whole namespace) and, without a PID namespace, C's group."""
    try:
        os.kill(b_pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if not iso["pid"]:
        for line in control.decode(errors="replace").splitlines():
            try:
                c_pid = json.loads(line).get("c_pid")
            except ValueError:
                continue
            if c_pid:
                for kill in (os.killpg, os.kill):
                    try:
                        kill(c_pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
        sweep_uid(iso)


def sweep_uid(iso):
    """As root with a dedicated uid and no PID namespace: kill every process of that uid (kill(-1) as
    that uid). With a PID namespace the kernel already did, and H cannot fork into the dead one."""
    if iso["identity"] != "dedicated_uid" or iso["pid"] or os.geteuid() != 0:
        return
    pid = os.fork()
    if pid == 0:
        try:
            os.setresuid(iso["uid"], iso["uid"], iso["uid"])
            os.kill(-1, signal.SIGKILL)
        except BaseException:  # noqa: BLE001 - nothing of that uid left to kill
            pass
        os._exit(0)
    os.waitpid(pid, 0)


# ---------------------------------------------------------------------------------------- B


def _control(pipes, obj):
    write_all(pipes["control"][1], (json.dumps(obj) + "\n").encode())


def reaper_main(job, iso, pipes):
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as PID 1 it ignores every signal it has no handler for
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # H gone (killed by the trainer) -> B gone -> namespace gone
    for name in ("records", "stdout", "stderr", "control"):
        os.close(pipes[name][0])
    workdir = os.getcwd()
    if iso["mount"]:
        workdir = build_root(job, iso)
    elif iso["identity"] == "dedicated_uid":
        os.chown(workdir, iso["uid"], iso["uid"])
        os.chmod(workdir, 0o700)
    c_pid = os.fork()
    if c_pid == 0:
        try:
            candidate_main(job, iso, pipes, workdir)
        except BaseException as err:  # noqa: BLE001 - setup of C failed before the candidate ran
            try:
                os.write(RECORD_FD, (json.dumps({"setup_error": f"{type(err).__name__}: {err}"}) + "\n").encode())
            except OSError:
                pass
        os._exit(71)
    _control(pipes, {"c_pid": c_pid})
    _, status, usage = os.wait4(c_pid, 0)
    _control(
        pipes,
        {
            "c_status": os.waitstatus_to_exitcode(status),
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "maxrss_kb": usage.ru_maxrss,
        },
    )
    return 0


def build_root(job, iso):
    """A private root: the interpreter and system libraries read-only, a small tmpfs as the only
    writable place, nothing else of the host (no /proc, /sys, /home, /etc, trainer files)."""
    root = os.getcwd()
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=512,mode=755")
    ro_dirs = ["/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin"]
    prefixes = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix, sys.prefix)}
    for path in ro_dirs + sorted(prefixes):
        if os.path.islink(path):
            os.makedirs(os.path.dirname(root + path), exist_ok=True)
            if not os.path.lexists(root + path):
                os.symlink(os.readlink(path), root + path)
        elif os.path.isdir(path) and not _covered(path, ro_dirs, root):
            os.makedirs(root + path, exist_ok=True)
            mount(path, root + path, None, MS_BIND | MS_REC)
            keep = os.statvfs(root + path).f_flag & ST_KEEP
            mount(None, root + path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | keep)
    for path in ("/etc/ld.so.cache", "/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"):
        if os.path.exists(path):
            os.makedirs(os.path.dirname(root + path), exist_ok=True)
            os.close(os.open(root + path, os.O_CREAT | os.O_WRONLY, 0o644))
            mount(path, root + path, None, MS_BIND)
    os.mkdir(root + "/sandbox")
    lim = job["limits"]
    owner = 0 if iso["identity"] == "userns_root" else iso["uid"]
    mount(
        "tmpfs",
        root + "/sandbox",
        "tmpfs",
        MS_NOSUID | MS_NODEV,
        f"size={lim['tmpfs_mb']}m,nr_inodes={lim['tmpfs_inodes']},mode=700,uid={owner},gid={owner}",
    )
    os.symlink("sandbox", root + "/tmp")
    os.chdir(root)
    number = SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is not None and libc.syscall(number, b".", b".") == 0:
        _check(libc.umount2(b".", MNT_DETACH), "umount the old root")
        os.chdir("/")
    else:
        os.chroot(root)  # C has no CAP_SYS_CHROOT, so it cannot climb out
        os.chdir("/")
    mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    try:
        os.sethostname("sandbox")
    except (AttributeError, OSError):
        pass
    return "/sandbox"


def _covered(path, dirs, root):
    return any(path != d and path.startswith(d + "/") and os.path.exists(root + d) for d in dirs)


# ---------------------------------------------------------------------------------------- C

PRELOAD = (
    "math",
    "cmath",
    "re",
    "time",
    "threading",
    "json",
    "io",
    "collections",
    "itertools",
    "functools",
    "heapq",
    "bisect",
    "string",
    "operator",
    "copy",
    "fractions",
    "decimal",
    "statistics",
    "random",
    "typing",
    "dataclasses",
    "datetime",
    "enum",
    "array",
    "struct",
    "textwrap",
    "unicodedata",
)


def candidate_main(job, iso, pipes, workdir):
    os.setsid()  # its own session and process group: kill(0, ...) reaches only the candidate's processes
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(pipes["stdout"][1], 1)
    os.dup2(pipes["stderr"][1], 2)
    os.dup2(pipes["records"][1], RECORD_FD)
    os.closerange(RECORD_FD + 1, 1 << 16)
    os.chdir(workdir)
    if not iso["mount"]:
        for name in PRELOAD:  # the interpreter's files may not be readable once the uid drops
            try:
                __import__(name)
            except ImportError:
                pass
    if iso["identity"] == "dedicated_uid":
        drop_bounding_set(securebits=False)
        os.setgroups([])
        os.setresgid(iso["uid"], iso["uid"], iso["uid"])
        os.setresuid(iso["uid"], iso["uid"], iso["uid"])  # leaving uid 0 clears every capability
        clear_capabilities()
    elif iso["identity"] == "userns_root":
        os.setresgid(0, 0, 0)
        os.setresuid(0, 0, 0)
        drop_bounding_set(securebits=True)
        clear_capabilities()
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    effective, permitted = capabilities()
    if iso["identity"] != "caller" and (effective or permitted):
        raise RuntimeError(f"capabilities left after the drop: {effective:#x}/{permitted:#x}")
    lim = job["limits"]
    for res, value in (
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NOFILE, lim["open_files"]),
        (resource.RLIMIT_NPROC, lim["processes"]),
        (resource.RLIMIT_FSIZE, lim["file_bytes"]),
        (resource.RLIMIT_CPU, lim["cpu_s"]),
        (resource.RLIMIT_AS, lim["memory_bytes"]),
    ):
        resource.setrlimit(res, (value, value))
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    write_record({"ready": True, "uid": os.getuid(), "caps": effective, "cwd": os.getcwd()})
    if iso["audit_hook"]:
        install_audit_hook(workdir, filter_paths=not iso["mount"])
    solution, steps, nonce = job["solution"], job["steps"], job["nonce"]
    del job
    sys.modules["__main__"] = type(sys)("__main__")  # the harness module is not reachable by name
    run_steps(solution, steps, nonce)


def write_record(obj, _write=write_all, _dumps=json.dumps):
    _write(RECORD_FD, (_dumps(obj) + "\n").encode())


BLOCKED_EVENT_PREFIXES = (
    "socket.",
    "ctypes.",
    "subprocess.",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.system",
    "os.kill",
    "os.killpg",
    "os.forkpty",
    "pty.",
    "signal.pthread_kill",
    "gc.get_objects",
    "gc.get_referrers",
    "gc.get_referents",
    "sys._getframe",
    "sys._current_frames",
    "sys.settrace",
    "sys.setprofile",
    "sys.addaudithook",
    "cpython.run_",
    "webbrowser.",
    "urllib.",
    "ftplib.",
    "smtplib.",
    "http.",
    "os.setuid",
)
BLOCKED_MODULES = frozenset(
    {
        "ctypes",
        "_ctypes",
        "_posixsubprocess",
        "socket",
        "_socket",
        "ssl",
        "_ssl",
        "_xxsubinterpreters",
        "_xxinterpchannels",
        "_testcapi",
        "_testinternalcapi",
        "subprocess",
        "multiprocessing",
        "asyncio",
        "select",
        "selectors",
        "mmap",
        "pty",
    }
)
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def install_audit_hook(workdir, filter_paths):
    """Refuse network, process spawning, signals, ctypes and introspection of the harness; without
    a mount namespace also any file outside the work directory (reads of the stdlib excepted)."""
    for name in list(sys.modules):
        if name.split(".")[0] in BLOCKED_MODULES:
            del sys.modules[name]
    readable = tuple(
        sorted({os.path.realpath(p) + os.sep for p in sys.path if p} | {os.path.realpath(workdir) + os.sep})
    ) + ("/dev/null", "/dev/urandom")
    writable = (os.path.realpath(workdir) + os.sep,)
    realpath, fspath, startswith = os.path.realpath, os.fsdecode, str.startswith

    def allowed(path, write):
        if isinstance(path, int) or path is None:
            return True
        full = realpath(fspath(path))
        return startswith(full + os.sep, writable) or (
            not write and (startswith(full + os.sep, readable) or full in readable)
        )

    def hook(event, args):
        if event == "import":
            if args[0].partition(".")[0] in BLOCKED_MODULES:
                raise PermissionError(f"sandbox: import {args[0]} is not allowed")
            return
        if event.startswith(BLOCKED_EVENT_PREFIXES):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if not filter_paths:
            return
        if event == "open":
            path, mode, flags = args
            write = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool((flags or 0) & WRITE_FLAGS)
            if not allowed(path, write):
                raise PermissionError(f"sandbox: open {path!r} is outside the sandbox")
        elif event in ("os.listdir", "os.scandir", "os.chdir"):
            if not allowed(args[0], False):
                raise PermissionError(f"sandbox: {event} {args[0]!r} is outside the sandbox")
        elif event in (
            "os.mkdir",
            "os.remove",
            "os.rmdir",
            "os.rename",
            "os.symlink",
            "os.link",
            "os.truncate",
            "os.chmod",
            "os.chown",
            "os.utime",
            "os.chflags",
            "os.setxattr",
            "os.removexattr",
        ):
            for path in args[:2] if event in ("os.rename", "os.symlink", "os.link") else args[:1]:
                if isinstance(path, (str, bytes, os.PathLike)) and not allowed(path, True):
                    raise PermissionError(f"sandbox: {event} {path!r} is outside the sandbox")

    sys.addaudithook(hook)


def run_steps(
    solution,
    steps,
    nonce,
    _exec=exec,
    _eval=eval,
    _compile=compile,
    _getpid=os.getpid,
    _exit=os._exit,
    _encode=None,
    _write=write_record,
    _base=BaseException,
):
    """Run the solution, then each step, in one namespace; one record per step on fd 3.

    Everything the loop calls is bound here, so a candidate that replaces builtins (exec, eval,
    type, ...) or the harness module's globals does not change what the loop does."""
    _encode = _encode or encode
    me = _getpid()
    ns = {"__name__": "__main__", "__builtins__": __builtins__}

    def report(obj):
        if _getpid() != me:  # a fork of the candidate came back into the harness loop: leave quietly
            _exit(0)
        obj["nonce"] = nonce
        _write(obj)

    try:
        _exec(_compile(solution, "<solution>", "exec"), ns)
    except _base as err:  # SystemExit included: leaving early is a failure
        report({"step": "solution", "ok": False, **describe(err)})
        _exit(0)
    report({"step": "solution", "ok": True})
    for i, step in enumerate(steps):
        try:
            if step["kind"] == "exec":
                _exec(_compile(step["src"], f"<test {i}>", "exec"), ns)
                record = {"step": i, "ok": True}
            elif step["kind"] == "value":
                record = {
                    "step": i,
                    "ok": True,
                    "value": _encode(_eval(_compile(step["src"], f"<test {i}>", "eval"), ns)),
                }
            else:
                left = _encode(_eval(_compile(step["left"], f"<test {i}>", "eval"), ns))
                right = _encode(_eval(_compile(step["right"], f"<test {i}>", "eval"), ns))
                record = {"step": i, "ok": True, "value": left, "other": right}
        except _base as err:
            record = {"step": i, "ok": False, **describe(err)}
        report(record)
    report({"done": True})
    _exit(0)


def describe(err):
    out = {"error": type(err).__name__, "message": str(err)[:500]}
    limit = LIMIT_ERRNOS.get(getattr(err, "errno", None))
    if isinstance(err, MemoryError):
        limit = "memory"
    if limit:
        out["limit"] = limit
    return out


LIMIT_ERRNOS = {
    errno.EFBIG: "file_size",
    errno.ENOSPC: "disk",
    errno.EDQUOT: "disk",
    errno.EMFILE: "open_files",
    errno.EAGAIN: "processes",
}


class Unencodable(TypeError):
    pass


def encode(
    value,
    _depth=0,
    _budget=None,
    type=type,
    len=len,
    hex=hex,
    list=list,
    tuple=tuple,
    set=set,
    frozenset=frozenset,
    dict=dict,
    int=int,
    float=float,
    complex=complex,
    str=str,
    bytes=bytes,
    bool=bool,
):
    """A plain-data image of a value, with exact types only: a subclass of int, an object with its own
    __eq__, anything that is not built-in data is refused (so it cannot pretend to equal anything)."""
    budget = _budget if _budget is not None else [MAX_VALUE_CHARS]
    if _depth > 50:
        raise Unencodable("value nested deeper than 50")
    budget[0] -= 1
    if budget[0] < 0:
        raise Unencodable("value too large")
    t = type(value)
    if value is None:
        return ["none"]
    if t is bool:
        return ["bool", value]
    if t is int:
        return ["int", hex(value)]
    if t is float:
        return ["float", value.hex()]
    if t is complex:
        return ["complex", value.real.hex(), value.imag.hex()]
    if t is str:
        budget[0] -= len(value)
        return ["str", value]
    if t is bytes:
        budget[0] -= len(value)
        return ["bytes", value.hex()]
    if t is list or t is tuple or t is set or t is frozenset:
        name = "list" if t is list else "tuple" if t is tuple else "set" if t is set else "frozenset"
        return [name, [encode(v, _depth + 1, budget) for v in value]]
    if t is dict:
        return ["dict", [[encode(k, _depth + 1, budget), encode(v, _depth + 1, budget)] for k, v in dict.items(value)]]
    raise Unencodable(
        f"a {t.__module__}.{t.__qualname__} is not plain data (None, bool, int, float, complex, "
        "str, bytes, list, tuple, set, frozenset, dict)"
    )


if __name__ == "__main__":
    sys.exit(harness_main())
