"""Where a multi-process run's topology comes from (spotrl/distributed.py), without starting JAX's runtime."""

import pytest

from spotrl.distributed import DistributedError, Topology, topology_from_env


def test_one_process_unless_the_environment_says_otherwise():
    assert topology_from_env({}) is None
    assert topology_from_env({"SPOTRL_NUM_PROCESSES": "1"}) is None
    assert topology_from_env({"SPOTRL_DISTRIBUTED": "off"}) is None


def test_explicit_topology_and_the_indexed_job_fallback():
    env = {"SPOTRL_NUM_PROCESSES": "4", "SPOTRL_PROCESS_ID": "3", "SPOTRL_COORDINATOR_ADDRESS": "h0:8476"}
    assert topology_from_env(env) == Topology("h0:8476", 4, 3, 300)
    # a Kubernetes indexed Job gives each pod JOB_COMPLETION_INDEX; JAX's own variable names the coordinator
    job = {"SPOTRL_NUM_PROCESSES": "2", "JOB_COMPLETION_INDEX": "1", "JAX_COORDINATOR_ADDRESS": "j-0.svc:1"}
    assert topology_from_env({**job, "SPOTRL_DISTRIBUTED_TIMEOUT": "600"}) == Topology("j-0.svc:1", 2, 1, 600)


def test_auto_leaves_everything_to_jax_cluster_detection():
    assert topology_from_env({"SPOTRL_DISTRIBUTED": "auto"}) == Topology(None, None, None, 300)


@pytest.mark.parametrize(
    "env, named",
    [
        ({"SPOTRL_NUM_PROCESSES": "two"}, "SPOTRL_NUM_PROCESSES='two'"),
        ({"SPOTRL_NUM_PROCESSES": "2", "SPOTRL_PROCESS_ID": "0"}, "SPOTRL_COORDINATOR_ADDRESS"),
        ({"SPOTRL_NUM_PROCESSES": "2", "SPOTRL_COORDINATOR_ADDRESS": "h:1"}, "SPOTRL_PROCESS_ID"),
        ({"SPOTRL_NUM_PROCESSES": "2", "SPOTRL_COORDINATOR_ADDRESS": "h:1", "SPOTRL_PROCESS_ID": "2"}, "0..1"),
        ({"SPOTRL_DISTRIBUTED": "yes"}, "SPOTRL_DISTRIBUTED='yes'"),
    ],
)
def test_bad_environment_names_the_variable(env, named):
    with pytest.raises(DistributedError, match=named.replace(".", r"\.")):
        topology_from_env(env)


def test_follow_outside_a_multi_process_run_is_refused_with_what_to_set(capsys, monkeypatch):
    from spotrl.cli.main import main as cli_main

    for name in ("SPOTRL_NUM_PROCESSES", "SPOTRL_DISTRIBUTED"):
        monkeypatch.delenv(name, raising=False)
    assert cli_main(["follow"]) == 2
    assert "not a multi-process run (set SPOTRL_NUM_PROCESSES" in capsys.readouterr().err
