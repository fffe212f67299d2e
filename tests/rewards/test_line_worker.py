"""The JSON-lines helper process both answer judges run on."""

import sys
import time

import pytest

from spotrl.rewards.line_worker import Died, LineWorker, Silent

ECHO = (
    "import json, sys\n"
    "for line in sys.stdin:\n"
    "    print(json.dumps({'twice': 2 * json.loads(line)['x']}), flush=True)\n"
)


def test_a_reply_per_request_then_silence_then_death():
    worker = LineWorker([sys.executable, "-c", ECHO])
    try:
        worker.send({"x": 21})
        assert worker.receive(time.monotonic() + 60) == {"twice": 42}
        with pytest.raises(Silent):  # nothing asked, nothing said
            worker.receive(time.monotonic() + 0.2)
        worker.proc.kill()
        worker.proc.wait()
        with pytest.raises(Died):
            worker.receive(time.monotonic() + 60)
    finally:
        assert worker.kill() is not None and worker.proc.stdout.closed


def test_close_ends_it_at_the_end_of_its_input():
    worker = LineWorker([sys.executable, "-c", ECHO])
    worker.close()
    assert worker.proc.returncode == 0  # exited on its own, not killed
