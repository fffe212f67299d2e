"""MBPP-style tests (Python assert statements) split into steps the sandbox runs, and the judge.

`assert EXPR == LITERAL` (or `LITERAL == EXPR`) becomes a *value* step: the sandbox evaluates
EXPR and sends back a plain-data image of the result; the expected literal never enters the
sandbox and the comparison happens here, in the trainer's process, on plain built-in values. A
candidate cannot pass such a test without computing the value: not by exiting early, not with an
object whose __eq__ always says yes, not by patching the harness.

`assert A == B` with no literal side becomes a *pair* step (both sides sent back as plain data and
compared here: no __eq__ tricks, but both values come from the candidate's process). Every other
statement (imports, helper definitions, `assert pred(x)`, loops) is an *exec* step: it runs in
the candidate's process, so its success is only as trustworthy as that process (see
`spotrl.rewards.sandbox.runner` for what the sandbox does against a candidate that attacks the harness).
"""

from __future__ import annotations

import ast
import json
import threading
from dataclasses import dataclass, field


class TestsError(ValueError):
    """The tests file is not valid Python (a data problem: curation quarantines such rows)."""


@dataclass(frozen=True)
class Step:
    kind: str  # "exec", "value" or "pair"
    src: str = ""  # exec: the statement; value: the expression evaluated in the sandbox
    left: str = ""  # pair
    right: str = ""  # pair
    expected: object = None  # value: the literal, kept out of the sandbox
    is_test: bool = False  # an assert (counted in tests_total), not setup code
    line: int = 0

    def wire(self) -> dict:
        """What the sandbox receives: never `expected`."""
        if self.kind == "value":
            return {"kind": "value", "src": self.src}
        if self.kind == "pair":
            return {"kind": "pair", "left": self.left, "right": self.right}
        return {"kind": "exec", "src": self.src}


@dataclass(frozen=True)
class TestPlan:
    steps: tuple[Step, ...] = field(default_factory=tuple)

    @property
    def tests_total(self) -> int:
        return sum(step.is_test for step in self.steps)

    @property
    def trust(self) -> str:
        """'out-of-process' when every test is a value step, else the weakest kind used."""
        kinds = {step.kind for step in self.steps if step.is_test}
        return "in-process" if "exec" in kinds else "pair" if "pair" in kinds else "out-of-process"


def _literal(node: ast.AST):
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


# CPython 3.11's AST constructor keeps its recursion depth in state the threads share: two reward threads
# parsing at once failed with "SystemError: AST constructor recursion depth mismatch" (a CI run)
_PARSING = threading.Lock()


def plan_tests(source: str) -> TestPlan:
    """Split a tests file into steps (parsed with `ast`, never executed here)."""
    try:
        with _PARSING:
            tree = ast.parse(source)
    except SyntaxError as err:
        raise TestsError(f"tests are not valid Python: line {err.lineno}: {err.msg}") from None
    steps = []
    for stmt in tree.body:
        src = ast.get_source_segment(source, stmt) or ast.unparse(stmt)
        if (
            isinstance(stmt, ast.Assert)
            and isinstance(stmt.test, ast.Compare)
            and len(stmt.test.ops) == 1
            and isinstance(stmt.test.ops[0], ast.Eq)
        ):
            left, right = stmt.test.left, stmt.test.comparators[0]
            left_is, left_value = _literal(left)
            right_is, right_value = _literal(right)
            if right_is and not left_is:
                steps.append(Step("value", src=ast.unparse(left), expected=right_value, is_test=True, line=stmt.lineno))
                continue
            if left_is and not right_is:
                steps.append(Step("value", src=ast.unparse(right), expected=left_value, is_test=True, line=stmt.lineno))
                continue
            if not (left_is and right_is):
                steps.append(
                    Step("pair", left=ast.unparse(left), right=ast.unparse(right), is_test=True, line=stmt.lineno)
                )
                continue
        steps.append(Step("exec", src=src, is_test=isinstance(stmt, ast.Assert), line=stmt.lineno))
    if not any(step.is_test for step in steps):
        raise TestsError("tests contain no assert statement")
    return TestPlan(tuple(steps))


class Undecodable(ValueError):
    pass


