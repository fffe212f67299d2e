"""A helper process spoken to in JSON lines: one request a line on its stdin, one reply a line on
its stdout. The math judge (rewards/math.py) and the reasoning-gym scorer (rewards/rgym.py) run
model-written answers through such processes; each decides what a silent or dead one means."""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import time


class Silent(Exception):
    """No reply line before the deadline."""


class Died(Exception):
    """The process's pipe closed: it exited or was killed."""


class LineWorker:
    def __init__(self, argv: list[str], **popen_options):
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, **popen_options)
        self._buffer = b""

    def send(self, message: dict) -> None:
        try:
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.flush()
        except OSError as err:  # BrokenPipeError among them
            raise Died(str(err)) from err

    def receive(self, deadline: float) -> dict:
        """The next reply line (`deadline` on time.monotonic's clock)."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise Silent
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise Died(f"exit {self.proc.poll()}")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def kill(self) -> int:
        """Kill it (if still running), reap it, close its pipes; its exit code."""
        if self.proc.poll() is None:
            self.proc.kill()
        code = self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):  # a request still in stdin's buffer has nowhere to go
                pipe.close()
        return code

    def close(self, timeout_s: float = 5.0) -> None:
        """End it as its input ends (it exits at the end of stdin); killed if it does not."""
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()
