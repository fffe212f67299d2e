"""Worker ids: one format, host:pid, for weight leases and the metrics' rollout_workers."""

import os
import socket

from spotrl.storage.lease import worker_id


def test_worker_id_is_host_colon_pid():
    assert worker_id() == f"{socket.gethostname()}:{os.getpid()}"
