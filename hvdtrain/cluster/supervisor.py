"""Inside the run's namespaces: build the cluster, run the command on h1, apply faults, end.

Started by `hvdtrain cluster` as PID 1 of a new PID namespace (unshare --pid --fork
--kill-child). PID 1 only reaps orphans and forwards signals; a child of it does the
work. When PID 1 exits, however it exits, the kernel kills every process left in the
namespace (sshd, workers, anything a worker started), and with the last of them go
the network namespaces, the bridge and every mount made here. So teardown needs no
list of what was made and cannot miss anything, even after a crash or a SIGKILL.

  python -m hvdtrain.cluster.supervisor SPEC_JSON
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time

from hvdtrain.cluster.emulated import STATE, EmulatedCluster
from hvdtrain.cluster.faults import Fault
from hvdtrain.cluster.slurm import SlurmDaemons
from hvdtrain.cluster.topology import Host
from hvdtrain.files import write_json
from hvdtrain.machine.share import SHARED_MACHINE

# After SIGINT/SIGTERM, the command gets this long to stop before everything is killed.
GRACE_SECONDS = 10.0
LAUNCHER = "h1"


def _exit_code(status: int) -> int:
    """A shell's convention: the exit status, or 128 + the signal that ended the process."""
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def reap_as_init(child: int) -> int:
    """PID 1's whole job: forward SIGINT/SIGTERM to `child`, reap every orphan, and return
    `child`'s exit code once it ends."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: os.kill(child, signum))
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 1
        except InterruptedError:
            continue
        if pid == child:
            return _exit_code(status)


# How often a when= fault looks for its file: often enough that a fault lands within a
# step or two of the event, rarely enough to cost nothing.
WATCH_SECONDS = 0.1


def _schedule(cluster: EmulatedCluster, faults: list[Fault], start: float) -> list[threading.Timer]:
    timers = []
    for fault in faults:
        if fault.when:
            continue
        timer = threading.Timer(max(0.0, start + fault.at - time.monotonic()), cluster.apply, [fault])
        timer.daemon = True
        timer.start()
        timers.append(timer)
    return timers


def _watch(cluster: EmulatedCluster, faults: list[Fault], done: threading.Event) -> None:
    """Apply each when= fault, once, as soon as its pattern matches a file; until `done`."""
    waiting = [fault for fault in faults if fault.when]
    while waiting and not done.wait(WATCH_SECONDS):
        for fault in [f for f in waiting if glob.glob(f.when)]:
            cluster.apply(fault)
            waiting.remove(fault)


def supervise(spec: dict) -> int:
    """Build the cluster, run the command on h1 with faults on schedule, return its exit code."""
    hosts = [Host(h["name"], h["address"], h["rate_bits"]) for h in spec["hosts"]]
    faults = [Fault(**f) for f in spec["faults"]]
    cluster = EmulatedCluster(hosts, spec["tools"], spec.get("image"))
    cluster.build()
    image = f" running {spec['image']['image']}" if spec.get("image") else ""
    print(f"hvdtrain cluster: {len(hosts)} hosts up ({', '.join(h.name for h in hosts)}){image}",
          file=sys.stderr, flush=True)
    if spec.get("slurm"):
        _start_slurm(spec["tools"], hosts, spec["slurm"]["slots"])
    before = _counters(cluster)
    print(f"hvdtrain cluster: running on {LAUNCHER}: {' '.join(spec['command'])}",
          file=sys.stderr, flush=True)
    # The hosts are one machine: workers size their share of it by the whole job's count
    # (horovodrun passes the variable on to every worker, over ssh too).
    os.environ[SHARED_MACHINE] = "1"
    command = cluster.launch(LAUNCHER, spec["command"])
    _forward_signals(command)
    timers = _schedule(cluster, faults, time.monotonic())
    done = threading.Event()
    threading.Thread(target=_watch, args=(cluster, faults, done), daemon=True).start()
    code = command.wait()
    done.set()
    for timer in timers:
        timer.cancel()
    if spec.get("nic_counters"):
        _write_counters(spec["nic_counters"], before, _counters(cluster))
    return code if code >= 0 else 128 - code


def _start_slurm(tools: dict[str, str], hosts: list[Host], slots: int) -> None:
    slurm = SlurmDaemons(tools, STATE)
    slurm.prepare(hosts, slots)
    slurm.start(hosts)
    print(f"hvdtrain cluster: Slurm up: slurmctld on {hosts[0].name}, {slots} slots on each of "
          f"{len(hosts)} nodes", file=sys.stderr, flush=True)


def _forward_signals(command) -> None:
    """SIGINT/SIGTERM/SIGHUP go to the command; if it has not ended GRACE_SECONDS later,
    this process exits, and with PID 1 everything in the namespaces ends."""
    def stop(signum, _frame):
        command.send_signal(signum)
        threading.Timer(GRACE_SECONDS, os._exit, [128 + signum]).start()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)


def _counters(cluster: EmulatedCluster) -> dict[str, dict[str, int]]:
    return {name: cluster.nic_bytes(name) for name in cluster.hosts}


def _write_counters(path: str, before: dict, after: dict) -> None:
    """Bytes each host's eth0 sent and received while the command ran."""
    delta = {name: {key: after[name][key] - before[name][key] for key in before[name]}
             for name in before}
    write_json(path, {"before": before, "after": after, "during": delta})


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    if os.getpid() == 1:
        child = os.fork()
        if child:
            return reap_as_init(child)
    try:
        return supervise(spec)
    except Exception as exc:  # one line; the namespaces end with us anyway
        print(f"hvdtrain cluster: error: {exc}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    # os._exit: no interpreter teardown in PID 1, whose exit ends everything else at once.
    os._exit(main(sys.argv[1:]))
