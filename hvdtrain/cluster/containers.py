"""`hvdtrain cluster --image`: every emulated host runs the image, as a node of a real cluster would.

Each host is one podman container joined to the host's network namespace (so its eth0
is the host's NIC, at the link rate), named and hostnamed hK, with the run's /etc/hosts,
the run's ssh keys at /root/.ssh and the user's --volume folders at the same paths.
Its main process is the image's own sshd (docker/start-sshd.sh) on the image's port,
so `horovodrun -p 2222` from h1's container is the multi-node recipe of docker/README.md.

Why podman, and why its state on the run's tmpfs: podman has no daemon, so every
container process (conmon, the runtime's children) is a child of the run's PID 1 and
dies with it; and its container records, overlay mounts and runtime files live under
the run's private /run (`--root`, `--runroot`), with the machine's image store read
only (`additionalimagestore`). A crash or SIGKILL therefore leaves no container, mount
or record behind, and the images (the build cache) are never touched. Docker's daemon
lives outside the run's namespaces and would keep its containers after a SIGKILL.

Why crun with `--cgroups disabled`: a container that makes no cgroup leaves none behind
either. crun refuses a hybrid cgroup layout, so the run unmounts the cgroup v2 part of
it (/sys/fs/cgroup/unified) in its private mount namespace only. runc cannot run
without cgroups: its containers get a cgroup parent of the run's own, removed once the
run has ended (cgroups.py).

The argument lists are built by pure functions here; EmulatedCluster runs them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hvdtrain.machine.share import SHARED_MACHINE

# Where the image keeps the pid of the command a run starts in h1's container, so that
# SIGINT reaches the command itself: `podman exec` does not pass signals on.
COMMAND_PID = "/tmp/hvdtrain-cluster-command.pid"
DEFAULT_SSH_PORT = 2222
PORT_LABEL = "org.hvdtrain.ssh-port"
START_SSHD = "/opt/hvdtrain/docker/start-sshd.sh"
# The build's caps (launch/image.sh): podman's defaults may exceed the machine's hard limits.
ULIMITS = ("nofile=16384:16384", "nproc=4096:4096")


@dataclass(frozen=True)
class ImageSpec:
    image: str
    port: int             # the image's sshd port (its org.hvdtrain.ssh-port label)
    podman: str           # the podman program
    runtime: str          # crun, or runc where crun is missing
    graph_root: str       # the machine's image store, read only here
    graph_driver: str     # its storage driver (the run's own store must use the same)
    volumes: tuple[str, ...] = ()
    cgroup_parent: str = ""  # runc's: the run's own (cgroups.run_parent), removed after it

    @classmethod
    def from_dict(cls, data: dict) -> "ImageSpec":
        return cls(**{**data, "volumes": tuple(data.get("volumes", ()))})


def podman_base(spec: ImageSpec, state: str) -> list[str]:
    """podman with the run's own store and runtime files under `state` (the run's tmpfs)."""
    return [spec.podman, "--root", os.path.join(state, "root"),
            "--runroot", os.path.join(state, "runroot"), "--tmpdir", os.path.join(state, "tmp"),
            "--storage-driver", spec.graph_driver,
            "--storage-opt", f"additionalimagestore={spec.graph_root}",
            "--runtime", spec.runtime, "--cgroup-manager", "cgroupfs", "--events-backend", "none"]


def run_host(spec: ImageSpec, state: str, name: str, hosts_file: str, keys: str) -> list[str]:
    """Start host `name`'s container: detached, in the host's netns, sshd as its main process."""
    argv = [*podman_base(spec, state), "run", "--detach", "--name", name, "--hostname", name,
            "--network", f"ns:/run/netns/{name}", "--no-hosts",
            "--volume", f"{hosts_file}:/etc/hosts:ro", "--volume", f"{keys}:/root/.ssh:ro"]
    if spec.runtime == "crun":
        argv += ["--cgroups", "disabled"]
    elif spec.cgroup_parent:
        argv += ["--cgroup-parent", spec.cgroup_parent]
    for limit in ULIMITS:
        argv += ["--ulimit", limit]
    for folder in spec.volumes:
        argv += ["--volume", f"{folder}:{folder}"]
    return argv + [spec.image, START_SSHD]


def workdir(cwd: str, volumes: tuple[str, ...]) -> str | None:
    """The caller's folder, if the containers see it (it is in a --volume); else the image's."""
    for folder in volumes:
        if cwd == folder or cwd.startswith(folder.rstrip("/") + "/"):
            return cwd
    return None


def exec_command(spec: ImageSpec, state: str, name: str, command: list[str], cwd: str) -> list[str]:
    """`command` run in host `name`'s container, with its pid kept for signal_command."""
    argv = [*podman_base(spec, state), "exec", "--interactive", "--env", f"{SHARED_MACHINE}=1"]
    folder = workdir(cwd, spec.volumes)
    if folder:
        argv += ["--workdir", folder]
    return argv + [name, "sh", "-c", f'echo $$ > {COMMAND_PID} && exec "$@"', "hvdtrain-command",
                   *command]


def signal_command(spec: ImageSpec, state: str, name: str, signum: int) -> list[str]:
    return [*podman_base(spec, state), "exec", name, "sh", "-c", f"kill -{signum} $(cat {COMMAND_PID})"]


def start_again(spec: ImageSpec, state: str, name: str) -> list[str]:
    """A host whose processes were all killed: its container starts again (sshd, host keys)."""
    return [*podman_base(spec, state), "start", name]


def is_running(spec: ImageSpec, state: str, name: str) -> list[str]:
    return [*podman_base(spec, state), "container", "inspect", "--format", "{{.State.Running}}", name]


def keys_folder(folder: str, client_key: str, public_key: str) -> dict[str, tuple[str, int]]:
    """What /root/.ssh holds in every container: the run's client key, authorised everywhere."""
    return {os.path.join(folder, "id_ed25519"): (client_key, 0o600),
            os.path.join(folder, "id_ed25519.pub"): (public_key, 0o644),
            os.path.join(folder, "authorized_keys"): (public_key, 0o600)}


def ssh_port(labels: dict | None) -> int:
    """The image's sshd port from its label; 2222 (docker/ssh-setup.sh's) for an image without one."""
    value = (labels or {}).get(PORT_LABEL)
    return int(value) if value and str(value).isdigit() else DEFAULT_SSH_PORT
