"""`spotrl` errors as a user meets them: one line on stderr naming the key, the override or the path; exit 2."""

import os

import pytest

from spotrl.cli.main import main


def _error(capsys, *argv) -> str:
    assert main(list(argv)) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("spotrl: error: ") and "Traceback" not in captured.err
    return captured.err


def test_a_bad_override_is_named(capsys, tmp_path):
    err = _error(capsys, "train", "--run-dir", str(tmp_path / "r"), "--set", "eval.k=99", "--set", "nosuch=1")
    assert "eval.k: k (99) must be <= eval.n (16): pass@k needs at least k samples (from --set eval.k=99)" in err
    assert "nosuch: unknown key (from --set nosuch=1)" in err and "Value error" not in err
    assert not (tmp_path / "r").exists()  # refused before any work


def test_a_key_under_a_section_override_names_that_override(capsys, tmp_path):
    err = _error(capsys, "train", "--run-dir", str(tmp_path / "r"), "--set", "eval={n: 2, k: 4}")
    assert "eval.k: k (4) must be <= eval.n (2)" in err and "(from --set eval={n: 2, k: 4})" in err


def test_a_preset_error_names_the_file(capsys, tmp_path):
    err = _error(capsys, "train", "--config", "smoke", "--run-dir", str(tmp_path / "r"), "--set", "eval.k=9")
    assert "smoke.yaml: invalid config:" in err and "(from --set eval.k=9)" in err
    assert "no preset 'smok'" in _error(capsys, "train", "--config", "smok", "--run-dir", str(tmp_path / "r"))


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc, where nothing can be created")
def test_a_run_directory_that_cannot_be_created_is_one_line(capsys):
    err = _error(capsys, "train", "--config", "smoke", "--run-dir", "/proc/spotrl-run")
    assert err == "spotrl: error: /proc/spotrl-run: cannot create the run directory: No such file or directory\n"


@pytest.mark.parametrize("command", [["eval"], ["digest"], ["export", "--out", "OUT"]])
def test_every_run_directory_command_names_a_missing_run(capsys, tmp_path, command):
    argv = [command[0], "--run-dir", str(tmp_path / "none")] + [
        a.replace("OUT", str(tmp_path / "o")) for a in command[1:]
    ]
    assert str(tmp_path / "none") in _error(capsys, *argv)


def test_output_into_a_closed_pipe_ends_without_a_traceback():
    """`spotrl simulate | true`: the reader is gone before the table is printed; the command ends
    quietly with 141, as a shell reports SIGPIPE (a BrokenPipeError traceback before)."""
    import subprocess
    import sys

    shell = f"{sys.executable} -m spotrl simulate | true; echo ${{PIPESTATUS[0]}} >&2"
    done = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=300)
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "141"
