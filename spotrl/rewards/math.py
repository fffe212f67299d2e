"""Math answers: extraction and equivalence by `math_verify` (what TRL and open-r1 report against).

    extract_answer("... so the total is \\boxed{\\frac{3}{4}}.")  -> "\\frac{3}{4}"
    equivalent("\\frac{3}{4}", "0.75")                            -> True
    math_reward(completion, stopped, reference)                  -> 1.0 or 0.0

What is read and compared is math_verify's (see `spotrl.rewards.math_judge`): the last \\boxed{}
first, then "final answer is" / "answer:", LaTeX in $...$, the last number; values compared
symbolically and numerically by sympy (fractions, roots, pi, percent, intervals, sets, tuples,
matrices, equations), text as text. A reference is the answer itself, or the answer a solution
states (\\boxed{...}, or a GSM8K "#### x" line).

Where it runs: in a pool of judge processes (`python -m spotrl.rewards.math_judge`), one per
thread that verifies at the same time, each kept for the next call. sympy can work without end on
some answers, math_verify's own time limit is a SIGALRM that only a main thread can take, and
the trainer verifies from Prefect's worker threads; a judge process is a main thread. A call
that runs past `TIME_LIMIT_S` is a wrong answer (0.0, as math_verify and the code sandbox score a
timeout); one whose judge does not answer even `GRACE_S` later is killed and also scores 0.0.
A judge that cannot start, dies twice on the same call, or reports a bug of its own raises
`MathJudgeError`: an error of the reward stage, never a 0.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import sys
import threading
import time
from pathlib import Path

from spotrl.rewards.line_worker import Died, LineWorker, Silent

log = logging.getLogger("spotrl.rewards.math")

TIME_LIMIT_S = 5.0  # per call (extraction + parse + compare); math_verify's own default
GRACE_S = 5.0  # on top of the limit, before a silent judge is killed (stuck in C code, or stopped)
START_TIMEOUT_S = 120.0  # importing sympy on two busy cores
MAX_ANSWER_CHARS = 400  # an extracted answer longer than this is not an answer


class MathJudgeError(RuntimeError):
    """The judge process itself failed (not the answer): never a reward of 0."""


class _Judge(LineWorker):
    """One judge process."""

    def __init__(self, time_limit_s: float):
        root = str(Path(__file__).resolve().parents[2])  # the judge imports this same spotrl
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
        super().__init__([sys.executable, "-m", "spotrl.rewards.math_judge", repr(time_limit_s)], env=env)
        try:
            ready = self.receive(time.monotonic() + START_TIMEOUT_S)
        except (Silent, Died) as e:
            self.kill()
            raise MathJudgeError(f"the math judge did not start ({type(e).__name__}, exit {self.proc.poll()})") from e
        if ready.get("status") != "ready":
            self.kill()
            raise MathJudgeError(f"the math judge did not start: {ready}")

    def request(self, op: str, args: list, deadline: float) -> dict:
        self.send({"op": op, "args": args})
        return self.receive(deadline)


class MathJudges:
    """A pool of judge processes, safe to call from any thread; grows to the number of concurrent callers."""

    def __init__(self, time_limit_s: float = TIME_LIMIT_S, grace_s: float = GRACE_S):
        self.time_limit_s, self.grace_s = time_limit_s, grace_s
        self._idle: list[_Judge] = []
        self._lock = threading.Lock()
        self.timeouts = 0  # calls scored as timeouts (judge's limit or killed)

    def call(self, op: str, *args):
        """The judge's result for `op`, or None when the call ran past the time limit or a memory limit."""
        for attempt in (1, 2):
            judge = self._acquire()
            try:
                reply = judge.request(op, list(args), time.monotonic() + self.time_limit_s + self.grace_s)
            except Silent:
                judge.kill()
                self.timeouts += 1
                log.warning("math judge silent %.1f s after its limit: killed, scored as a timeout", self.grace_s)
                return None
            except Died as e:
                judge.kill()
                if attempt == 2:
                    raise MathJudgeError(f"the math judge died twice on one {op} call ({e})") from e
                continue
            self._release(judge)
            if reply["status"] == "ok":
                return reply["result"]
            if reply["status"] in ("timeout", "limit"):
                self.timeouts += reply["status"] == "timeout"
                return None
            raise MathJudgeError(f"math judge: {reply.get('detail', reply)}")

    def _acquire(self) -> _Judge:
        with self._lock:
            if self._idle:
                return self._idle.pop()  # the one used last: its reference cache is warm
        return _Judge(self.time_limit_s)

    def _release(self, judge: _Judge) -> None:
        with self._lock:
            self._idle.append(judge)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for judge in idle:
            judge.close()


_default: MathJudges | None = None
_default_pid = 0
_default_lock = threading.Lock()


def default_judges() -> MathJudges:
    """The process-wide pool (a fresh one in a forked child: pipes are not shared across processes)."""
    global _default, _default_pid
    with _default_lock:
        if _default is None or _default_pid != os.getpid():
            _default, _default_pid = MathJudges(), os.getpid()
            atexit.register(_default.close)
        return _default


# ----------------------------------------------------------------------------------- the answers


def _braced(text: str, start: int) -> str | None:
    """The content of the brace group opening at text[start] == '{'."""
    depth = 0
    for i in range(start, len(text)):
        depth += (text[i] == "{") - (text[i] == "}")
        if depth == 0:
            return text[start + 1 : i]
    return None


def reference_answer(reference: str) -> str:
    """The answer a reference holds: itself, or what a solution states (the last \\boxed{}, or "#### x")."""
    boxes = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*(?=\{)", reference)]
    if boxes and (content := _braced(reference, boxes[-1])) is not None:
        return content.strip()
    hashes = re.findall(r"####\s*([^\n]+)", reference)
    return hashes[-1].strip() if hashes else reference


def extract_answer(text: str, judges: MathJudges | None = None) -> str | None:
    """The final answer math_verify reads in a completion, as text, or None if there is none."""
    return (judges or default_judges()).call("extract", text) if text.strip() else None


def equivalent(answer: str | None, reference: str | None, judges: MathJudges | None = None) -> bool:
    """Whether two answers (not whole completions) mean the same value."""
    if not answer or not reference or not answer.strip() or not reference.strip():
        return False
    if len(answer) > MAX_ANSWER_CHARS or len(reference) > MAX_ANSWER_CHARS:
        return False
    return bool((judges or default_judges()).call("equivalent", answer, reference))


def math_reward(completion: str, stopped: bool, reference: str, judges: MathJudges | None = None) -> float:
    """1.0 when the completion ended by itself and its final answer is equivalent to the reference."""
    if not stopped or not completion.strip():
        return 0.0
    return float((judges or default_judges()).call("reward", completion, reference_answer(reference)) or 0.0)