def decode(image):
    """The plain value a sandbox record describes (see sandbox.harness.encode)."""
    try:
        tag = image[0]
        if tag == "none":
            return None
        if tag == "bool":
            if type(image[1]) is not bool:
                raise Undecodable("bool")
            return image[1]
        if tag == "int":
            return int(image[1], 16)
        if tag == "float":
            return float.fromhex(image[1])
        if tag == "complex":
            return complex(float.fromhex(image[1]), float.fromhex(image[2]))
        if tag == "str":
            if type(image[1]) is not str:
                raise Undecodable("str")
            return image[1]
        if tag == "bytes":
            return bytes.fromhex(image[1])
        if tag in ("list", "tuple", "set", "frozenset"):
            items = [decode(v) for v in image[1]]
            return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)
        if tag == "dict":
            return {decode(k): decode(v) for k, v in image[1]}
    except Undecodable:
        raise
    except (IndexError, KeyError, TypeError, ValueError, RecursionError) as err:
        raise Undecodable(f"malformed value image: {err}") from None
    raise Undecodable(f"unknown value tag {str(tag)[:20]!r}")


@dataclass(frozen=True)
class Verdict:
    passed: bool
    tests_passed: int
    limit: str | None
    detail: str
    solution_ok: bool
    done: bool


def judge(plan: TestPlan, records: list[dict]) -> Verdict:
    """Decide from the candidate's step records (already parsed, nonce checked)."""
    by_step: dict = {}
    done, limit, detail = False, None, ""
    for rec in records:
        if rec.get("done") is True:
            done = True
            continue
        key = rec.get("step")
        if key in by_step:
            return Verdict(False, 0, None, f"duplicate record for step {key!r}", False, False)
        by_step[key] = rec
    solution = by_step.get("solution")
    if solution is None:
        return Verdict(False, 0, None, "no record for the solution (it exited early?)", False, done)
    if not solution.get("ok"):
        return Verdict(False, 0, solution.get("limit"), _failure("solution", solution), False, done)
    passed_tests, all_ok = 0, True
    for i, step in enumerate(plan.steps):
        rec = by_step.get(i)
        if rec is None:
            ok, why = False, f"test at line {step.line}: no result (the candidate exited early?)"
        elif not rec.get("ok"):
            ok, why = False, _failure(f"test at line {step.line}", rec)
            limit = limit or rec.get("limit")
        elif step.kind == "value":
            ok, why = _compare(step, rec.get("value"), step.expected, expected_side=True)
        elif step.kind == "pair":
            try:
                ok, why = _compare(step, rec.get("value"), decode(rec.get("other")), expected_side=False)
            except Undecodable as err:
                ok, why = False, f"test at line {step.line}: {err}"
        else:
            ok, why = True, ""
        if step.is_test and ok:
            passed_tests += 1
        if not ok:
            all_ok = False
            detail = detail or why
    if all_ok and not done:
        return Verdict(False, passed_tests, limit, "the run ended before the harness finished", True, False)
    return Verdict(all_ok and done, passed_tests, limit, detail, True, done)


def _compare(step: Step, image, expected, expected_side: bool):
    try:
        got = decode(image)
    except Undecodable as err:
        return False, f"test at line {step.line}: {err}"
    try:
        equal = got == expected
    except Exception as err:  # noqa: BLE001 - e.g. comparing unorderable plain data
        return False, f"test at line {step.line}: comparison raised {type(err).__name__}"
    if equal is True:
        return True, ""
    shown = _short(got)
    return False, (
        f"test at line {step.line}: got {shown}" + ("" if expected_side else f", other side {_short(expected)}")
    )


def _short(value, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _failure(where: str, rec: dict) -> str:
    return f"{where}: {rec.get('error', 'error')}: {str(rec.get('message', ''))[:300]}"


def parse_records(text: str, nonce: str) -> tuple[dict | None, list[dict], str | None]:
    """(ready record, step records, problem) from the record stream; lines without the run's nonce
    (forged by the candidate) make the stream invalid."""
    ready, records, problem = None, [], None
    for n, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):  # a candidate can write anything on its record channel
            problem = problem or f"record {n} is not JSON"
            continue
        if not isinstance(rec, dict):
            problem = problem or f"record {n} is not an object"
            continue
        if n == 0 and rec.get("ready") is True:
            ready = rec
            continue
        if ready is None and "setup_error" in rec:  # before "ready" only the harness writes records
            return ready, records, "setup:" + str(rec["setup_error"])
        if rec.pop("nonce", None) != nonce:
            problem = problem or f"record {n} does not carry the run's nonce (forged)"
            continue
        step = rec.get("step")
        if not (rec.get("done") is True or step == "solution" or (type(step) is int and step >= 0)) or not isinstance(
            rec.get("ok", False), bool
        ):
            problem = problem or f"record {n} is malformed"
            continue
        records.append(rec)
    return ready, records, problem
