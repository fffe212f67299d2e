"""Math answers judged by `math_verify` (the verifier TRL and open-r1 use), in a judge process.

`spotrl.rewards.math` starts this module as `python -m spotrl.rewards.math_judge` and sends it one
JSON request a line; it answers one JSON line each: {"status": "ok", "result": ...}, "timeout"
(the call ran past the time limit), "limit" (out of memory or recursion) or "error" (a bug here:
the caller raises). It runs in its own process because sympy can work without end on some
answers (\\boxed{10^{10^{10}}} against 1 ran > 290 s here without finishing) and math_verify's own
time limit is a SIGALRM, which only the main thread of a process can take: here the judge is the
main thread, whatever thread of the trainer asks (Prefect runs tasks in threads). This module
keeps math_verify's own alarms off and arms one of its own around each whole call.

Extraction (math_verify's, with its defaults except that \\boxed{} comes first as it did here): the
last \\boxed{} (boxes next to each other joined by "and" / "or" / "," count as one set, so a
hedge "\\boxed{5} or \\boxed{6}" is the set {5, 6}, equal to neither), then "final answer is" /
"answer:" forms, then LaTeX in $...$, then the last number or plain expression. A reference is
parsed as \\boxed{reference}, once per judge process (cached).
"""

from __future__ import annotations

import functools
import json
import logging
import re
import resource
import signal
import sys

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

EXTRACTION = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())
MEMORY_BYTES = 4 << 30  # address space of a judge process (sympy on a huge power raises MemoryError)
TIMER_REPEAT_S = 0.05  # the alarm repeats until disarmed: a library's broad `except` cannot swallow it for good

# Plain-text spellings math_verify reads otherwise: \fbox (a box its extraction does not anchor on),
# "pi" (p*i), 1e3 (1*e*3), and a full stop after an answer ("is 30/11." is read as 30/11.0, an
# unevaluated float quotient its comparison finds unequal to 30/11; measured in
# benchmarks/math_verify_agreement.py).
_REWRITES = (
    (re.compile(r"(?<=\d)\.(?=\s|$)"), ""),
    (re.compile(r"\\fbox\b"), r"\\boxed"),
    (re.compile(r"(?<![\\A-Za-z])pi(?![A-Za-z])"), r"\\pi "),
    (re.compile(r"(?<![\w.\\])(\d+(?:\.\d+)?)[eE]([+-]?\d+)(?![\w.])"), r"\1\\times 10^{\2}"),
)


def _plain_to_latex(text: str) -> str:
    for pattern, replacement in _REWRITES:
        text = pattern.sub(replacement, text)
    return text


def _parse(text: str) -> list:
    """math_verify's parse with its own SIGALRM off: this process's time limit covers the whole call."""
    return parse(_plain_to_latex(text), EXTRACTION, parsing_timeout=None)


@functools.lru_cache(maxsize=4096)
def _gold(reference: str) -> tuple:
    """The parsed reference answer, once per judge process (a group of G completions shares it)."""
    return tuple(_parse("\\boxed{" + reference + "}"))


def _same(gold: tuple, predicted: list) -> bool:
    return bool(gold) and bool(predicted) and verify(list(gold), predicted, timeout_seconds=None)


def extract(text: str) -> str | None:
    """The final answer math_verify extracts from `text`, as the (normalised) text it read, or None."""
    found = _parse(text)
    return next((item for item in reversed(found) if isinstance(item, str)), str(found[0]) if found else None)


def equivalent(answer: str, reference: str) -> bool:
    """Whether two answers (not whole completions) are the same value: both are read as \\boxed{...}."""
    return _same(_gold(reference), _parse("\\boxed{" + answer + "}"))


def reward(completion: str, reference: str) -> float:
    """1.0 when the final answer of `completion` is equivalent to the reference answer."""
    return float(_same(_gold(reference), _parse(completion)))


OPS = {"extract": extract, "equivalent": equivalent, "reward": reward}


class _Timeout(BaseException):
    """Raised by the alarm; a BaseException, so math_verify's and sympy's `except Exception` let it through."""


_armed = False


def _on_alarm(signum, frame):
    if _armed:
        raise _Timeout


def _disarm() -> None:
    global _armed
    while True:  # an alarm landing between the two statements raises once more: disarm again
        try:
            _armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            return
        except _Timeout:
            continue


def judge(request: dict, time_limit_s: float) -> dict:
    """One request, {"op": name in OPS, "args": [...]}, within `time_limit_s` seconds."""
    global _armed
    try:
        try:
            _armed = True
            signal.setitimer(signal.ITIMER_REAL, time_limit_s, TIMER_REPEAT_S)
            result = OPS[request["op"]](*request["args"])
        finally:
            _disarm()
    except _Timeout:
        _disarm()
        return {"status": "timeout"}
    except (MemoryError, RecursionError) as e:
        return {"status": "limit", "detail": type(e).__name__}
    except Exception as e:  # a bug here, not an answer: the caller raises it
        return {"status": "error", "detail": f"{type(e).__name__}: {e}"}
    return {"status": "ok", "result": result}


def serve(time_limit_s: float, stdin=sys.stdin, stdout=sys.stdout) -> None:
    """Answer requests until stdin closes (the trainer ended or closed the pool)."""
    signal.signal(signal.SIGALRM, _on_alarm)
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns once that its own alarm is off
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard == resource.RLIM_INFINITY or hard > MEMORY_BYTES:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, hard))
    # math_verify's first call builds its parsers (~0.1 s idle, seconds on busy cores): done here,
    # before "ready", so it never counts against an answer's time limit
    reward("\\boxed{1}", "1")
    stdout.write(json.dumps({"status": "ready"}) + "\n")
    stdout.flush()
    for line in stdin:
        stdout.write(json.dumps(judge(json.loads(line), time_limit_s)) + "\n")
        stdout.flush()


if __name__ == "__main__":
    serve(float(sys.argv[1]))
