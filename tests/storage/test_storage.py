import jax.numpy as jnp
import numpy as np
import optax
import pytest

from spotrl.storage.atomic import sha256_file
from spotrl.storage.checkpoints import CheckpointError, CheckpointStore
from spotrl.storage.weights import WeightStore, WeightStoreError


def _params(scale=1.0):
    return {
        "embed": {"embedding": np.full((4, 3), scale, np.float32)},
        "layers": {0: {"w": np.arange(6, dtype=np.float32).reshape(2, 3) * scale}},
    }


def test_publish_load_latest_and_digest(tmp_path):
    store = WeightStore(tmp_path, keep=2)
    assert store.latest() is None
    m1 = store.publish(1, _params(1.0))
    store.publish(2, _params(2.0))
    assert store.latest() == 2
    assert store.digest(1) == m1["sha256"] == sha256_file(tmp_path / "v000001" / "model.safetensors")
    loaded = store.load(None, _params())
    np.testing.assert_array_equal(loaded["layers"][0]["w"], _params(2.0)["layers"][0]["w"])
    assert list(loaded["layers"]) == [0]  # key types follow the template


def test_publish_is_idempotent_and_latest_never_moves_back(tmp_path):
    store = WeightStore(tmp_path)
    store.publish(3, _params(3.0))
    first = store.digest(3)
    store.publish(3, _params(9.0))  # a re-run of a finished publish changes nothing
    assert store.digest(3) == first
    store.publish(2, _params(2.0))
    assert store.latest() == 3


def test_retention_keeps_newest(tmp_path):
    store = WeightStore(tmp_path, keep=2)
    for v in range(5):
        store.publish(v, _params(float(v)))
    assert store.versions() == [3, 4]


def test_incomplete_version_is_invisible_and_replaced(tmp_path):
    store = WeightStore(tmp_path)
    (tmp_path / "v000001").mkdir(parents=True)
    (tmp_path / "v000001" / "model.safetensors").write_bytes(b"partial")  # killed before its manifest
    assert store.versions() == []
    store.publish(1, _params())
    assert store.latest() == 1 and store.load(1, _params())["embed"]["embedding"].shape == (4, 3)


def test_corrupt_version_is_refused_naming_the_file(tmp_path):
    store = WeightStore(tmp_path)
    store.publish(1, _params())
    path = tmp_path / "v000001" / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(WeightStoreError, match="v000001/model.safetensors: checksum mismatch"):
        store.load(1, _params())


def test_shape_mismatch_names_tensor(tmp_path):
    store = WeightStore(tmp_path)
    store.publish(1, _params())
    template = _params()
    template["embed"]["embedding"] = np.zeros((5, 3), np.float32)
    with pytest.raises(ValueError, match="embed.embedding"):
        store.load(1, template)


def _state():
    params = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}
    tx = optax.adamw(1e-3)
    opt = tx.init(params)
    _, opt = tx.update(params, opt, params)  # a non-trivial optimizer state
    return {"params": params, "opt_state": opt}


@pytest.mark.parametrize("packed", [True, False])
def test_a_checkpoint_restores_bit_for_bit_in_either_layout(tmp_path, monkeypatch, packed):
    import jax

    from spotrl.storage import checkpoints

    if not packed:  # a state past the limit keeps one array per leaf: the layout of sharded states too
        monkeypatch.setattr(checkpoints, "PACK_BELOW_BYTES", 0)
    state = _state()
    state["extra"] = {"half": jnp.linspace(-1, 1, 7, dtype=jnp.bfloat16), "steps": jnp.arange(3, dtype=jnp.int32)}
    store = CheckpointStore(tmp_path)
    store.save(1, state, {"iteration": 1})
    store.seal(1)
    assert {p.name for p in store.path(1).iterdir()} >= {"packed" if packed else "state", "meta"}
    assert not (store.path(1) / ("state" if packed else "packed")).exists()
    monkeypatch.undo()  # the reader follows the directory, whatever the limit is now
    restored, meta = CheckpointStore(tmp_path).restore(1, state)  # a new store: as a resumed process reads it
    assert meta == {"iteration": 1}
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored)):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert jax.tree.structure(restored) == jax.tree.structure(state)


def test_a_packed_checkpoint_of_another_shape_is_refused(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(1, _state(), {"iteration": 1})
    store.seal(1)
    other = _state()
    other["params"]["b"] = jnp.ones(4)
    with pytest.raises(CheckpointError, match=r"iter_000001: holds .* values per dtype"):
        CheckpointStore(tmp_path).restore(1, other)


def test_a_background_save_copies_the_state_at_once_and_commits_before_its_seal(tmp_path):
    import jax

    store = CheckpointStore(tmp_path)
    state = jax.tree.map(jnp.asarray, _state())
    expected = jax.tree.map(np.array, state)
    store.save(1, state, {"iteration": 1}, background=True)
    for leaf in jax.tree.leaves(state):
        leaf.delete()  # as the next train step does by donating them: the save holds its own host copy
    store.seal(1)  # waits for the write
    assert store.committed(1) and store.sealed_iterations() == [1]
    restored, meta = CheckpointStore(tmp_path).restore(1, expected)
    assert meta == {"iteration": 1}
    for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(restored)):
        np.testing.assert_array_equal(a, np.asarray(b))


