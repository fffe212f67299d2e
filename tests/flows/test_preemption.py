"""The SIGTERM guard and the failpoint spec, in this process and in small subprocesses."""

import os
import signal
import subprocess
import sys
import time

import pytest

from spotrl import faults
from spotrl.flows.preemption import EXIT_PREEMPTED, Preempted, PreemptionGuard


def test_sigterm_sets_a_flag_and_check_stops_there():
    before = signal.getsignal(signal.SIGTERM)
    with PreemptionGuard(grace_seconds=30) as guard:
        guard.check("before any signal")  # nothing requested: no-op
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler runs between bytecodes
        assert guard.requested
        with pytest.raises(Preempted, match="stopped after the update"):
            guard.check("after the update")
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_stage_past_the_grace_period_exits_with_the_preempted_code():
    code = (
        "import os, signal, time\n"
        "from spotrl.flows.preemption import PreemptionGuard\n"
        "with PreemptionGuard(grace_seconds=0.3):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(30)  # a stage that does not finish in time\n"
    )
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == EXIT_PREEMPTED
    assert "did not finish within 0.3 s" in result.stderr
    assert time.monotonic() - started < 20


def test_failpoint_spec_parsing():
    assert faults.parse("publish.flip@3") == ("publish.flip", 3, 0.0)
    assert faults.parse("checkpoint.save@12+0.05") == ("checkpoint.save", 12, 0.05)
    with pytest.raises(ValueError, match="unknown point 'publish.nowhere'"):
        faults.parse("publish.nowhere@3")
    with pytest.raises(ValueError, match="expected '<point>@<iteration>"):
        faults.parse("publish.flip")


def test_failpoint_kills_only_at_its_point_and_once(tmp_path):
    marker = tmp_path / "fired"
    code = (
        "from spotrl.faults import failpoint\n"
        "failpoint('update.step', 1); failpoint('publish.flip', 2)\n"
        "print('passed', flush=True)\n"
        "failpoint('publish.flip', 3)\n"
        "print('survived')\n"
    )
    env = {**os.environ, "SPOTRL_KILL_AT": "publish.flip@3", "SPOTRL_KILL_ONCE": str(marker)}
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == -signal.SIGKILL and first.stdout == "passed\n"
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert second.returncode == 0 and second.stdout == "passed\nsurvived\n"
