"""What runs on an emulated host: the machine's own sshd, or a container of the user's image.

Both kinds start a host's sshd, start it again after a crash, and run the run's command
on h1. EmulatedCluster builds the network around them and does not care which it has.
"""

from __future__ import annotations

import os
import signal
import subprocess

from hvdtrain.cluster import containers, ssh
from hvdtrain.cluster.containers import ImageSpec
from hvdtrain.cluster.topology import Host


def sh(argv: list[str]) -> str:
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {result.stderr.strip()}")
    return result.stdout


def on_host(name: str, argv: list[str]) -> list[str]:
    """`argv` run on emulated host `name`: in its network namespace, with its hostname."""
    return ["ip", "netns", "exec", name, "unshare", "--uts", "--",
            "sh", "-c", 'hostname "$0" && exec "$@"', name, *argv]


class SshdNodes:
    """Hosts that share the machine's file system; each runs the machine's sshd on port 22."""
    port = 22

    def __init__(self, tools: dict[str, str], state: str):
        self.tools = tools
        self.state = state
        self.sshd: dict[str, subprocess.Popen] = {}

    def prepare(self, hosts_path: str, ssh_folder: str) -> None:
        """Nothing more: /etc/hosts and /etc/ssh are already the run's (bind mounts)."""

    def start(self, host: Host) -> None:
        log = open(os.path.join(self.state, f"sshd-{host.name}.log"), "ab")
        command = on_host(host.name, ssh.sshd_command(self.tools["sshd"], host.address))
        self.sshd[host.name] = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                                                stderr=subprocess.STDOUT)
        log.close()

    def revive(self, host: Host) -> None:
        if self.sshd[host.name].poll() is not None:
            self.start(host)

    def launch(self, name: str, argv: list[str]) -> subprocess.Popen:
        return subprocess.Popen(on_host(name, argv))


class ContainerCommand:
    """The command in h1's container. SIGINT to `podman exec` would end podman only and
    leave the command running, so a signal is sent to the command's own pid in there."""

    def __init__(self, argv: list[str], signal_argv):
        self.process = subprocess.Popen(argv)
        self.signal_argv = signal_argv

    def send_signal(self, signum: int) -> None:
        subprocess.run(self.signal_argv(signum), capture_output=True)

    def wait(self) -> int:
        return self.process.wait()


class ContainerNodes:
    """Hosts that run the image: a podman container per host, in the host's network namespace."""

    def __init__(self, spec: ImageSpec, state: str):
        self.spec = spec
        self.state = state
        self.podman_state = os.path.join(state, "podman")
        self.port = spec.port
        self.hosts_path = self.keys = ""

    def prepare(self, hosts_path: str, ssh_folder: str) -> None:
        """The run's keys as /root/.ssh of every container, and crun able to start them."""
        self.hosts_path = hosts_path
        self.keys = os.path.join(self.state, "container-ssh")
        os.makedirs(self.keys, mode=0o700, exist_ok=True)
        with open(os.path.join(ssh_folder, ssh.CLIENT_KEY), encoding="utf-8") as fh:
            private = fh.read()
        with open(os.path.join(ssh_folder, ssh.CLIENT_KEY + ".pub"), encoding="utf-8") as fh:
            public = fh.read()
        for path, (text, mode) in containers.keys_folder(self.keys, private, public).items():
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.chmod(path, mode)
        # crun refuses a hybrid cgroup layout; this mount namespace is the run's own.
        if self.spec.runtime == "crun" and os.path.ismount("/sys/fs/cgroup/unified"):
            sh(["umount", "/sys/fs/cgroup/unified"])

    def start(self, host: Host) -> None:
        sh(containers.run_host(self.spec, self.podman_state, host.name, self.hosts_path, self.keys))

    def revive(self, host: Host) -> None:
        running = sh(containers.is_running(self.spec, self.podman_state, host.name)).strip()
        if running != "true":
            sh(containers.start_again(self.spec, self.podman_state, host.name))

    def launch(self, name: str, argv: list[str]) -> ContainerCommand:
        exec_argv = containers.exec_command(self.spec, self.podman_state, name, argv, os.getcwd())
        return ContainerCommand(exec_argv, lambda signum: containers.signal_command(
            self.spec, self.podman_state, name, signum))
