"""The run's progress lines: a progress bar on a terminal, plain lines anywhere else."""

import os
import pty
import subprocess
import sys

from spotrl.tasks.runlog import Progress

CHECKS = [(10, {"loss": "2.449", "greedy accuracy": "0.0%"}), (20, {"loss": "2.292", "greedy accuracy": "12.5%"})]


def test_not_a_terminal_gets_plain_lines(capsys):
    with Progress("warm start", total=30) as progress:
        for step, fields in CHECKS:
            progress(step, fields)
    assert capsys.readouterr().out == (
        "warm start step 10: loss 2.449, greedy accuracy 0.0%\nwarm start step 20: loss 2.292, greedy accuracy 12.5%\n"
    )


def test_a_terminal_gets_one_updating_bar():
    script = (
        "from spotrl.tasks.runlog import Progress\n"
        f"with Progress('warm start', total=30) as progress:\n"
        f"    for step, fields in {CHECKS!r}:\n"
        "        progress(step, fields)\n"
        "print('done')\n"
    )
    parent, child = pty.openpty()
    process = subprocess.Popen([sys.executable, "-c", script], stdout=child, stderr=child, close_fds=True)
    os.close(child)
    out = b""
    while True:
        try:
            chunk = os.read(parent, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    assert process.wait(timeout=60) == 0
    text = out.decode()
    assert "\r" in text and "warm start:" in text and "20/30" in text and "loss=2.292" in text, text
    assert "step/s" in text  # the fields after the loss may be cut at the width of the terminal
    assert "warm start step 10:" not in text  # no plain lines beside the bar
    assert text.rstrip().endswith("done")


def test_a_quiet_progress_says_nothing_off_a_terminal(capsys):
    # an evaluation's bar: its result gets a line of its own, so CI logs get no per-chunk lines
    with Progress("eval i5", total=64, unit="sample", plain=False) as progress:
        progress(32, {"pass@1": "12.5%"})
        progress(64, {"pass@1": "10.9%"})
    assert capsys.readouterr().out == ""
