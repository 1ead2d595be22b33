"""Commands that start hvdtrain jobs from a benchmark or sweep driver, one job at a time."""

from __future__ import annotations

import os
import subprocess
import sys

# hvdtrain's own tools, next to this interpreter (the venv's bin/ folder).
BIN_DIR = os.path.dirname(sys.executable)


def tool(name: str) -> str:
    return os.path.join(BIN_DIR, name)


def horovodrun() -> list[str]:
    """horovodrun through hvdtrain.quiet: it imports TensorFlow itself (its Gloo build
    check), and TensorFlow's start-up notices would open every job's log."""
    return [sys.executable, "-m", "hvdtrain.quiet", tool("horovodrun")]


def horovodrun_command(workers: int, command: list[str], hostfile: str | None = None) -> list[str]:
    """`command` as a job of `workers` processes: on this machine, or on the first
    `workers` slots of `hostfile` (lines `host slots=N`). One local worker runs bare."""
    if hostfile is None and workers == 1:
        return list(command)
    hosts = ["--hostfile", hostfile] if hostfile else ["-H", f"localhost:{workers}"]
    return [*horovodrun(), "-np", str(workers), *hosts, "--gloo", *command]


def on_emulated_hosts(workers: int, command: list[str], hosts: int,
                      link_rate: str | None = None, slots: int = 1) -> list[str]:
    """`command` as a job of `workers` processes on the hosts h1..hK of an emulated
    cluster of `hosts` (`hvdtrain cluster`: a NIC each, shaped to `link_rate`), `slots`
    to a host, h1's first, started over ssh as on a real cluster."""
    cluster = [tool("hvdtrain"), "cluster", "--hosts", str(hosts)]
    cluster += ["--link-rate", link_rate] if link_rate else []
    job = [*horovodrun(), "-np", str(workers), "-H", host_slots(workers, slots), "--gloo",
           "--network-interface", "eth0", *command]
    return [*cluster, "--", *job]


def host_slots(workers: int, slots: int = 1) -> str:
    """horovodrun's -H for `workers` filling hosts of `slots`: 5, 2 -> 'h1:2,h2:2,h3:1'."""
    full, rest = divmod(workers, slots)
    parts = [f"h{k}:{slots}" for k in range(1, full + 1)]
    return ",".join(parts + ([f"h{full + 1}:{rest}"] if rest else []))


def run_job(command: list[str], log_path: str | None = None) -> subprocess.CompletedProcess:
    """Run to the end; output goes to `log_path` (or is captured). TensorFlow's start-up
    chatter is silenced so a failure's own message is easy to find."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    if log_path is None:
        return subprocess.run(command, capture_output=True, text=True, env=env)
    with open(log_path, "w", encoding="utf-8") as log:
        return subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
