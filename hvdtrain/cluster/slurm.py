"""Slurm on the emulated hosts: munged and slurmctld on h1, slurmd on every host (--slurm).

Everything Slurm reads or writes lives in the run's private tmpfs: the generated
slurm.conf is bind-mounted over /etc/slurm (so sbatch, squeue and the daemons find it
where they look on a real cluster), the munge key over /etc/munge, and munged's socket
is at its usual /run/munge, on the same tmpfs. One munged serves every host: the hosts
share the file system, so they share its socket too, as the nodes of a real cluster
share one key. Each slurmd runs in its host's network namespace with its hostname, so it
registers as that node; SlurmdParameters=config_overrides makes it offer the slots the
configuration names rather than this machine's cores.

The text and argument lists are pure functions (tests read them without root);
SlurmDaemons starts them and waits until every node is idle.
"""

from __future__ import annotations

import os
import subprocess
import time

from hvdtrain.cluster.nodes import on_host, sh
from hvdtrain.cluster.topology import Host
from hvdtrain.machine.hosts import slurm_node_states

CONTROLLER = "h1"
PARTITION = "hosts"
# The daemons' own files, under the run's state folder (a tmpfs of the run).
FOLDER = "slurm"
MUNGE_SOCKET_DIR = "/run/munge"
MUNGE_KEY_BYTES = 128  # what Debian's mungekey makes (1024 bits)

SLURM_CONF = """\
# Made by hvdtrain cluster --slurm for one run; lives in the run's private tmpfs.
ClusterName=hvdtrain
SlurmctldHost={controller}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation={state}/ctld
SlurmdSpoolDir={state}/%n
SlurmctldPidFile={state}/slurmctld.pid
SlurmdPidFile={state}/slurmd-%n.pid
# No log files: with -D the daemons write to stderr, which the run keeps beside them.
# No cgroups: the hosts are namespaces of one machine, and its cgroups are not ours.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# Every host offers the slots named here, whatever this machine's core count.
SlurmdParameters=config_overrides
# A node whose slurmd comes back (a host brought up again) returns to service.
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=10
{nodes}
PartitionName={partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""

# slurmd loads a cgroup plugin even when no other plugin uses it, and its autodetection
# fails on a hybrid layout (a tmpfs at /sys/fs/cgroup). Named, it only checks the mount;
# nothing here constrains or accounts by cgroup, so nothing is made in the machine's.
CGROUP_CONF = """\
CgroupPlugin=cgroup/v1
CgroupAutomount=no
"""


def slurm_conf(hosts: list[Host], slots: int, state: str) -> str:
    """slurm.conf for the run: h1 the controller, every host a node with `slots` CPUs."""
    nodes = "\n".join(f"NodeName={h.name} NodeAddr={h.address} CPUs={slots} State=UNKNOWN"
                      for h in hosts)
    return SLURM_CONF.format(controller=CONTROLLER, state=state, nodes=nodes,
                             partition=PARTITION)


def munged_command(munged: str, state: str) -> list[str]:
    """munged in the foreground with its key, seed, log and pid in the run's folder; --force
    because it runs as root and its folders are the tmpfs's, not /etc/munge's usual modes."""
    return [munged, "--foreground", "--force", f"--key-file={state}/munge/munge.key",
            f"--seed-file={state}/munge.seed", f"--log-file={state}/munged.log",
            f"--pid-file={state}/munged.pid", f"--socket={MUNGE_SOCKET_DIR}/munge.socket.2"]


def slurmctld_command(slurmctld: str) -> list[str]:
    return [slurmctld, "-D", "-i"]


def slurmd_command(slurmd: str) -> list[str]:
    return [slurmd, "-D"]


class SlurmDaemons:
    """munged and slurmctld on h1, slurmd on every host, all children of the supervisor."""

    def __init__(self, tools: dict[str, str], state: str):
        self.tools = tools
        self.folder = os.path.join(state, FOLDER)
        self.processes: dict[str, subprocess.Popen] = {}

    def prepare(self, hosts: list[Host], slots: int) -> None:
        """The run's slurm.conf and munge key, mounted where Slurm and munge look for them."""
        conf, munge = os.path.join(self.folder, "etc"), os.path.join(self.folder, "munge")
        for folder in (self.folder, conf, munge, MUNGE_SOCKET_DIR, os.path.join(self.folder, "ctld")):
            os.makedirs(folder, mode=0o755, exist_ok=True)
        for name, text in (("slurm.conf", slurm_conf(hosts, slots, self.folder)),
                           ("cgroup.conf", CGROUP_CONF)):
            with open(os.path.join(conf, name), "w", encoding="utf-8") as fh:
                fh.write(text)
        for host in hosts:  # each slurmd's spool (SlurmdSpoolDir's %n)
            os.makedirs(os.path.join(self.folder, host.name), exist_ok=True)
        key = os.path.join(munge, "munge.key")
        with open(os.open(key, os.O_WRONLY | os.O_CREAT, 0o400), "wb") as fh:
            fh.write(os.urandom(MUNGE_KEY_BYTES))
        os.chmod(munge, 0o700)
        for source, target in ((conf, "/etc/slurm"), (munge, "/etc/munge")):
            os.makedirs(target, exist_ok=True)
            sh(["mount", "--bind", source, target])

    def _start(self, label: str, host: str, argv: list[str]) -> None:
        log = open(os.path.join(self.folder, f"{label}.out"), "ab")
        self.processes[label] = subprocess.Popen(on_host(host, argv), stdin=subprocess.DEVNULL,
                                                 stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def start(self, hosts: list[Host]) -> None:
        self._start("munged", CONTROLLER, munged_command(self.tools["munged"], self.folder))
        self._wait_for(lambda: os.path.exists(f"{MUNGE_SOCKET_DIR}/munge.socket.2"), "munged")
        self._start("slurmctld", CONTROLLER, slurmctld_command(self.tools["slurmctld"]))
        for host in hosts:
            self._start(f"slurmd-{host.name}", host.name, slurmd_command(self.tools["slurmd"]))
        names = {host.name for host in hosts}
        self._wait_for(lambda: self._idle() >= names, "every slurmd to register")

    def _idle(self) -> set[str]:
        result = subprocess.run(on_host(CONTROLLER, [self.tools["sinfo"], "-h", "-N", "-o", "%N %t"]),
                                capture_output=True, text=True)
        return {node for node, state in slurm_node_states(result.stdout).items() if state == "idle"}

    def _wait_for(self, ready, what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [label for label, proc in self.processes.items() if proc.poll() is not None]
            if dead:
                raise RuntimeError(f"Slurm did not start: {dead[0]} exited while waiting for "
                                   f"{what}: {self._last_words(dead[0])}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Slurm did not start: no {what} within {timeout:g} s")
            time.sleep(0.2)

    def _last_words(self, label: str) -> str:
        """The daemon's last line: its log is on the run's tmpfs, gone once the run ends."""
        with open(os.path.join(self.folder, f"{label}.out"), encoding="utf-8",
                  errors="replace") as fh:
            lines = [line.strip() for line in fh if line.strip()]
        return " | ".join(lines[-8:]) if lines else "no output"
