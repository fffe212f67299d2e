"""The code verifier: the completion's Python, run against the row's tests in the sandbox."""

from __future__ import annotations

import re

from spotrl.rewards.sandbox.runner import Sandbox, SandboxResult, default_sandbox

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(completion: str) -> str:
    """The last fenced code block (```python ... ```, an unterminated last fence included), else the
    whole completion."""
    blocks = _FENCE.findall(completion)
    return blocks[-1] if blocks else completion


def run_code(completion: str, tests: str, sandbox: Sandbox | None = None) -> SandboxResult:
    return (sandbox or default_sandbox()).run(extract_code(completion), tests)


def code_reward(completion: str, stopped: bool, tests: str, sandbox: Sandbox | None = None) -> float:
    """1.0 when the completion ended by itself and its code passes every test; 0.0 when it fails,
    times out or hits a limit. A failure of the sandbox itself raises `SandboxError` (never 0)."""
    if not stopped:
        return 0.0
    return run_code(completion, tests, sandbox).reward
