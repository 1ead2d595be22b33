"""Host lists for horovodrun: parse them from what a cluster gives, check them, format them.

Pure functions only (no network, no environment look-ups), so every rule here is
tested without a cluster; `launch/hostfile.py` is the command line around them and
`launch/hostcheck.py` the network check. Sources:

- a plain list: `node1`, `node1:4`, or hostfile lines `node1 slots=4`;
- a Slurm allocation: `SLURM_JOB_NODELIST` in Slurm's compressed syntax
  (`node[01-03,07]`, `gpu-[1-2],login1`, `rack[1-2]-n[01-02]`) with the slot count
  from `SLURM_NTASKS_PER_NODE`, `SLURM_GPUS_PER_NODE` (a worker per GPU) or
  `SLURM_TASKS_PER_NODE` (`4(x2),3`);
- AWS: the JSON of `aws ec2 describe-instances --output json`.

Every bad input raises HostError with one line that names the offending value.
"""

from __future__ import annotations

import dataclasses
import json
import re
# typing, not collections.abc: launch/hostfile.py runs on a cluster's system python3 (3.7+).
from typing import Iterable, Mapping

from hvdtrain.errors import HvdtrainError


class HostError(HvdtrainError):
    """A host list, node list or slot count that cannot be used."""

    exit_code = 2


@dataclasses.dataclass(frozen=True)
class Host:
    name: str
    slots: int


# RFC 1123 labels plus dots (IPv4 addresses, FQDNs) and underscores (some clusters use them).
# A colon is left out on purpose: horovodrun's -H uses it to separate the slot count.
_HOST_NAME = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?$")

# GPUs per instance for the AWS types the guide covers; one worker per GPU is the default.
GPUS_PER_INSTANCE_TYPE = {
    "p3.2xlarge": 1,
    "p3.8xlarge": 4,
    "p3.16xlarge": 8,
    "p3dn.24xlarge": 8,
    "p4d.24xlarge": 8,
    "p4de.24xlarge": 8,
    "p5.48xlarge": 8,
    "p5e.48xlarge": 8,
    "p5en.48xlarge": 8,
}


def positive_slots(value, what: str) -> int:
    """`value` as a slot count > 0; `what` names it in the error ("--slots", "host 'n1'")."""
    text = str(value).strip()
    if not re.fullmatch(r"[+-]?\d+", text):
        raise HostError(f"{what}: slots must be a positive integer, got {text!r}")
    slots = int(text)
    if slots <= 0:
        raise HostError(f"{what}: slots must be a positive integer, got {slots}")
    return slots


def _check_name(name: str, context: str) -> str:
    if not _HOST_NAME.match(name):
        raise HostError(f"invalid host name {name!r} in {context!r}")
    return name


# --- Slurm node lists ---

def _split_top_level(spec: str) -> list[str]:
    """Split at the commas that are not inside brackets; brackets must pair up."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(spec):
        if char == "[":
            if depth:
                raise HostError(f"malformed node list {spec!r}: nested '['")
            depth = 1
        elif char == "]":
            if not depth:
                raise HostError(f"malformed node list {spec!r}: ']' without '['")
            depth = 0
        elif char == "," and not depth:
            items.append(spec[start:i])
            start = i + 1
    if depth:
        raise HostError(f"malformed node list {spec!r}: '[' is never closed")
    items.append(spec[start:])
    return items


def _expand_ranges(group: str, spec: str) -> list[str]:
    """`01-03,07` -> 01 02 03 07; the lower bound's width is kept, as Slurm does."""
    values = []
    for part in group.split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not match:
            raise HostError(f"malformed node list {spec!r}: bad range {part!r} in [{group}]")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise HostError(f"malformed node list {spec!r}: range {part!r} runs backwards")
        width = len(low)
        values += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
    return values


