"""Worker ids: one format, host:pid, for weight leases and the metrics' rollout_workers."""

import os
import socket

from spotrl.storage.lease import worker_id


def test_worker_id_is_host_colon_pid():
    assert worker_id() == f"{socket.gethostname()}:{os.getpid()}"


def test_a_worker_lease_keeps_its_version_and_has_a_file_safe_name(tmp_path):
    import numpy as np

    from spotrl.storage.weights import WeightStore

    store = WeightStore(tmp_path / "weights", keep=1)
    store.publish(0, {"w": np.zeros(2, np.float32)})
    holder = worker_id()
    store.hold(0, holder, ttl_seconds=60)
    leases = [p.name for p in (tmp_path / "weights" / "leases").iterdir()]
    assert leases == [f"{socket.gethostname()}-{os.getpid()}-v000000.json"]  # ':' is not in any name
    assert store.held() == {0}
    store.publish(1, {"w": np.ones(2, np.float32)})  # keep=1: version 0 stays while it is held
    assert 0 in store.versions()
    store.release(0, holder)
    assert store.held() == set()