def test_a_failed_background_save_raises_on_wait_commits_nothing_and_the_next_wait_writes_again(tmp_path):
    store = CheckpointStore(tmp_path)
    metadata = {"iteration": 2, "unwritable": object()}  # JSON cannot hold it: the write fails
    store.save(2, _state(), metadata, background=True)
    with pytest.raises(TypeError, match="not JSON serializable"):
        store.wait(2)
    assert not store.committed(2)
    with pytest.raises(CheckpointError, match="not sealed"):
        store.restore(2, _state())
    del metadata["unwritable"]  # the cause goes away, as a transient one would
    store.wait(2)  # the retry writes again, in the waiting thread
    assert store.committed(2)
    store.seal(2)
    assert CheckpointStore(tmp_path).restore(2, _state())[1] == {"iteration": 2}


def test_checkpoint_roundtrip_seal_and_prune_keeping_the_warm_start(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    state = _state()
    for it in range(4):
        store.save(it, state, {"iteration": it, "data_cursor": 8 * it})
        store.seal(it)
        store.prune()
    assert store.sealed_iterations() == [0, 2, 3]  # the newest two, and the warm start (iteration 0)
    assert not store.path(1).exists() and not store.seal_path(1).exists()
    store.restore(0, state)  # still whole
    restored, meta = store.restore(3, state)
    assert meta == {"iteration": 3, "data_cursor": 24}
    for a, b in zip(*(map(np.asarray, __import__("jax").tree.leaves(t)) for t in (state, restored))):
        np.testing.assert_array_equal(a, b)
    assert type(restored["opt_state"]) is type(state["opt_state"])


def test_unsealed_or_corrupt_checkpoint_is_not_restored(tmp_path):
    store = CheckpointStore(tmp_path)
    state = _state()
    store.save(1, state, {"iteration": 1})
    assert store.sealed_iterations() == []
    with pytest.raises(CheckpointError, match="not sealed"):
        store.restore(1, state)
    store.seal(1)
    victim = max((p for p in (tmp_path / "iter_000001").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    with open(victim, "r+b") as f:
        f.truncate(victim.stat().st_size // 2)
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        store.restore(1, state)


@pytest.mark.parametrize("text", [b"", b"seven\n", b"\xff\xfe3\n", b"  \n"])
def test_a_garbage_or_empty_latest_is_treated_as_missing(tmp_path, text):
    store = WeightStore(tmp_path)
    for version in (1, 2):
        store.publish(version, _params(float(version)))
    (tmp_path / "LATEST").write_bytes(text)
    assert store.pointer() is None and store.pointer_damaged()
    assert store.latest() == 2  # the newest version on disk with a manifest
    np.testing.assert_array_equal(store.load(None, _params())["layers"][0]["w"], _params(2.0)["layers"][0]["w"])
    store.publish(3, _params(3.0))  # a publish repairs it
    assert (tmp_path / "LATEST").read_text() == "3\n" and not store.pointer_damaged()


@pytest.mark.parametrize("text", [b"{not json", b"\xff\xfe", b"[1, 2]", b'{"version": 1}'])
def test_a_garbage_weight_manifest_is_a_store_error_naming_it(tmp_path, text):
    store = WeightStore(tmp_path)
    store.publish(1, _params())
    (tmp_path / "v000001" / "manifest.json").write_bytes(text)
    with pytest.raises(WeightStoreError, match="damaged manifest: .*v000001/manifest.json"):
        store.verified_digest(1)


@pytest.mark.parametrize("text", [b"{not json", b"\xff\xfe", b"null", b'{"files": {}}', b'{"files": [], "sha256": ""}'])
def test_a_garbage_seal_is_a_checkpoint_error_naming_it(tmp_path, text):
    store = CheckpointStore(tmp_path)
    state = _state()
    store.save(1, state, {"iteration": 1})
    store.seal(1)
    store.seal_path(1).write_bytes(text)
    with pytest.raises(CheckpointError, match="damaged seal: .*iter_000001.sealed.json"):
        store.verify(1)
    with pytest.raises(CheckpointError, match="damaged seal"):
        store.restore(1, state)


def test_the_recorded_config_is_the_newest_checkpoints_that_records_one(tmp_path):
    store = CheckpointStore(tmp_path)
    state = _state()
    assert store.recorded_config() is None
    store.save(1, state, {"iteration": 1, "config": {"seed": 1}})
    store.save(2, state, {"iteration": 2})  # made before configs were recorded
    store.save(3, state, {"iteration": 3, "config": {"seed": 3}})  # never sealed: not a checkpoint yet
    for iteration in (1, 2):
        store.seal(iteration)
    assert store.recorded_config() == (1, {"seed": 1})