def expand_nodelist(spec: str) -> list[str]:
    """Slurm's compressed node list as host names, in order.

    `node[01-03,07]` -> node01 node02 node03 node07; several bracket groups in one
    name expand to every combination (`r[1-2]-n[1-2]` -> r1-n1 r1-n2 r2-n1 r2-n2).
    """
    spec = spec.strip()
    if not spec:
        raise HostError("empty node list")
    names: list[str] = []
    for item in _split_top_level(spec):
        if not item:
            raise HostError(f"malformed node list {spec!r}: empty entry between commas")
        # Alternating literal text and bracket groups: ['r', '1-2', '-n', '1-2', ''].
        pieces = re.split(r"\[([^\]]*)\]", item)
        expanded = [""]
        for index, piece in enumerate(pieces):
            if index % 2 == 0:
                expanded = [prefix + piece for prefix in expanded]
            else:
                if not piece:
                    raise HostError(f"malformed node list {spec!r}: empty brackets in {item!r}")
                expanded = [prefix + value for prefix in expanded
                            for value in _expand_ranges(piece, spec)]
        names += [_check_name(name, spec) for name in expanded]
    return names


def expand_tasks_per_node(spec: str) -> list[int]:
    """Slurm's SLURM_TASKS_PER_NODE, `4(x2),3` -> [4, 4, 3]."""
    counts: list[int] = []
    for part in spec.strip().split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            raise HostError(f"malformed SLURM_TASKS_PER_NODE {spec!r}: bad entry {part!r}")
        slots = positive_slots(match.group(1), f"SLURM_TASKS_PER_NODE {spec!r}")
        counts += [slots] * int(match.group(2) or 1)
    return counts


def slurm_hosts(nodelist: str, slots: int | None = None, ntasks_per_node: str | None = None,
                tasks_per_node: str | None = None, gpus_per_node: str | None = None,
                ntasks: str | None = None, gpus_on_node: str | None = None,
                gpus: str | None = None) -> list[Host]:
    """Hosts of a Slurm allocation.

    Slots come from `slots` (the --slots option) if given, else SLURM_NTASKS_PER_NODE
    (one number for every node), else, for a job that asked GPUs but no task count
    (SLURM_NTASKS unset), one per GPU (`gpus_a_node`), else SLURM_TASKS_PER_NODE (one
    count per node).

    The GPU rule is there because an --exclusive job that asks no task count gets a
    task per CPU in SLURM_TASKS_PER_NODE, which on a GPU node (96 CPUs, 8 GPUs) would
    be 96 workers sharing 8 devices; on a CPU node it is one worker per CPU.
    """
    names = expand_nodelist(nodelist)
    if slots is not None:
        counts = [positive_slots(slots, "--slots")] * len(names)
    elif ntasks_per_node:
        counts = [positive_slots(ntasks_per_node, "SLURM_NTASKS_PER_NODE")] * len(names)
    elif asked_gpus(gpus_per_node, gpus_on_node) and not ntasks:
        counts = [gpus_a_node(len(names), gpus_per_node, gpus_on_node, gpus)] * len(names)
    elif tasks_per_node:
        counts = expand_tasks_per_node(tasks_per_node)
        if len(counts) != len(names):
            raise HostError(f"SLURM_TASKS_PER_NODE {tasks_per_node!r} describes {len(counts)} "
                            f"nodes but the node list {nodelist!r} has {len(names)}")
    else:
        raise HostError("no slot count: pass --slots, or set SLURM_NTASKS_PER_NODE "
                        "(sbatch --ntasks-per-node)")
    return validate([Host(name, count) for name, count in zip(names, counts)])


def asked_gpus(gpus_per_node: str | None, gpus_on_node: str | None) -> bool:
    """Whether the job has GPUs: SLURM_GPUS_PER_NODE (--gpus-per-node), or
    SLURM_GPUS_ON_NODE, which Slurm sets however they were asked (--gres=gpu:8 and
    --gpus=16 set no SLURM_GPUS_PER_NODE); 0 is none."""
    return bool(gpus_per_node) or (gpus_on_node or "0").strip() not in ("", "0")


