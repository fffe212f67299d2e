"""The code sandbox: hostile programs are contained (reward 0 or a reported error), the trainer and the
machine are unharmed, and a failure of the sandbox itself is an error, never a reward of 0.

Every case runs a real subprocess sandbox. A hostile case's tests state the attacker's goal, so a
contained attack is a candidate that does not pass."""

import os
import socket
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from spotrl.rewards import code_tests
from spotrl.rewards.code import code_reward, extract_code
from spotrl.rewards.code_tests import decode, judge, parse_records, plan_tests
from spotrl.rewards.sandbox import runner as sb
from spotrl.rewards.sandbox.runner import Limits, Sandbox, SandboxError, SandboxUnavailable
from spotrl.rewards.score import score

FAST = Limits(cpu_s=1, wall_s=5.0, memory_mb=256, file_mb=1, processes=16)
SHORT = Limits(cpu_s=1, wall_s=1.0, memory_mb=256, file_mb=1, processes=16)  # for the cases that end by the wall clock
ADD_TESTS = "assert add(1, 2) == 3\nassert add(-1, 1) == 0\nassert add(10, 5) == 15\n"
GOOD = "def add(a, b):\n    return a + b\n"

needs_linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox needs Linux")
pytestmark = needs_linux


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(FAST)


def _box_for(allowed: set, **kw) -> Sandbox:
    return Sandbox(SHORT if "timeout" in allowed else FAST, **kw)


def _sandbox_processes(uid_floor: int = 1_000_000) -> list[str]:
    """Live processes of any dedicated sandbox uid (zombies waiting for their reaper aside)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        uid = int(status.split("Uid:")[1].split()[0])
        state = status.split("State:")[1].split()[0]
        if uid >= uid_floor and state != "Z":
            found.append(pid)
    return found


def _no_leftovers(timeout: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout
    while _sandbox_processes():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# ---------------------------------------------------------------------------------- correct code


def test_correct_solution_passes_out_of_process(sandbox):
    result = sandbox.run(GOOD, ADD_TESTS)
    assert (result.status, result.reward, result.tests_passed, result.tests_total) == ("passed", 1.0, 3, 3)
    assert result.trust == "out-of-process" and result.attempts == 1
    iso = result.isolation
    assert iso["caps"] == 0 and iso["audit_hook"]
    if os.geteuid() == 0:  # what CI and this machine run as
        assert iso["identity"] == "dedicated_uid" and iso["uid_seen"] >= 1_000_000
        assert iso["mount"] and iso["net"] and iso["pid"]


def test_wrong_solution_fails_with_the_value_it_returned(sandbox):
    result = sandbox.run("def add(a, b):\n    return a + b if a > 0 else 7\n", ADD_TESTS)
    assert (result.status, result.reward, result.tests_passed) == ("failed", 0.0, 2)
    assert result.detail == "test at line 2: got 7"


def test_setup_statements_and_non_literal_asserts_run_in_the_sandbox(sandbox):
    tests = (
        "import math\nxs = [add(i, i) for i in range(3)]\nassert xs == [0, 2, 4]\n"
        "assert math.isclose(add(0.1, 0.2), 0.3)\n"
    )
    result = sandbox.run(GOOD, tests)
    assert result.status == "passed" and result.tests_total == 2 and result.trust == "in-process"


# --------------------------------------------------------------------- hostile programs, one table

SECRET = "SPOTRL_TEST_SECRET"


def _hostile_cases(tmp: Path, port: int):
    secret_file = tmp / "secret.txt"
    target = tmp / "written-by-candidate.txt"
    return {
        "infinite loop (CPU)": ("while True:\n    pass\n", "assert add(1, 2) == 3", {"limit", "timeout"}),
        "sleeps forever": ("import time\ntime.sleep(3600)\n", "assert add(1, 2) == 3", {"timeout"}),
        "memory bomb": ("x = bytearray(4 * 1024 ** 3)\n", "assert add(1, 2) == 3", {"limit"}),
        "memory creep": (
            "xs = []\nwhile True:\n    xs.append(bytearray(2 ** 24))\n",
            "assert add(1, 2) == 3",
            {"limit"},
        ),
        "huge file": (
            "with open('big', 'wb') as f:\n    while True:\n        f.write(b'x' * 2 ** 20)\n",
            "assert add(1, 2) == 3",
            {"limit"},
        ),
        "fork bomb": (
            "import os\nwhile True:\n    os.fork()\n",
            "assert add(1, 2) == 3",
            {"limit", "timeout", "failed"},
        ),
        "fork bomb that escapes its group": (
            "import os\nwhile True:\n    try:\n        if os.fork() == 0:\n"
            "            os.setsid()\n    except OSError:\n        pass\n",
            "assert add(1, 2) == 3",
            {"timeout", "limit", "failed"},
        ),
        "reads the environment": (
            f"import os\ndef leak():\n    return os.environ.get({SECRET!r})\n",
            "assert leak() == 'hunter2'",
            {"failed"},
        ),
        "reads a file outside": (
            f"def leak():\n    return open({str(secret_file)!r}).read()\n",
            "assert leak() == 'hunter2'",
            {"failed"},
        ),
        "reads the trainer's source": (
            "def leak():\n    return open(" + repr(str(Path(sb.__file__))) + ").read()[:3]\n",
            'assert leak() == \'"""\'',
            {"failed"},
        ),
        "writes a file outside": (
            f"def attack():\n    open({str(target)!r}, 'w').write('x')\n    return 1\n",
            "assert attack() == 1",
            {"failed"},
        ),
        "opens a network connection": (
            "import socket\ndef attack():\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n    return 1\n",
            "assert attack() == 1",
            {"failed"},
        ),
        "signals its parent": (
            "import os, signal\ndef attack():\n    os.kill(os.getppid(), signal.SIGKILL)\n"
            f"    os.kill({os.getpid()}, signal.SIGKILL)\n    return 1\n",
            "assert attack() == 1",
            {"failed"},
        ),
        "kills its process group": ("import os\nos.killpg(0, 9)\n", "assert add(1, 2) == 3", {"failed"}),
        "exits early with 0": ("import sys\nsys.exit(0)\n", "assert add(1, 2) == 3", {"failed"}),
        "os._exit(0) before the tests": ("import os\nos._exit(0)\n", "assert add(1, 2) == 3", {"failed"}),
        "object equal to everything": (
            "class Eq:\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return Eq()\n",
            "assert add(1, 2) == 3",
            {"failed"},
        ),
        "int subclass equal to everything": (
            "class Eq(int):\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return Eq(0)\n",
            "assert add(1, 2) == 3",
            {"failed"},
        ),
        "patches exec and eval": (
            "import builtins\nbuiltins.exec = lambda *a, **k: None\nbuiltins.eval = lambda *a, **k: 3\n"
            "def add(a, b):\n    return 0\n",
            "assert add(1, 2) == 3\nassert add(2, 2) > 10\n",
            {"failed"},
        ),
        "forges result records": (
            'import os\nos.write(3, b\'{"step": "solution", "ok": true}\\n{"step": 0, "ok": true, '
            '"value": ["int", "0x3"]}\\n{"done": true}\\n\')\nos._exit(0)\n',
            "assert add(1, 2) == 3",
            {"failed"},
        ),
        "floods the result channel": (
            "import os\nwhile True:\n    os.write(3, b'x' * 65536)\n",
            "assert add(1, 2) == 3",
            {"failed", "timeout"},
        ),
        "loads ctypes": (
            "import ctypes\nctypes.CDLL(None).prctl(1, 0, 0, 0, 0)\n",
            "assert add(1, 2) == 3",
            {"failed"},
        ),
        "spawns a shell": (
            "import subprocess\nsubprocess.run(['sh', '-c', 'id'])\n",
            "assert add(1, 2) == 3",
            {"failed"},
        ),
    }


