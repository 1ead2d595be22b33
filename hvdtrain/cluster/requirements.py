"""What `hvdtrain cluster` needs from the machine, checked before anything is made.

Each missing piece is one line naming it and how to get it (a ConfigError).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

from hvdtrain.cluster.containers import ssh_port
from hvdtrain.errors import ConfigError

CAP_NET_ADMIN = 12
CAP_SYS_ADMIN = 21

# program -> how to get it on Debian or Ubuntu
TOOLS = {
    "unshare": "util-linux (apt-get install util-linux)",
    "mount": "util-linux (apt-get install util-linux)",
    "ip": "iproute2 (apt-get install iproute2)",
    "tc": "iproute2 (apt-get install iproute2)",
    "ssh": "openssh-client (apt-get install openssh-client)",
    "ssh-keygen": "openssh-client (apt-get install openssh-client)",
    "sshd": "openssh-server (apt-get install openssh-server, or `make setup` as root)",
}
# --slurm: Debian's slurm-wlm (slurmctld, slurmd and the client commands) and munge.
SLURM_TOOLS = {
    "munged": "munge (apt-get install munge, or `make setup-slurm` as root)",
    "slurmctld": "slurm-wlm (apt-get install slurm-wlm, or `make setup-slurm` as root)",
    "slurmd": "slurm-wlm (apt-get install slurm-wlm, or `make setup-slurm` as root)",
    "sinfo": "slurm-client (apt-get install slurm-wlm, or `make setup-slurm` as root)",
    "sbatch": "slurm-client (apt-get install slurm-wlm, or `make setup-slurm` as root)",
}
# sshd lives in sbin, which a user's PATH may lack.
SBIN = ("/usr/sbin", "/sbin", "/usr/local/sbin")


def effective_capabilities(status_text: str) -> int:
    """The CapEff bit mask from the text of /proc/PID/status."""
    for line in status_text.splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def missing_capabilities(mask: int) -> list[str]:
    wanted = {"CAP_NET_ADMIN": CAP_NET_ADMIN, "CAP_SYS_ADMIN": CAP_SYS_ADMIN}
    return [name for name, bit in wanted.items() if not mask >> bit & 1]


def find_tool(name: str) -> str | None:
    path = os.pathsep.join([os.environ.get("PATH", ""), *SBIN])
    return shutil.which(name, path=path)


def check_capabilities() -> None:
    with open("/proc/self/status", encoding="utf-8") as fh:
        missing = missing_capabilities(effective_capabilities(fh.read()))
    if missing:
        raise ConfigError(f"hvdtrain cluster needs root ({' and '.join(missing)} missing) to "
                          "make private network, mount and PID namespaces: run it with sudo")


def check_tools(tools: dict[str, str] = TOOLS, what: str = "hvdtrain cluster") -> dict[str, str]:
    """{program: its path} for every program the cluster runs, or one line for the first missing."""
    found = {}
    for name, package in tools.items():
        path = find_tool(name)
        if path is None:
            raise ConfigError(f"{what} needs {name}, which is not installed: "
                              f"it comes with {package}")
        found[name] = path
    return found


def check_slurm() -> dict[str, str]:
    return check_tools(SLURM_TOOLS, "hvdtrain cluster --slurm")


def check_namespaces(unshare: str) -> None:
    """Root is not always enough (a container without CAP_SYS_ADMIN in its own namespace)."""
    probe = subprocess.run([unshare, "--net", "--mount", "--pid", "--fork", "--", "true"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        reason = (probe.stderr.strip().splitlines() or ["unknown error"])[-1]
        raise ConfigError(f"hvdtrain cluster cannot make private namespaces here: {reason}")


def check_all() -> dict[str, str]:
    check_capabilities()
    tools = check_tools()
    check_namespaces(tools["unshare"])
    return tools


PODMAN_HINT = "apt-get install podman, or `make image`, which installs it as root"


def _podman_json(podman: str, *args: str) -> object | None:
    result = subprocess.run([podman, *args, "--format", "json"], capture_output=True, text=True,
                            timeout=60)
    return json.loads(result.stdout) if result.returncode == 0 else None


def _find_podman() -> str:
    podman = find_tool("podman")
    if podman:
        return podman
    if find_tool("docker"):
        raise ConfigError("hvdtrain cluster --image needs podman; docker's daemon keeps its "
                          f"containers outside the run's namespaces, so a crash would leave them: {PODMAN_HINT}")
    raise ConfigError(f"hvdtrain cluster --image needs podman, which is not installed: {PODMAN_HINT}")


def _check_volumes(volumes: list[str]) -> tuple[str, ...]:
    folders = tuple(os.path.abspath(v) for v in volumes)
    for folder in folders:
        if not os.path.isdir(folder):
            raise ConfigError(f"--volume {folder}: no such folder")
    return folders


def check_image(image: str, volumes: list[str]) -> dict:
    """What `--image` needs (podman, a runtime, the image in podman's store), as ImageSpec data."""
    podman = _find_podman()
    runtime = "crun" if find_tool("crun") else "runc" if find_tool("runc") else None
    if runtime is None:
        raise ConfigError("hvdtrain cluster --image needs crun or runc for podman: apt-get install crun")
    inspected = _podman_json(podman, "image", "inspect", image)
    if not inspected:
        raise ConfigError(f"image {image} is not in podman's image store: build it with "
                          "`make image` (or podman build -f docker/Dockerfile.cpu -t hvdtrain:cpu .)")
    info = _podman_json(podman, "info") or {}
    store = info.get("store", {})
    return {"image": image, "port": ssh_port(inspected[0].get("Labels") or
                                             inspected[0].get("Config", {}).get("Labels")),
            "podman": podman, "runtime": runtime, "graph_root": store.get("graphRoot", ""),
            "graph_driver": store.get("graphDriverName", "overlay"),
            "volumes": list(_check_volumes(volumes))}
