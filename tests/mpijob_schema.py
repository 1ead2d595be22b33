"""What the Kubeflow MPI Operator accepts as a kubeflow.org/v2beta1 MPIJob: the facts the
tests check launch/k8s/mpijob.yaml against (no Kubernetes distribution in Debian to apply it).

Vendored facts, not code, from github.com/kubeflow/mpi-operator at commit caa3c47fc42e:
- manifests/base/kubeflow.org_mpijobs.yaml (the CRD's openAPIV3Schema): the spec fields
  and their types, the replica spec (replicas int32, restartPolicy, template), runPolicy's
  fields, and of the pod template only the PodSpec fields this project's file uses (a
  field used later must have its schema fact added here, or the test names it);
- pkg/apis/kubeflow/v2beta1/default.go (defaults applied before validation) and
  pkg/apis/kubeflow/validation/validation.go (the operator's own checks): a Launcher
  with 1 replica, Worker replicas >= 1, restartPolicy Never or OnFailure, cleanPodPolicy
  None, Running or All, mpiImplementation OpenMPI, Intel or MPICH, and
  "<name>-worker-<replicas-1>" a DNS-1035 label.
Unknown fields are errors, as kubectl's default strict field validation makes them.
"""

from __future__ import annotations

import re

INT32 = {"type": "integer", "min": -2**31, "max": 2**31 - 1}
STRING = {"type": "string"}
STRINGS = {"type": "array", "items": STRING}
# resource.Quantity: int-or-string matching the CRD's pattern
QUANTITY = {"type": "quantity",
            "pattern": r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
                       r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"}


def obj(properties: dict, required: tuple = ()) -> dict:
    return {"type": "object", "properties": properties, "required": required}


CONTAINER = obj({
    "name": STRING, "image": STRING, "command": STRINGS, "args": STRINGS,
    "env": {"type": "array", "items": obj({"name": STRING, "value": STRING}, ("name",))},
    "resources": obj({"limits": {"type": "object", "values": QUANTITY},
                      "requests": {"type": "object", "values": QUANTITY}}),
    "volumeMounts": {"type": "array", "items": obj({"name": STRING, "mountPath": STRING,
                                                    "readOnly": {"type": "boolean"}},
                                                   ("mountPath", "name"))},
}, ("name",))
VOLUME = obj({"name": STRING,
              "persistentVolumeClaim": obj({"claimName": STRING, "readOnly": {"type": "boolean"}},
                                           ("claimName",)),
              "emptyDir": obj({"medium": STRING, "sizeLimit": QUANTITY})}, ("name",))
POD_TEMPLATE = obj({
    "metadata": obj({"labels": {"type": "object", "values": STRING},
                     "annotations": {"type": "object", "values": STRING}}),
    "spec": obj({"containers": {"type": "array", "items": CONTAINER},
                 "volumes": {"type": "array", "items": VOLUME}}, ("containers",)),
})
REPLICA_SPEC = obj({"replicas": INT32, "restartPolicy": STRING, "template": POD_TEMPLATE})
RUN_POLICY = obj({"activeDeadlineSeconds": {"type": "integer"}, "backoffLimit": INT32,
                  "cleanPodPolicy": STRING, "managedBy": STRING,
                  "suspend": {"type": "boolean"}, "ttlSecondsAfterFinished": INT32})
MPIJOB = obj({
    "apiVersion": STRING, "kind": STRING,
    "metadata": obj({"name": STRING, "namespace": STRING,
                     "labels": {"type": "object", "values": STRING}}),
    "spec": obj({
        "launcherCreationPolicy": STRING,
        "mpiImplementation": {"type": "string", "enum": ("OpenMPI", "Intel", "MPICH")},
        "mpiReplicaSpecs": {"type": "object", "values": REPLICA_SPEC},
        "runLauncherAsWorker": {"type": "boolean"},
        "runPolicy": RUN_POLICY,
        "slotsPerWorker": INT32,
        "sshAuthMountPath": STRING,
    }, ("mpiReplicaSpecs",)),
})

TYPES = {"string": str, "boolean": bool, "array": list, "object": dict}


def _type_errors(value, schema: dict, path: str) -> list[str]:
    kind = schema["type"]
    if kind == "integer":
        ok = isinstance(value, int) and not isinstance(value, bool)
        if ok and not schema.get("min", value) <= value <= schema.get("max", value):
            return [f"{path}: {value} is out of int32's range"]
    elif kind == "quantity":
        ok = (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, str) and re.fullmatch(schema["pattern"], value) is not None)
    else:
        ok = isinstance(value, TYPES[kind])
    if not ok:
        return [f"{path}: expected {kind}, got {value!r}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{path}: {value!r} is not one of {', '.join(schema['enum'])}"]
    return []


def schema_errors(value, schema: dict = MPIJOB, path: str = "") -> list[str]:
    """Every place `value` breaks `schema`, as 'path: why' lines."""
    errors = _type_errors(value, schema, path or "(top)")
    if errors:
        return errors
    if schema["type"] == "array":
        for k, item in enumerate(value):
            errors += schema_errors(item, schema["items"], f"{path}[{k}]")
    elif schema["type"] == "object" and "values" in schema:
        for key, item in value.items():
            errors += schema_errors(item, schema["values"], f"{path}.{key}")
    elif schema["type"] == "object":
        errors += [f"{path}.{key}: required" for key in schema["required"] if key not in value]
        for key, item in value.items():
            if key not in schema["properties"]:
                errors.append(f"{path}.{key}: unknown field")
            else:
                errors += schema_errors(item, schema["properties"][key], f"{path}.{key}")
    return errors


def operator_errors(job: dict) -> list[str]:
    """The MPI Operator's own checks (validation.go), after its defaults (default.go)."""
    spec = job["spec"]
    replicas = spec["mpiReplicaSpecs"]
    errors = []
    if set(replicas) - {"Launcher", "Worker"}:
        errors.append(f"spec.mpiReplicaSpecs: unknown replica types {sorted(set(replicas) - {'Launcher', 'Worker'})}")
    if "Launcher" not in replicas:
        errors.append("spec.mpiReplicaSpecs[Launcher]: required")
    for role, default_replicas, default_policy in (("Launcher", 1, "OnFailure"), ("Worker", 0, "Never")):
        if role not in replicas:
            continue
        count = replicas[role].get("replicas", default_replicas)
        if (role == "Launcher" and count != 1) or (role == "Worker" and count < 1):
            errors.append(f"spec.mpiReplicaSpecs[{role}].replicas: {count} is not allowed")
        policy = replicas[role].get("restartPolicy", default_policy)
        if policy not in ("Never", "OnFailure"):
            errors.append(f"spec.mpiReplicaSpecs[{role}].restartPolicy: {policy!r} is not Never or OnFailure")
        if not replicas[role]["template"]["spec"]["containers"]:
            errors.append(f"spec.mpiReplicaSpecs[{role}]: no container")
    policy = spec.get("runPolicy", {}).get("cleanPodPolicy", "None")
    if policy not in ("None", "Running", "All"):
        errors.append(f"spec.runPolicy.cleanPodPolicy: {policy!r} is not None, Running or All")
    if spec.get("slotsPerWorker", 1) < 0:
        errors.append("spec.slotsPerWorker: must be non-negative")
    last_worker = f"{job['metadata'].get('name', '')}-worker-{max(replicas.get('Worker', {}).get('replicas', 1), 1) - 1}"
    if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", last_worker):
        errors.append(f"metadata.name: the pod name {last_worker!r} is not a DNS-1035 label")
    return errors
