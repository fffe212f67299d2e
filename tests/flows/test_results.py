"""Result storage for the stage tasks: a saved block per run directory (flows/results.py)."""

import pytest
from prefect import flow, task
from prefect.filesystems import LocalFileSystem

from spotrl.flows.results import RunResultStorage, result_storage


def test_keys_resolve_where_prefects_local_filesystem_puts_them(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")  # resolved once, at construction
    ours = RunResultStorage(basepath=str((tmp_path / "link" / "prefect-results").resolve()))
    prefects = LocalFileSystem(basepath=str(tmp_path / "link" / "prefect-results"))
    for key in ("0f3a9c", "sub/0f3a9c"):
        assert ours._resolve_path(key) == prefects._resolve_path(key)
    assert ours._resolve_path(None) == prefects._resolve_path(None)
    ours.write_path("0f3a9c", b"record")
    assert prefects.read_path("0f3a9c") == b"record"
    assert (tmp_path / "real" / "prefect-results" / "0f3a9c").read_bytes() == b"record"


@pytest.mark.parametrize("key", ["../escaped", "/etc/passwd", "a/../../escaped", "."])
def test_a_key_outside_the_directory_is_refused(tmp_path, key):
    storage = RunResultStorage(basepath=str(tmp_path / "prefect-results"))
    with pytest.raises(ValueError, match="outside of the base path"):
        storage.write_path(key, b"x")
    assert not (tmp_path / "escaped").exists()


calls = []


@task(persist_result=True, cache_key_fn=lambda context, parameters: f"double-{parameters['x']}")
def double(x: int) -> int:
    calls.append(x)
    return 2 * x


@pytest.mark.slow
def test_a_flow_persists_under_the_run_directory_and_reuses_the_result(prefect_harness, tmp_path):
    run = tmp_path / "run"
    storage = result_storage(run / "prefect-results")
    assert isinstance(storage, RunResultStorage) and storage._block_document_id is not None  # saved
    assert result_storage(run / "prefect-results")._block_document_id == storage._block_document_id

    @flow
    def twice() -> list[int]:
        doubled = double.with_options(result_storage=storage)
        return [doubled(21), doubled(21)]

    calls.clear()
    assert twice() == [42, 42]
    assert calls == [21]  # the second call was a cache hit, read back from the run directory
    assert [p.name for p in (run / "prefect-results").iterdir()] == ["double-21"]
    assert twice() == [42, 42] and calls == [21]  # a new flow run: still the cached result


@pytest.mark.slow
def test_flow_runs_starting_together_on_a_fresh_server_all_get_their_storage(prefect_harness, tmp_path):
    """Each registers the block type on its first save; the ones that lose that race retry (seen: a
    2-slot worker starting the two documented runs failed one with ObjectAlreadyExists)."""
    import threading

    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        try:
            block_type = client.read_block_type_by_slug(RunResultStorage._block_type_slug)
            for document in client.read_block_documents_by_type(block_type.slug):
                client.delete_block_document(document.id)
            client.delete_block_type(block_type.id)
        except Exception:  # noqa: BLE001 - not registered yet: the server is as fresh as it gets
            pass
    barrier, errors = threading.Barrier(6), []

    def start(i: int) -> None:
        barrier.wait()
        try:
            result_storage(tmp_path / f"run{i}" / "prefect-results")
        except Exception as err:  # noqa: BLE001 - collected and asserted below
            errors.append(err)

    threads = [threading.Thread(target=start, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
