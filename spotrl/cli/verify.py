"""`spotrl verify code --solution FILE --tests FILE`: one candidate through the sandbox.

Prints one JSON object: reward, status (passed, failed, timeout, limit, error), tests_passed,
tests_total, detail, limit, trust, seconds, cpu_s, isolation, attempts, stdout and stderr (tails).
Exit codes: 0 passed; 1 failed, timeout or limit; 2 bad arguments (unreadable file, tests that are
not Python with an assert); 3 the sandbox itself failed (status "error": not the candidate's fault).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TAIL = 2000


def run_code(args) -> int:
    from spotrl.rewards.code_tests import TestsError, plan_tests
    from spotrl.rewards.sandbox.runner import Limits, Sandbox, SandboxError

    try:
        solution = Path(args.solution).read_text()
        plan = plan_tests(Path(args.tests).read_text())
    except (OSError, UnicodeDecodeError, TestsError) as err:
        print(f"spotrl verify code: error: {err}", file=sys.stderr)
        return 2
    limits = Limits(cpu_s=args.cpu_seconds, wall_s=args.timeout, memory_mb=args.memory_mb)
    sandbox = Sandbox(limits, retries=args.retries, require_isolation=not args.allow_weak_isolation)
    try:
        result = sandbox.run(solution, plan).to_json()
    except SandboxError as err:
        print(
            json.dumps(
                {
                    "reward": None,
                    "status": "error",
                    "detail": str(err),
                    "attempts": err.attempts,
                    "tests_total": plan.tests_total,
                },
                sort_keys=True,
            )
        )
        return 3
    result["stdout"], result["stderr"] = result["stdout"][-TAIL:], result["stderr"][-TAIL:]
    print(json.dumps(result, sort_keys=True))
    return 0 if result["status"] == "passed" else 1
