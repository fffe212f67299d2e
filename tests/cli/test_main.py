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


def _one_line(capsys, *argv) -> str:
    err = _error(capsys, *argv)
    assert err.count("\n") == 1, err
    return err


def test_a_config_file_that_is_not_yaml_is_one_line_naming_the_file_and_line(capsys, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("seed: 1\nrollout:\n\tgroup_size: 4\n")
    err = _one_line(capsys, "train", "--config", str(path), "--run-dir", str(tmp_path / "r"))
    assert err.startswith(f"spotrl: error: {path}:3:1: not valid YAML: found character '\\t'")
    assert not (tmp_path / "r").exists()


def test_a_directory_as_config_is_named_a_directory(capsys, tmp_path):
    err = _one_line(capsys, "train", "--config", str(tmp_path), "--run-dir", str(tmp_path / "r"))
    assert err == f"spotrl: error: config file {tmp_path} is a directory, not a YAML file\n"


def test_an_override_that_is_not_yaml_names_the_override(capsys, tmp_path):
    err = _one_line(capsys, "train", "--run-dir", str(tmp_path / "r"), "--set", "seed=[1")
    assert err.startswith("spotrl: error: seed: not valid YAML: ") and err.endswith("(from --set seed=[1)\n")


@pytest.mark.parametrize("command", [["eval"], ["train"]])
def test_a_garbage_run_config_is_one_line_naming_it(capsys, tmp_path, command):
    (tmp_path / "config.yaml").write_bytes(b"iterations: 3\n\x00\xff\n")
    err = _one_line(capsys, *command, "--run-dir", str(tmp_path))
    assert err.startswith(f"spotrl: error: {tmp_path / 'config.yaml'}:2:")


@pytest.mark.parametrize("seconds", ["-5", "inf", "nan", "soon"])
def test_a_grace_period_that_is_not_a_finite_duration_is_refused_at_parsing(capsys, seconds):
    with pytest.raises(SystemExit) as stop:
        main(["train", f"--grace-seconds={seconds}"])
    assert stop.value.code == 2
    assert "argument --grace-seconds:" in capsys.readouterr().err.splitlines()[-1]


def test_bad_config_files_end_the_real_command_with_exit_2_and_one_line(tmp_path):
    """The exit-code contract end to end, in a process of its own as a user's shell runs it: a YAML
    syntax error in --config, and a run directory whose config.yaml is garbage."""
    import subprocess
    import sys

    (tmp_path / "bad.yaml").write_text("rollout: {group_size: 4\n")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_bytes(b"\xff")
    for argv, named in [
        (["train", "--config", str(tmp_path / "bad.yaml"), "--run-dir", str(tmp_path / "r")], "bad.yaml:2:1:"),
        (["eval", "--run-dir", str(tmp_path / "run")], "config.yaml:1:1:"),
    ]:
        done = subprocess.run([sys.executable, "-m", "spotrl", *argv], capture_output=True, text=True, timeout=300)
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and named in done.stderr and "Traceback" not in done.stderr, done.stderr
