"""deployments/kubernetes/: the Prefect Kubernetes work pool's base job template for a TPU slice.

It cannot run here (no cluster, no TPU). Neither the `kubernetes` client nor prefect-kubernetes is
installed, so the rendered Job is checked against the batch/v1 Job schema written out below from
the Kubernetes API reference (the fields it uses, their types, the required ones, no unknown ones)
and against the Job API's rules between fields; Prefect's own templating renders it. The shell
line each pod runs is executed with stand-ins for `prefect` and `spotrl`.
"""

import json
import os
import re
import subprocess
from pathlib import Path

import jsonschema
import yaml
from prefect.utilities.templating import apply_values, find_placeholders

DEPLOYMENTS = Path(__file__).resolve().parents[2] / "deployments" / "kubernetes"
TEMPLATE = json.loads((DEPLOYMENTS / "tpu-slice-job-template.json").read_text())
SERVICE = yaml.safe_load((DEPLOYMENTS / "trainer-service.yaml").read_text())

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
QUANTITY = {"oneOf": [{"type": "string", "pattern": r"^[0-9.]+([KMGTPE]i?|m)?$"}, {"type": "integer"}]}


def _object(properties: dict, required=()) -> dict:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


# io.k8s.api.batch.v1.Job and what it contains, as far as the template uses it (field names and
# types from the API reference, kubernetes.io/docs/reference/kubernetes-api/workload-resources/job-v1)
ENV_VAR = _object(
    {
        "name": {"type": "string", "minLength": 1},
        "value": {"type": "string"},  # the API refuses a number here
        "valueFrom": _object(
            {
                "fieldRef": _object({"fieldPath": {"type": "string"}, "apiVersion": {"type": "string"}}, ["fieldPath"]),
                "secretKeyRef": _object({"name": {"type": "string"}, "key": {"type": "string"}}, ["key"]),
                "configMapKeyRef": _object({"name": {"type": "string"}, "key": {"type": "string"}}, ["key"]),
            }
        ),
    },
    ["name"],
)
CONTAINER = _object(
    {
        "name": {"type": "string", "pattern": DNS_LABEL},
        "image": {"type": "string", "minLength": 1},
        "imagePullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
        "command": {"type": "array", "items": {"type": "string"}},
        "args": {"type": "array", "items": {"type": "string"}},
        "env": {"type": "array", "items": ENV_VAR},
        "ports": {
            "type": "array",
            "items": _object(
                {
                    "name": {"type": "string", "maxLength": 15},
                    "containerPort": {"type": "integer", "minimum": 1, "maximum": 65535},
                    "protocol": {"enum": ["TCP", "UDP", "SCTP"]},
                },
                ["containerPort"],
            ),
        },
        "resources": _object(
            {
                "requests": {"type": "object", "additionalProperties": QUANTITY},
                "limits": {"type": "object", "additionalProperties": QUANTITY},
            }
        ),
    },
    ["name"],
)
OBJECT_META = _object(
    {
        "name": {"type": "string"},
        "generateName": {"type": "string"},
        "namespace": {"type": "string", "pattern": DNS_LABEL},
        "labels": STRING_MAP,
        "annotations": STRING_MAP,
    }
)
POD_SPEC = _object(
    {
        "containers": {"type": "array", "minItems": 1, "items": CONTAINER},
        "restartPolicy": {"enum": ["Never", "OnFailure"]},  # a Job's pods may not use Always
        "subdomain": {"type": "string", "pattern": DNS_LABEL},
        "serviceAccountName": {"type": "string"},
        "nodeSelector": STRING_MAP,
        "terminationGracePeriodSeconds": {"type": "integer", "minimum": 0},
    },
    ["containers"],
)
JOB = _object(
    {
        "apiVersion": {"const": "batch/v1"},
        "kind": {"const": "Job"},
        "metadata": OBJECT_META,
        "spec": _object(
            {
                "completionMode": {"enum": ["NonIndexed", "Indexed"]},
                "completions": {"type": "integer", "minimum": 0},
                "parallelism": {"type": "integer", "minimum": 0},
                "backoffLimit": {"type": "integer", "minimum": 0},
                "ttlSecondsAfterFinished": {"type": "integer", "minimum": 0},
                "template": _object({"metadata": OBJECT_META, "spec": POD_SPEC}, ["spec"]),
            },
            ["template"],
        ),
    },
    ["apiVersion", "kind", "metadata", "spec"],
)


