"""What a dead process left behind in Prefect's records, closed when a run resumes its directory.

A process killed mid-run (SIGKILL, a spot VM taken away, the OOM killer) cannot report its own end:
its flow run stays Running when nothing watched it (`spotrl train`), and the task run it was in stays
Running forever even when a worker marked the flow run Crashed. The UI then shows work in progress
that nobody does. The run lease (rundir.exclusive) makes this decidable: whoever holds it is the only
live process on the directory, so every other flow run of `train` on it that is not final, and every
task run of those that is not final, belongs to a dead process and is marked Crashed.
"""

from __future__ import annotations

from dataclasses import dataclass

FLOW_NAME = "train"
_OPEN = ["RUNNING", "PENDING", "CANCELLING"]
_SEARCHED = ["RUNNING", "PENDING", "CANCELLING", "CRASHED", "FAILED", "CANCELLED", "COMPLETED"]


@dataclass(frozen=True)
class Predecessor:
    """The newest earlier flow run on this run directory, when it did not complete."""

    id: str
    name: str
    state: str  # as it ended (after closing: Crashed for a run left Running)
    message: str


# the flow run's name, from its parameters: "runs/deployed attempt 2" (the run directory is the run's identity)
FLOW_RUN_NAME = "{run_dir} attempt {attempt}"


def close_abandoned(run_dir: str, current_flow_run_id: str | None) -> tuple[Predecessor | None, int]:
    """Mark Crashed what dead processes left open on `run_dir` (call with the run lease held).

    Returns the newest earlier flow run on the directory if it did not complete (else None), and how
    many flow and task runs were closed.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas import filters
    from prefect.client.schemas.sorting import FlowRunSort
    from prefect.states import Crashed

    closed = 0
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_filter=filters.FlowFilter(name=filters.FlowFilterName(any_=[FLOW_NAME])),
            flow_run_filter=filters.FlowRunFilter(
                name=filters.FlowRunFilterName(like_=run_dir),
                state=filters.FlowRunFilterState(type=filters.FlowRunFilterStateType(any_=_SEARCHED)),
            ),
            sort=FlowRunSort.START_TIME_DESC,
            limit=200,
        )
        mine = [r for r in runs if str(r.id) != str(current_flow_run_id) and r.parameters.get("run_dir") == run_dir]
        gone = f"its process is gone: flow run {{}} holds {run_dir} now"
        for run in mine:
            if run.state is not None and run.state.type.value in _OPEN:
                client.set_flow_run_state(run.id, Crashed(message=gone.format(current_flow_run_id)), force=True)
                closed += 1
        unfinished = [r.id for r in mine if r.state is None or not r.state.is_completed()]
        if unfinished:
            open_tasks = client.read_task_runs(
                task_run_filter=filters.TaskRunFilter(
                    flow_run_id=filters.TaskRunFilterFlowRunId(any_=unfinished),
                    state=filters.TaskRunFilterState(type=filters.TaskRunFilterStateType(any_=_OPEN)),
                ),
                limit=200,  # the most the API returns at once; a crash leaves a few open
            )
            for task_run in open_tasks:
                message = f"the process running it died (flow run {task_run.flow_run_id} did not finish)"
                client.set_task_run_state(task_run.id, Crashed(message=message), force=True)
                closed += 1
        newest = client.read_flow_run(mine[0].id) if mine else None
    if newest is None or newest.state is None or newest.state.is_completed():
        return None, closed
    return Predecessor(str(newest.id), newest.name, newest.state.name, newest.state.message or ""), closed
