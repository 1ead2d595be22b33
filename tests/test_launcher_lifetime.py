"""A worker horovodrun started ends with the process that started it (its ssh session on
another host); any other process outlives its parent, as before."""

import os
import subprocess
import sys
import time

from hvdtrain.machine.launcher_lifetime import HOROVODRUN_MARK, started_by_horovodrun

# The parent starts the worker, waits until it has asked to end with its parent, names
# it, and ends at once: the worker is then an orphan, unless Linux ended it.
PARENT = r"""
import subprocess, sys
worker = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True)
assert worker.stdout.readline().strip() == "armed"
print(worker.pid, flush=True)
"""
WORKER = r"""
import os, time
from hvdtrain.machine.launcher_lifetime import end_with_launcher
end_with_launcher(os.environ)
print("armed", flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _orphan(env: dict) -> int:
    """Start a worker under a parent that ends: the worker's process id."""
    out = subprocess.run([sys.executable, "-c", PARENT, WORKER], env=env, check=True,
                         capture_output=True, text=True, timeout=60).stdout
    return int(out.split()[0])


def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


def test_only_horovodruns_workers_are_tied_to_their_parent():
    assert started_by_horovodrun({HOROVODRUN_MARK: "198.18.0.1"})
    assert not started_by_horovodrun({})
    assert not started_by_horovodrun({HOROVODRUN_MARK: ""})
    assert not started_by_horovodrun({"OMPI_COMM_WORLD_RANK": "0"})  # mpirun's own


def test_a_worker_of_horovodrun_ends_when_its_parent_does():
    pid = _orphan({**os.environ, HOROVODRUN_MARK: "198.18.0.1"})
    assert _wait_gone(pid, 10)


def test_a_process_no_launcher_started_outlives_its_parent():
    env = {k: v for k, v in os.environ.items() if k != HOROVODRUN_MARK}
    pid = _orphan(env)
    try:
        assert not _wait_gone(pid, 2)
    finally:
        os.kill(pid, 9)
    assert _wait_gone(pid, 10)
