"""The job's other workers already running on this machine, and the memory each holds.

Read from /proc: a process's environment (what horovodrun gave it) says whose worker it
is (`machine_share.shares_the_machine`), and its status its own memory (RssAnon: what it
took of the machine's available memory; TensorFlow's libraries are shared file pages).
A worker that joins late, or an elastic host taken back, finds the others there with
their memory already held, which the host's available memory no longer includes.

Only processes this user may read are seen, and only in this PID namespace: the workers
of other containers (`hvdtrain cluster --image`) are not.
"""

from __future__ import annotations

import os
from typing import Mapping

from hvdtrain.machine.share import shares_the_machine


def environ_of(text: bytes) -> dict[str, str]:
    """/proc/PID/environ's bytes (NUL-separated NAME=value) as a dict."""
    pairs = (entry.decode(errors="replace").partition("=") for entry in text.split(b"\0") if entry)
    return {name: value for name, _, value in pairs}


def status_of(text: str) -> dict[str, str]:
    """/proc/PID/status's fields ("RssAnon:\t  263000 kB") by name."""
    return {name: value.strip() for name, _, value in
            (line.partition(":") for line in text.splitlines())}


def _read(proc: str, pid: str) -> tuple[dict[str, str], int, int] | None:
    """(environment, parent pid, RssAnon bytes) of a process, or None if it is gone or
    not ours to read."""
    try:
        with open(os.path.join(proc, pid, "environ"), "rb") as fh:
            environ = environ_of(fh.read())
        with open(os.path.join(proc, pid, "status"), encoding="ascii", errors="replace") as fh:
            status = status_of(fh.read())
    except OSError:
        return None
    held_kib = status.get("RssAnon", "0 kB").split()[0]
    return environ, int(status.get("PPid", "0")), int(held_kib) * 1024


def memory_held_by_peers(mine: Mapping[str, str], proc: str = "/proc",
                         me: int | None = None) -> list[int]:
    """Bytes held by each other worker of this one's MachineShare that already runs.

    A process of the share with another of them as its child (a shell script that runs
    the worker, this worker's own included) is a wrapper, not a worker: left out."""
    me = os.getpid() if me is None else me
    found: dict[int, tuple[int, int]] = {}
    for pid in filter(str.isdigit, os.listdir(proc)):
        read = _read(proc, pid)
        if read is not None and shares_the_machine(mine, read[0]):
            found[int(pid)] = read[1:]
    wrappers = {parent for parent, _ in found.values()}
    return [held for pid, (_, held) in sorted(found.items())
            if pid != me and pid not in wrappers]
