"""reasoning-gym's scoring functions as a verifier: the row's reference names the dataset and holds
the entry its `score_answer` reads; the answer is scored in a separate process with a time limit.

    reference = {"dataset": "countdown", "options": {...}, "entry": {"question": ..., "metadata": ...}}
    rgym_reward(completion, stopped, json.dumps(reference))   # 1.0 or 0.0

The answer is the content of the completion's last <answer>...</answer> (reasoning-gym's own
convention), else the whole completion, stripped. The reward is 1.0 when score_answer gives its full
score (1.0) and 0.0 otherwise: reasoning-gym's partial scores (countdown: 0.05 for a wrong value,
0.01 for anything else) would make held-out pass@k count fractions of a success.

Why a process: score_answer is library code run on model-written text, and several datasets parse
it with sympy (`parse_expr`, which evaluates it with Python's eval): an answer like 9**9**9 never
ends, and a crash must not take the trainer with it. `Scorer` keeps warm worker processes
(spotrl/rewards/rgym_worker.py, one per concurrent caller), each answer has `TIME_LIMIT_S`, and a
timeout, a dead worker or an exception of score_answer raises `ScorerError`: the reward stage
fails (Prefect retries it) and nothing is scored 0 for it. Answers to datasets whose scorer
evaluates an arithmetic expression must be one (`EXPRESSION_DATASETS`): anything else, and any
`**`, scores 0 without reaching the scorer. The worker has an address-space limit; it is not a
security sandbox (spotrl/rewards/sandbox/ is, for code): with a real checkpoint on datasets whose
scorers evaluate other text, that text runs in the worker.
"""

from __future__ import annotations

import atexit
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from spotrl.rewards.line_worker import Died, LineWorker, Silent

WORKER = Path(__file__).with_name("rgym_worker.py")
TIME_LIMIT_S = 10.0  # per answer: reasoning-gym's scorers take milliseconds
START_LIMIT_S = 120.0  # importing reasoning-gym (sympy, ...) on a busy machine
MEMORY_MB = 2048
FULL_SCORE = 1.0

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# datasets whose score_answer evaluates the answer as an expression (sympy parse_expr): only digits,
# + - * / ( ) and spaces reach it, and never ** (a power tower never finishes)
EXPRESSION_DATASETS = ("countdown", "puzzle24")
_EXPRESSION = re.compile(r"[0-9+\-*/() ]{1,200}")


class ScorerError(RuntimeError):
    """The scorer failed (timed out, crashed, raised): an error of the reward stage, never a reward of 0."""


def extract_answer(completion: str) -> str:
    tagged = _ANSWER_TAG.findall(completion)
    return (tagged[-1] if tagged else completion).strip()


def admissible(dataset: str, answer: str) -> bool:
    """Whether the answer may be given to the dataset's scorer (see EXPRESSION_DATASETS)."""
    if dataset in EXPRESSION_DATASETS:
        return bool(_EXPRESSION.fullmatch(answer)) and "**" not in answer
    return True


class _Worker(LineWorker):
    def __init__(self, python: str, time_limit_s: float, memory_mb: int):
        self.time_limit_s = time_limit_s
        super().__init__(
            [python, "-I", str(WORKER), str(memory_mb << 20)],
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C of the trainer's terminal is the trainer's to handle
            close_fds=True,
        )
        if self._reply(START_LIMIT_S, "start") != {"ready": True}:
            self.kill()
            raise ScorerError("the reasoning-gym scorer process did not start")

    def score(self, request: dict) -> float:
        try:
            self.send(request)
        except Died as err:
            self.kill()
            raise ScorerError(f"the reasoning-gym scorer process is gone ({err})") from None
        reply = self._reply(self.time_limit_s, f"score an answer to {request['dataset']!r}")
        if "error" in reply:
            raise ScorerError(f"reasoning-gym {request['dataset']!r} score_answer raised {reply['error']}")
        return float(reply["score"])

    def _reply(self, limit_s: float, what: str) -> dict:
        try:
            return self.receive(time.monotonic() + limit_s)
        except Silent:
            self.kill()
            raise ScorerError(f"the reasoning-gym scorer did not {what} within {limit_s:g} s") from None
        except Died:
            code = self.kill()
            raise ScorerError(f"the reasoning-gym scorer process died (exit {code}) trying to {what}") from None


class Scorer:
    """Warm scorer processes, one per caller at a time (score() is called from verifier threads)."""

    def __init__(self, time_limit_s: float = TIME_LIMIT_S, memory_mb: int = MEMORY_MB, python: str | None = None):
        self.time_limit_s, self.memory_mb = time_limit_s, memory_mb
        self.python = python or sys.executable
        self._idle: list[_Worker] = []
        self._all: list[_Worker] = []
        self._lock = threading.Lock()

    def score(self, dataset: str, options: dict, entry: dict, answer: str) -> float:
        """score_answer(answer, entry) of `dataset` built with `options` (ScorerError if it fails)."""
        with self._lock:
            worker = self._idle.pop() if self._idle else None
        if worker is None:
            worker = _Worker(self.python, self.time_limit_s, self.memory_mb)
            with self._lock:
                self._all.append(worker)
        score = worker.score({"dataset": dataset, "options": options, "entry": entry, "answer": answer})
        with self._lock:  # only a worker that answered goes back (one that failed was killed)
            self._idle.append(worker)
        return score

    def close(self) -> None:
        with self._lock:
            workers, self._all, self._idle = self._all, [], []
        for worker in workers:
            worker.kill()


_DEFAULT: Scorer | None = None
_DEFAULT_LOCK = threading.Lock()


def default_scorer() -> Scorer:
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = Scorer()
            atexit.register(_DEFAULT.close)
        return _DEFAULT


def rgym_reward(completion: str, stopped: bool, reference: str, scorer: Scorer | None = None) -> float:
    """1.0 when the completion ended by itself and the dataset's score_answer gives its answer full
    marks; a failure of the scorer raises ScorerError (never 0)."""
    if not stopped:
        return 0.0
    ref = json.loads(reference)
    answer = extract_answer(completion)
    if not answer or not admissible(ref["dataset"], answer):
        return 0.0
    score = (scorer or default_scorer()).score(ref["dataset"], ref.get("options", {}), ref["entry"], answer)
    return float(score >= FULL_SCORE)
