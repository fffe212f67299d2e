"""The weight store on a local directory and on gs:// (a real GCS API: a local emulator, through gcsfs)."""

import time

import numpy as np
import pytest
from support import make_bucket

from spotrl.storage.weights import WeightStore, WeightStoreError

BUCKET = "spotrl-test"


@pytest.fixture(scope="module")
def gcs_emulator(gcs):
    return make_bucket(gcs, BUCKET)


@pytest.fixture(params=["local", "gs"])
def root(request, tmp_path):
    if request.param == "local":
        return tmp_path / "weights"
    base = request.getfixturevalue("gcs_emulator")
    return f"{base}/{request.node.name.replace('[', '-').replace(']', '')}/weights"


def _params(scale=1.0):
    return {"embed": {"embedding": np.full((4, 3), scale, np.float32)}, "w": np.arange(6, dtype=np.float32) * scale}


def test_publish_pull_latest_and_retention(root):
    store = WeightStore(root, keep=2)
    assert store.latest() is None and store.versions() == []
    for v in range(4):
        store.publish(v, _params(float(v)))
    assert store.latest() == 3 and store.versions() == [2, 3]
    np.testing.assert_array_equal(store.load(None, _params())["w"], _params(3.0)["w"])
    assert store.verified_digest(3) == store.digest(3) == store.ref(3)["sha256"]
    store.publish(1, _params(1.0))  # an old version published late never moves LATEST back
    assert store.latest() == 3


def test_version_without_manifest_is_invisible_until_published(root):
    store = WeightStore(root)
    store.publish(1, _params(1.0))
    store._write(b"partial", "v000002", "model.safetensors")  # killed before its manifest
    assert store.versions() == [1] and store.incomplete() == [store.version_dir(2)]
    store.publish(2, _params(2.0))
    assert store.versions() == [1, 2] and store.incomplete() == []
    np.testing.assert_array_equal(store.load(2, _params())["w"], _params(2.0)["w"])


def test_a_held_version_survives_retention_until_its_lease_expires(root):
    store = WeightStore(root, keep=1)
    store.publish(0, _params(0.0))
    store.hold(0, "worker-a", ttl_seconds=60)
    store.hold(0, "worker-b", ttl_seconds=-1)  # an expired lease protects nothing
    store.publish(1, _params(1.0))
    assert store.versions() == [0, 1]  # worker-a still uses version 0
    store.release(0, "worker-a")
    store.publish(2, _params(2.0))
    assert store.versions() == [2]


def test_corrupt_version_is_refused_naming_it(root):
    store = WeightStore(root)
    store.publish(1, _params())
    store._write(b"not the bytes that were published", "v000001", "model.safetensors")
    with pytest.raises(WeightStoreError, match=r"v000001/model.safetensors: checksum mismatch"):
        store.load(1, _params())


def test_waiting_for_an_unpublished_version_is_bounded(root):
    store = WeightStore(root)
    store.publish(0, _params())
    started = time.monotonic()
    with pytest.raises(WeightStoreError, match=r"version 5 not published after 0.5 s \(newest: 0\)"):
        store.wait_for(5, timeout=0.5, poll=0.1)
    assert time.monotonic() - started < 5


def test_missing_bucket_is_a_clear_error(gcs_emulator):
    store = WeightStore("gs://no-such-bucket/run/weights")
    with pytest.raises(WeightStoreError, match="no-such-bucket"):
        store.publish(0, _params())