def gpus_a_node(nodes: int, gpus_per_node: str | None, gpus_on_node: str | None,
                gpus: str | None) -> int:
    """The GPUs of each node: SLURM_GPUS_PER_NODE, else SLURM_GPUS_ON_NODE. The latter
    counts the node the batch script runs on only, so it is taken for every node once
    SLURM_GPUS (--gpus, the job's total), if set, says the nodes have as many each:
    --gpus=12 on two 8-GPU nodes may give them 8 and 4."""
    if gpus_per_node:
        return gpu_count(gpus_per_node)
    on_node = positive_slots(gpus_on_node, "SLURM_GPUS_ON_NODE")
    if gpus and gpu_count(gpus, "SLURM_GPUS") != on_node * nodes:
        raise HostError(f"SLURM_GPUS {gpus!r} is not SLURM_GPUS_ON_NODE {gpus_on_node!r} on "
                        f"each of the {nodes} nodes: ask GPUs with --gpus-per-node, or pass "
                        f"--slots")
    return on_node


def gpu_count(spec: str, name: str = "SLURM_GPUS_PER_NODE") -> int:
    """SLURM_GPUS_PER_NODE (or SLURM_GPUS, `name`), as sbatch --gpus-per-node takes it
    (`8`, `a100:8`, `a100:4,v100:4`) -> the GPUs of every type together."""
    total = 0
    for part in spec.strip().split(","):
        match = re.fullmatch(r"(?:[^:,\s]+:)?(\d+)", part.strip())
        if not match:
            raise HostError(f"malformed {name} {spec!r}: bad entry {part!r}")
        total += int(match.group(1))
    return positive_slots(total, f"{name} {spec!r}")


# --- plain lists and hostfiles ---

# Slurm node states (sinfo %t) in which a node of a running job can take workers: not
# down, drained or draining, failing, completing, or not responding (a '*' suffix).
USABLE_SLURM_STATES = ("alloc", "mix", "idle")


def slurm_node_states(sinfo_output: str) -> dict[str, str]:
    """`sinfo -h -N -o '%N %t'` -> {node: short state}; a node in two partitions counts once."""
    states = {}
    for line in sinfo_output.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
    return states


def usable_slurm_hosts(hosts: list[Host], sinfo_output: str) -> list[Host]:
    """The hosts whose node Slurm reports usable, in their order."""
    states = slurm_node_states(sinfo_output)
    return [h for h in hosts if states.get(h.name) in USABLE_SLURM_STATES]


def parse_host_entries(lines: Iterable[str], default_slots: int | None = None) -> list[Host]:
    """Hosts from `node1`, `node1:4`, `a,b c` or hostfile lines `node1 slots=4`.

    `#` starts a comment. A host without a count gets `default_slots` (1 if None).
    """
    default = 1 if default_slots is None else positive_slots(default_slots, "--slots")
    hosts = []
    for raw in lines:
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        hostfile_line = re.fullmatch(r"(\S+)\s+slots\s*=\s*(\S+)", line)
        if hostfile_line:
            name, count = hostfile_line.groups()
            hosts.append(Host(_check_name(name, line),
                              positive_slots(count, f"host {name!r}")))
            continue
        if "=" in line:
            raise HostError(f"malformed host line {line!r}: expected 'host slots=N'")
        for token in re.split(r"[,\s]+", line):
            name, sep, count = token.partition(":")
            _check_name(name, token)
            hosts.append(Host(name, positive_slots(count, f"host {name!r}") if sep else default))
    return validate(hosts)


def validate(hosts: list[Host]) -> list[Host]:
    """The list itself if it can be launched on: not empty, slots > 0, no host twice."""
    if not hosts:
        raise HostError("no hosts given")
    seen: dict[str, int] = {}
    for host in hosts:
        positive_slots(host.slots, f"host {host.name!r}")
        key = host.name.lower()  # DNS names are case-insensitive
        seen[key] = seen.get(key, 0) + 1
    for host in hosts:
        count = seen[host.name.lower()]
        if count > 1:
            raise HostError(f"duplicate host {host.name!r} (listed {count} times)")
    return hosts


# --- AWS ---

