"""close_abandoned on a real (harness) server: what a SIGKILLed process left Running is marked
Crashed, a finished run is left alone, and the newest unfinished predecessor is reported."""

from prefect import flow, task
from prefect.client.orchestration import get_client
from prefect.states import Completed, Running

from spotrl.flows import crashes


@flow(name=crashes.FLOW_NAME)
def _train(run_dir: str, attempt: int = 1):  # only its name and parameters matter: runs are created by hand
    pass


@task(name="publish-i0001")
def _publish():
    pass


def _flow_run(client, run_dir: str, attempt: int, state):
    name = crashes.FLOW_RUN_NAME.format(run_dir=run_dir, attempt=attempt)
    return client.create_flow_run(_train, name=name, parameters={"run_dir": run_dir, "attempt": attempt}, state=state)


def test_runs_a_dead_process_left_running_are_marked_crashed_and_reported(prefect_harness, tmp_path):
    run_dir = str(tmp_path / "run")
    with get_client(sync_client=True) as client:
        done = _flow_run(client, run_dir, 1, Completed())
        dead = _flow_run(client, run_dir, 2, Running())
        publish = client.create_task_run(_publish, dead.id, dynamic_key="0", state=Running())
        finished = client.create_task_run(_publish, dead.id, dynamic_key="1", state=Completed())
        other_dir = _flow_run(client, str(tmp_path / "other"), 1, Running())
        current = _flow_run(client, run_dir, 3, Running())

        predecessor, closed = crashes.close_abandoned(run_dir, str(current.id))

        state = lambda read, id_: read(id_).state  # noqa: E731
        assert state(client.read_flow_run, dead.id).name == "Crashed"
        assert f"flow run {current.id} holds {run_dir}" in state(client.read_flow_run, dead.id).message
        assert state(client.read_task_run, publish.id).name == "Crashed"
        assert state(client.read_task_run, finished.id).name == "Completed"
        assert state(client.read_flow_run, done.id).name == "Completed"
        assert state(client.read_flow_run, other_dir.id).name == "Running"  # another directory's run is alive
        assert state(client.read_flow_run, current.id).name == "Running"
    assert closed == 2  # the flow run and its open task run
    assert predecessor is not None and predecessor.id == str(dead.id) and predecessor.state == "Crashed"
    assert predecessor.name == f"{run_dir} attempt 2"


def test_nothing_is_reported_after_a_completed_run(prefect_harness, tmp_path):
    run_dir = str(tmp_path / "run")
    with get_client(sync_client=True) as client:
        _flow_run(client, run_dir, 1, Completed())
        assert crashes.close_abandoned(run_dir, None) == (None, 0)