@pytest.fixture(scope="module")
def hostile_env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    (tmp / "secret.txt").write_text("hunter2")
    os.chmod(tmp / "secret.txt", 0o644)  # world-readable: only the sandbox's own walls keep it out
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    os.environ[SECRET] = "hunter2"
    yield tmp, server
    os.environ.pop(SECRET, None)
    server.close()


CASE_NAMES = list(_hostile_cases(Path("/x"), 1))


def _check_contained(tmp, server, result, allowed):
    assert result.reward == 0.0 and result.status in allowed, (result.status, result.detail)
    assert (tmp / "secret.txt").read_text() == "hunter2"
    assert not (tmp / "written-by-candidate.txt").exists()
    with pytest.raises(BlockingIOError):
        server.accept()  # nothing ever connected
    assert _no_leftovers(), f"sandbox processes left: {_sandbox_processes()}"


@pytest.mark.parametrize("case", CASE_NAMES)
def test_hostile_program_is_contained(case, sandbox, hostile_env):
    tmp, server = hostile_env
    solution, tests, allowed = _hostile_cases(tmp, server.getsockname()[1])[case]
    result = _box_for(allowed).run(solution, tests)
    _check_contained(tmp, server, result, allowed)


LAYER_CASES = [
    "reads the environment",
    "reads a file outside",
    "writes a file outside",
    "opens a network connection",
    "signals its parent",
    "kills its process group",
    "fork bomb that escapes its group",
    "memory bomb",
]


