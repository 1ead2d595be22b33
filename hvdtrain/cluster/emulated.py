"""The emulated cluster itself: built, run on and broken from inside the run's private namespaces.

Mininet's model: a host is a network namespace with one NIC (eth0) cabled to a bridge,
and "running on a host" is entering its namespace. Every method here assumes it runs
inside the private network, mount and PID namespaces that `hvdtrain cluster` made, so
a mount or a network device made here is invisible outside and dies with the run.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
import time

from hvdtrain.cluster import ssh
from hvdtrain.cluster.containers import ImageSpec
from hvdtrain.cluster.faults import Fault
from hvdtrain.cluster.nodes import ContainerNodes, SshdNodes, sh
from hvdtrain.cluster.topology import NIC, Host, hosts_file, network_commands, shape_command

# A tmpfs over /run, private to the run: ip's named namespaces (/run/netns), sshd's
# privilege-separation folder (/run/sshd) and the run's keys all live there.
RUN = "/run"
STATE = os.path.join(RUN, "hvdtrain-cluster")


def _sh(argv: list[str]) -> None:
    sh(argv)


def _bind(source: str, target: str) -> None:
    _sh(["mount", "--bind", source, target])


class EmulatedCluster:
    def __init__(self, hosts: list[Host], tools: dict[str, str], image: dict | None = None):
        self.hosts = {host.name: host for host in hosts}
        self.tools = tools
        self.nodes = (ContainerNodes(ImageSpec.from_dict(image), STATE) if image
                      else SshdNodes(tools, STATE))

    def build(self) -> None:
        _sh(["mount", "-t", "tmpfs", "-o", "mode=755", "hvdtrain-cluster", RUN])
        for folder in ("netns", "sshd", "hvdtrain-cluster"):
            os.makedirs(os.path.join(RUN, folder), mode=0o755, exist_ok=True)
        self._files()
        for argv in network_commands(list(self.hosts.values())):
            _sh(argv)
        for host in self.hosts.values():
            self.nodes.start(host)
        self.wait_for_sshd()

    def _files(self) -> None:
        """/etc/hosts, /etc/ssh and ~/.ssh as the emulated hosts see them (bind mounts)."""
        hosts_path = os.path.join(STATE, "hosts")
        with open(hosts_path, "w", encoding="utf-8") as fh:
            fh.write(hosts_file(list(self.hosts.values())))
        _bind(hosts_path, "/etc/hosts")
        ssh_folder = os.path.join(STATE, "ssh")
        ssh.make_ssh_folder(ssh_folder)
        _bind(ssh_folder, "/etc/ssh")
        # The user's own ssh config and keys would be tried before ours: hide them.
        home_ssh = os.path.join(pwd.getpwuid(os.getuid()).pw_dir, ".ssh")
        if os.path.isdir(home_ssh):
            empty = os.path.join(STATE, "empty-home-ssh")
            os.makedirs(empty, mode=0o700, exist_ok=True)
            _bind(empty, home_ssh)
        self.nodes.prepare(hosts_path, ssh_folder)

    def listening(self, name: str) -> bool:
        out = subprocess.run(["ip", "netns", "exec", name, "ss", "-Hltn", "sport", "=",
                              f":{self.nodes.port}"], capture_output=True, text=True).stdout
        return bool(out.strip())

    def wait_for_sshd(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        waiting = list(self.hosts)
        while waiting:
            waiting = [name for name in waiting if not self.listening(name)]
            if waiting and time.monotonic() > deadline:
                raise RuntimeError(f"sshd did not start on {', '.join(waiting)} within "
                                   f"{timeout:g} s (see {STATE}/sshd-*.log)")
            time.sleep(0.1)

    def launch(self, name: str, argv: list[str]):
        """The command on host `name`: a Popen, or for a container host a process that
        takes send_signal and wait the same way."""
        return self.nodes.launch(name, argv)

    def pids(self, name: str) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout
        return [int(pid) for pid in out.split()]

    def kill_host(self, name: str) -> None:
        """SIGKILL to every process in the host's network namespace, sshd included."""
        for pid in self.pids(name):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def apply(self, fault: Fault) -> None:
        host = self.hosts[fault.host]
        if fault.action == "down":
            _sh(["ip", "-n", host.name, "link", "set", NIC, "down"])
        elif fault.action == "up":
            _sh(["ip", "-n", host.name, "link", "set", NIC, "up"])
            self.nodes.revive(host)
        elif fault.action == "kill":
            self.kill_host(host.name)
        elif fault.action == "slow":
            # replace, not change: the host may have had no qdisc (an unshaped link)
            for argv in shape_command(host, fault.rate_bits, verb="replace"):
                _sh(argv)
        print(f"hvdtrain cluster: {fault.describe()} ({fault.trigger()})", file=sys.stderr,
              flush=True)

    def nic_bytes(self, name: str) -> dict[str, int]:
        """The host's eth0 byte counters (read by the tests before and after a job)."""
        out = subprocess.run(["ip", "-n", name, "-s", "-j", "link", "show", NIC],
                             capture_output=True, text=True, check=True).stdout
        stats = json.loads(out)[0]["stats64"]
        return {"tx_bytes": stats["tx"]["bytes"], "rx_bytes": stats["rx"]["bytes"]}