def parallelcluster_filters(cluster: str, queue: str | None = None) -> dict[str, str]:
    """The tags AWS ParallelCluster 3 puts on the compute nodes of `cluster`."""
    tags = {"parallelcluster:cluster-name": cluster, "parallelcluster:node-type": "Compute"}
    if queue:
        tags["parallelcluster:queue-name"] = queue
    return tags


def describe_instances_command(tags: Mapping[str, str], region: str | None = None) -> list[str]:
    """`aws ec2 describe-instances` for the running instances carrying every tag."""
    if not tags:
        raise HostError("no instance filter: give --tag KEY=VALUE or --cluster NAME")
    command = ["aws", "ec2", "describe-instances", "--output", "json", "--filters",
               "Name=instance-state-name,Values=running"]
    command += [f"Name=tag:{key},Values={value}" for key, value in tags.items()]
    if region:
        command += ["--region", region]
    return command


def parse_tag(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key or not value:
        raise HostError(f"malformed tag {text!r}: expected KEY=VALUE")
    return key, value


ADDRESS_FIELDS = {"private-ip": "PrivateIpAddress", "private-dns": "PrivateDnsName"}


def ec2_hosts(describe_output: str | Mapping, slots: int | None = None,
              address: str = "private-ip") -> list[Host]:
    """Hosts from `aws ec2 describe-instances --output json`, running instances only.

    Each instance gets `slots` workers, or one per GPU of its instance type. They are
    sorted by address so that the same fleet always gives the same rank order.
    """
    if address not in ADDRESS_FIELDS:
        raise HostError(f"unknown address kind {address!r}: use one of {sorted(ADDRESS_FIELDS)}")
    if isinstance(describe_output, str):
        try:
            describe_output = json.loads(describe_output)
        except json.JSONDecodeError as exc:
            raise HostError(f"describe-instances output is not JSON: {exc}") from None
    if not isinstance(describe_output, Mapping) or "Reservations" not in describe_output:
        raise HostError("describe-instances output has no 'Reservations' list")
    field = ADDRESS_FIELDS[address]
    fixed = None if slots is None else positive_slots(slots, "--slots")
    found = []
    for reservation in describe_output["Reservations"]:
        for instance in reservation.get("Instances", []):
            if instance.get("State", {}).get("Name", "running") != "running":
                continue
            instance_id = instance.get("InstanceId", "?")
            name = instance.get(field)
            if not name:
                raise HostError(f"instance {instance_id} has no {field}")
            count = fixed
            if count is None:
                kind = instance.get("InstanceType", "?")
                if kind not in GPUS_PER_INSTANCE_TYPE:
                    raise HostError(f"instance {instance_id} is a {kind}, whose GPU count is "
                                    f"not known here: pass --slots")
                count = GPUS_PER_INSTANCE_TYPE[kind]
            found.append(Host(_check_name(name, instance_id), count))
    if not found:
        raise HostError("no running instances matched")
    return validate(sorted(found, key=lambda h: _address_key(h.name)))


def _address_key(name: str):
    """IPv4 addresses in numeric order (10.0.0.9 before 10.0.0.10), names after them."""
    parts = name.split(".")
    if len(parts) == 4 and all(p.isdigit() for p in parts):
        return (0, tuple(int(p) for p in parts), "")
    return (1, (), name)


# --- output ---

def format_hostfile(hosts: list[Host]) -> str:
    """horovodrun's and Open MPI's hostfile: one `host slots=N` line per host."""
    return "".join(f"{h.name} slots={h.slots}\n" for h in hosts)


def format_host_arg(hosts: list[Host]) -> str:
    """The value of horovodrun -H: `host:N,host:N`."""
    return ",".join(f"{h.name}:{h.slots}" for h in hosts)


def format_discovery(hosts: list[Host]) -> str:
    """What a Horovod elastic host-discovery script prints: one `host:N` line per host."""
    return "".join(f"{h.name}:{h.slots}\n" for h in hosts)


def total_slots(hosts: list[Host]) -> int:
    return sum(h.slots for h in hosts)
