"""launch/k8s/mpijob.yaml against the MPI Operator's published v2beta1 schema and checks.

No Kubernetes distribution is in Debian's packages, so the file cannot be applied here;
these tests parse it and check it against the facts tests/mpijob_schema.py vendors
(with their source), and show that the check refuses what the operator would refuse.
"""

from __future__ import annotations

import copy
import os

import pytest
import yaml

from mpijob_schema import operator_errors, schema_errors

MPIJOB = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "launch", "k8s", "mpijob.yaml")


@pytest.fixture(scope="module")
def job() -> dict:
    with open(MPIJOB, encoding="utf-8") as fh:
        documents = list(yaml.safe_load_all(fh))
    assert len(documents) == 1
    return documents[0]


def test_the_mpijob_is_a_v2beta1_mpijob_that_the_crd_schema_and_the_operator_accept(job):
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v2beta1", "MPIJob")
    assert schema_errors(job) == []
    assert operator_errors(job) == []


def test_every_volume_mount_names_a_volume_of_its_pod_and_slots_match_the_gpus(job):
    for role, replica in job["spec"]["mpiReplicaSpecs"].items():
        pod = replica["template"]["spec"]
        volumes = {volume["name"] for volume in pod.get("volumes", [])}
        mounts = {m["name"] for c in pod["containers"] for m in c.get("volumeMounts", [])}
        assert mounts <= volumes, role
    worker = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert job["spec"]["slotsPerWorker"] == worker["resources"]["limits"]["nvidia.com/gpu"]


def _set(job: dict, path: str, value) -> dict:
    """A copy of `job` with the field at `path` (keys and list indexes joined by '|') set."""
    changed = copy.deepcopy(job)
    *parents, last = path.split("|")
    node = changed
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[last] = value
    return changed


@pytest.mark.parametrize("path, value, error", [
    ("spec|slotsPerNode", 8, "spec.slotsPerNode: unknown field"),
    ("spec|slotsPerWorker", "8", "spec.slotsPerWorker: expected integer"),
    ("spec|mpiImplementation", "MVAPICH", "spec.mpiImplementation: 'MVAPICH' is not one of"),
    ("spec|mpiReplicaSpecs|Worker|template|spec|containers|0|resources|limits|nvidia.com/gpu",
     "eight", "limits.nvidia.com/gpu: expected quantity"),
    ("spec|mpiReplicaSpecs|Worker|template|spec|containers|0|env", [{"value": "x"}],
     "env[0].name: required"),
])
def test_the_schema_check_refuses_a_field_the_crd_does_not_define_or_types_otherwise(job, path,
                                                                                        value, error):
    broken = _set(job, path, value)
    assert any(error in line for line in schema_errors(broken)), schema_errors(broken)


@pytest.mark.parametrize("path, value, error", [
    ("spec|mpiReplicaSpecs|Worker|restartPolicy", "Always", "Worker].restartPolicy: 'Always'"),
    ("spec|mpiReplicaSpecs|Launcher|replicas", 2, "Launcher].replicas: 2"),
    ("spec|mpiReplicaSpecs|Worker|replicas", 0, "Worker].replicas: 0"),
    ("spec|runPolicy|cleanPodPolicy", "Finished", "cleanPodPolicy: 'Finished'"),
    ("metadata|name", "HvdTrain", "metadata.name: the pod name 'HvdTrain-worker-1'"),
])
def test_the_operator_checks_refuse_what_its_validation_refuses(job, path, value, error):
    broken = _set(job, path, value)
    assert schema_errors(broken) == []
    assert any(error in line for line in operator_errors(broken)), operator_errors(broken)