def _defaults() -> dict:
    return {k: v["default"] for k, v in TEMPLATE["variables"]["properties"].items() if "default" in v}


def _rendered(**values) -> dict:
    """The job configuration as Prefect's worker renders it from the work pool's variables."""
    given = {**_defaults(), "name": "spotrl-run", "image": "us-docker.pkg.dev/p/r/spotrl:1", **values}
    return apply_values(TEMPLATE["job_configuration"], given)


def test_variables_are_a_json_schema_and_cover_every_placeholder():
    jsonschema.Draft7Validator.check_schema(TEMPLATE["variables"])
    used = {p.name for p in find_placeholders(TEMPLATE["job_configuration"])}
    declared = set(TEMPLATE["variables"]["properties"])
    assert used <= declared, used - declared
    assert all("description" in v for v in TEMPLATE["variables"]["properties"].values())


def test_the_rendered_job_is_a_valid_indexed_job_over_every_host():
    manifest = _rendered(hosts=4, namespace="rl")["job_manifest"]
    jsonschema.validate(manifest, JOB)
    spec = manifest["spec"]
    # the Job API: Indexed needs completions; a slice needs all its hosts at once, and one failure ends the run
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 4
    assert spec["backoffLimit"] == 0
    assert manifest["metadata"]["namespace"] == "rl"
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"]["google.com/tpu"] == 4  # chips_per_host, rendered as a number
    assert pod["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "2x2x2"


def test_every_host_finds_process_0_through_the_headless_service():
    pod = _rendered()["job_manifest"]["spec"]["template"]
    container = pod["spec"]["containers"][0]
    env = [e["name"] for e in container["env"]]
    address = next(e["value"] for e in container["env"] if e["name"] == "SPOTRL_COORDINATOR_ADDRESS")
    # $(JOB_NAME) expands only from a variable defined earlier in the list
    assert env.index("JOB_NAME") < env.index("SPOTRL_COORDINATOR_ADDRESS")
    host, port = re.fullmatch(r"\$\(JOB_NAME\)-0\.([a-z0-9-]+):(\d+)", address).groups()
    assert host == pod["spec"]["subdomain"] == SERVICE["metadata"]["name"]
    assert SERVICE["kind"] == "Service" and SERVICE["spec"]["clusterIP"] == "None"  # headless: per-pod DNS names
    assert SERVICE["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert int(port) == container["ports"][0]["containerPort"] == SERVICE["spec"]["ports"][0]["port"]


def test_pod_0_runs_the_flow_run_and_the_others_follow(tmp_path):
    """The container's shell line, run with stand-ins for `prefect` and `spotrl` that print their arguments."""
    for tool in ("prefect", "spotrl"):
        stub = tmp_path / tool
        stub.write_text(f'#!/bin/sh\necho "{tool} $* with $SPOTRL_NUM_PROCESSES processes"\n')
        stub.chmod(0o755)
    container = _rendered(hosts=2)["job_manifest"]["spec"]["template"]["spec"]["containers"][0]
    ran = {}
    for index in ("0", "1"):
        env = {"PATH": f"{tmp_path}:{os.environ['PATH']}", "JOB_COMPLETION_INDEX": index}
        out = subprocess.run([*container["command"], *container["args"]], env=env, capture_output=True, text=True)
        ran[index] = out.stdout.strip()
    assert ran == {"0": "prefect flow-run execute with 2 processes", "1": "spotrl follow with 2 processes"}