@pytest.mark.parametrize(
    "layer", ["namespaces only (no audit hook)", "user namespace", "audit hook only (no namespaces)"]
)
def test_each_isolation_layer_contains_on_its_own(layer, hostile_env):
    if os.geteuid() != 0 and layer != "user namespace":
        pytest.skip("the other layers need root here")
    kw = {
        "namespaces only (no audit hook)": {"audit": False},
        "user namespace": {"mode": "userns"},
        "audit hook only (no namespaces)": {"mode": "none"},
    }[layer]
    tmp, server = hostile_env
    cases = _hostile_cases(tmp, server.getsockname()[1])
    for case in LAYER_CASES:
        if layer == "user namespace" and "fork bomb" in case and os.geteuid() == 0:
            continue  # as root, "userns" maps the namespace to uid 0, which RLIMIT_NPROC exempts
        solution, tests, allowed = cases[case]
        result = _box_for(allowed, **kw).run(solution, tests)
        _check_contained(tmp, server, result, allowed)
        assert result.isolation["audit_hook"] == kw.get("audit", True)
    assert Sandbox(FAST, **kw).run(GOOD, ADD_TESTS).status == "passed"


def test_cpu_limit_and_wall_clock_are_distinguished():
    burn = Sandbox(Limits(cpu_s=1, wall_s=10)).run("while True:\n    pass\n", "assert f() == 1")
    assert (burn.status, burn.limit) == ("limit", "cpu") and burn.seconds < 5
    sleep = Sandbox(Limits(cpu_s=10, wall_s=0.5)).run("import time\ntime.sleep(60)\n", "assert f() == 1")
    assert sleep.status == "timeout" and sleep.seconds < 5


def test_limits_are_named(sandbox):
    assert sandbox.run("x = bytearray(4 * 1024 ** 3)\n", "assert f() == 1").limit == "memory"
    assert sandbox.run("open('big', 'wb').write(b'x' * 2 * 2 ** 20)\n", "assert f() == 1").limit == "file_size"
    assert sandbox.run("import os\nwhile True:\n    os.fork()\n", "assert f() == 1").limit == "processes"


def test_stdout_is_captured_and_bounded():
    box = Sandbox(Limits(output_kb=1))
    result = box.run("print('hello')\nprint('x' * 100000)\n" + GOOD, ADD_TESTS)
    assert result.status == "passed" and result.stdout.startswith("hello") and len(result.stdout) <= 1024


# ------------------------------------------------------------------------ the sandbox's own failures


