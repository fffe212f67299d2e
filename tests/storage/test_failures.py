"""Environment failures told apart from bugs, from real errors where this machine can make them."""

import errno
import socket

import pytest
from support import full_device_error

from spotrl.ports import free_port
from spotrl.storage.failures import environment_failure, is_environment_failure

# what orbax raised when a run filled a 900 KiB tmpfs (tensorstore reports the OS error only as text)
TENSORSTORE_ENOSPC = (
    'RESOURCE_EXHAUSTED: Error writing "opt_state.1.0.mu.layers.0.self_attn.v_proj.kernel.value/0.0" in OCDBT '
    'database at local file "/runs/a/checkpoints/iter_000002.orbax-checkpoint-tmp/state.orbax-checkpoint-tmp/'
    'ocdbt.process_0/": Failed writing: "/runs/a/checkpoints/iter_000002.orbax-checkpoint-tmp/state.orbax-'
    'checkpoint-tmp/ocdbt.process_0/d/39298923a74d3591208d5635818cdc8b": Failed to write 6854 bytes to file 28: '
    "No space left on device [os_error_code='28']"
)


def _refused_connection() -> OSError:
    port = free_port()  # nobody listens on it once closed
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except OSError as err:
        return err
    raise AssertionError(f"port {port} accepted a connection")


def test_a_full_disk_without_a_file_name_points_at_the_run_directory():
    failure = environment_failure(full_device_error(), run_dir="/runs/a")
    assert failure.line() == (
        "no space left on device: /runs/a. Free space under /runs/a, "
        "then run the same command again: it resumes after the last complete iteration."
    )


def test_a_full_disk_reported_as_text_by_orbax_names_the_file_and_its_part_of_the_run_directory():
    try:
        try:
            raise ValueError(TENSORSTORE_ENOSPC)
        except ValueError as inner:
            raise RuntimeError("task run failed") from inner  # as a wrapper would
    except RuntimeError as err:
        failure = environment_failure(err, run_dir="/runs/a")
    assert failure.what == "no space left on device"
    assert failure.path.endswith("/ocdbt.process_0/d/39298923a74d3591208d5635818cdc8b")
    assert failure.advice.startswith("Free space under /runs/a/checkpoints, then run the same command again")


def test_a_read_only_file_system_and_a_permission_error_ask_for_a_writable_run_directory():
    ro = environment_failure(OSError(errno.EROFS, "Read-only file system", "/runs/a/metrics.jsonl"), "/runs/a")
    assert ro.line().startswith("read-only file system: /runs/a/metrics.jsonl. Make /runs/a writable for this user")
    denied = environment_failure(PermissionError(errno.EACCES, "Permission denied", "/runs/a/.lock"), "/runs/a")
    assert denied.what == "permission denied" and denied.path == "/runs/a/.lock"


def test_a_store_that_does_not_answer_is_named_with_the_run_directory():
    failure = environment_failure(_refused_connection(), run_dir="gs://bucket/run")
    assert failure.what.startswith("storage not reachable (ConnectionRefusedError: ")
    assert failure.line().startswith("storage not reachable (")
    assert "gs://bucket/run. When gs://bucket/run answers again, then run the same command again" in failure.line()


def test_a_failure_inside_an_exception_group_is_found():
    group = ExceptionGroup("shards", [ValueError("bad row"), full_device_error()])
    assert environment_failure(group, "/r").what == "no space left on device"


@pytest.mark.parametrize(
    "err",
    [ValueError("bad row 3"), KeyError("answer"), TimeoutError("verifier ran past 10 s"), FileNotFoundError(2, "x")],
)
def test_bugs_bad_data_and_a_verifier_timeout_are_not_environment_failures(err):
    assert environment_failure(err, "/r") is None
    assert not is_environment_failure(err)


def test_only_what_seconds_cannot_change_is_not_retried():
    assert is_environment_failure(full_device_error())
    assert is_environment_failure(ValueError(TENSORSTORE_ENOSPC))
    assert is_environment_failure(OSError(errno.EROFS, "Read-only file system"))
    assert not is_environment_failure(_refused_connection())  # a network hiccup may pass: retried