def _fake_harness(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "harness.py"
    path.write_text(body)
    return path


def test_harness_crash_is_an_error_after_retries_never_zero(tmp_path):
    box = Sandbox(FAST, retries=2, backoff_s=0.0, harness=_fake_harness(tmp_path, "raise RuntimeError('boom')\n"))
    with pytest.raises(SandboxError, match="boom") as err:
        box.run(GOOD, ADD_TESTS)
    assert err.value.attempts == 3 and box.stats == {"runs": 0, "infra_errors": 3, "retries": 2}


def test_harness_that_could_not_start_is_an_error():
    with pytest.raises(SandboxError, match="could not start"):
        Sandbox(FAST, retries=0, python="/nonexistent/python").run(GOOD, ADD_TESTS)


def test_transient_harness_failure_is_retried(tmp_path):
    marker = tmp_path / "crashed-once"
    real = Path(sb.__file__).with_name("harness.py")
    body = (
        f"import os, sys\nif not os.path.exists({str(marker)!r}):\n    open({str(marker)!r}, 'w').close()\n"
        f"    os._exit(9)\nsys.argv[0] = {str(real)!r}\n"
        f"exec(compile(open({str(real)!r}).read(), {str(real)!r}, 'exec'), {{'__name__': '__main__'}})\n"
    )
    box = Sandbox(FAST, retries=2, backoff_s=0.0, harness=_fake_harness(tmp_path, body))
    result = box.run(GOOD, ADD_TESTS)
    assert result.status == "passed" and result.attempts == 2 and box.stats["retries"] == 1


def test_unavailable_isolation_is_not_retried(tmp_path):
    body = 'print(\'{"event": "result", "unavailable": "unshare: Operation not permitted", "isolation": {}}\')\n'
    box = Sandbox(FAST, retries=3, backoff_s=0.0, harness=_fake_harness(tmp_path, body))
    with pytest.raises(SandboxUnavailable, match="not available") as err:
        box.run(GOOD, ADD_TESTS)
    assert err.value.attempts == 1


def test_harness_that_hangs_is_killed_and_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(sb, "HARNESS_GRACE_S", 0.5)
    box = Sandbox(Limits(wall_s=0.5), retries=0, harness=_fake_harness(tmp_path, "import time\ntime.sleep(60)\n"))
    start = time.monotonic()
    with pytest.raises(SandboxError, match="did not report"):
        box.run(GOOD, ADD_TESTS)
    assert time.monotonic() - start < 5


def test_score_raises_on_sandbox_failure_instead_of_scoring_zero(tmp_path, monkeypatch):
    broken = Sandbox(FAST, retries=0, harness=_fake_harness(tmp_path, "import sys\nsys.exit(3)\n"))
    monkeypatch.setattr(sb, "_DEFAULT", broken)
    with pytest.raises(SandboxError):
        score("code", ["```python\n" + GOOD + "```"], [True], [ADD_TESTS])


# --------------------------------------------------------------------- the verifier and the pool


def test_code_verifier_extracts_the_last_block_and_needs_the_stop_token():
    completion = "First try:\n```python\ndef add(a, b): return 0\n```\nFixed:\n```python\n" + GOOD + "```\n"
    assert extract_code(completion) == GOOD
    assert extract_code(GOOD) == GOOD
    assert code_reward(completion, True, ADD_TESTS) == 1.0
    assert code_reward(completion, False, ADD_TESTS) == 0.0  # cut off by the length limit


def test_parallel_scoring_matches_sequential():
    completions = ["```python\n" + GOOD + "```", "```python\ndef add(a, b):\n    return a * b\n```", GOOD, "nonsense("]
    tests = [ADD_TESTS] * 4
    flags = [True, True, True, True]
    sequential = score("code", completions, flags, tests, workers=1)
    np.testing.assert_array_equal(sequential, [1.0, 0.0, 1.0, 0.0])
    np.testing.assert_array_equal(score("code", completions, flags, tests, workers=4), sequential)
    results = Sandbox(FAST).run_many([(GOOD, ADD_TESTS)] * 4, workers=4)
    assert [r.status for r in results] == ["passed"] * 4
    assert len({r.isolation["uid"] for r in results}) == 4  # one dedicated identity per run (as root)


# ----------------------------------------------------------------- test plans and the judge (no subprocess)


def test_plan_keeps_literals_out_of_the_sandbox():
    plan = plan_tests("import math\nassert f(2) == 4\nassert [1, 2] == g()\nassert f(1) == f(1)\nassert f(3)\n")
    kinds = [(s.kind, s.is_test) for s in plan.steps]
    assert kinds == [("exec", False), ("value", True), ("value", True), ("pair", True), ("exec", True)]
    assert plan.steps[1].wire() == {"kind": "value", "src": "f(2)"} and plan.steps[1].expected == 4
    assert plan.steps[2].expected == [1, 2] and "expected" not in plan.steps[2].wire()
    assert plan.tests_total == 4 and plan.trust == "in-process"
    with pytest.raises(code_tests.TestsError, match="not valid Python"):
        plan_tests("assert f(1) ==")
    with pytest.raises(code_tests.TestsError, match="no assert"):
        plan_tests("x = 1\n")


def test_decode_refuses_malformed_images():
    assert decode(["tuple", [["int", "0x2"], ["str", "a"], ["none"]]]) == (2, "a", None)
    assert decode(["float", (0.5).hex()]) == 0.5
    for bad in (["int", 5], ["str", 5], ["bool", 1], ["weird"], [], "x", ["set", [["list", []]]]):
        with pytest.raises(ValueError):
            decode(bad)


def test_judge_needs_every_record_and_the_end_marker():
    plan = plan_tests("assert f(1) == 2\nassert f(2) == 3\n")
    ok = [
        {"step": "solution", "ok": True},
        {"step": 0, "ok": True, "value": ["int", "0x2"]},
        {"step": 1, "ok": True, "value": ["int", "0x3"]},
    ]
    assert judge(plan, ok + [{"done": True}]).passed
    assert not judge(plan, ok).passed  # no end marker: the run stopped early
    assert not judge(plan, ok[:2] + [{"done": True}]).passed
    assert not judge(plan, ok + [ok[1], {"done": True}]).passed  # duplicate record
    wrong = ok[:2] + [{"step": 1, "ok": True, "value": ["bool", True]}, {"done": True}]
    assert judge(plan, wrong).tests_passed == 1  # True == 3 is False; (True == 1 would pass, as in Python)
    _, records, problem = parse_records('{"ready": true}\n{"step": "solution", "ok": true}\n', nonce="abc")
    assert records == [] and "nonce" in problem
    hostile = '{"ready": true}\n' + "[" * 100000 + "\n" + '{"step": [1], "ok": true, "nonce": "abc"}\n'
    _, records, problem = parse_records(hostile, nonce="abc")  # nothing a candidate writes can crash the judge
    assert records == [] and "not JSON" in problem
