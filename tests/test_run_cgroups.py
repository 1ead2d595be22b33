"""The cgroups runc makes for a run's containers go with the run (hvdtrain.cluster.cgroups).

Pure parts on folders standing in for cgroups (a file in a folder plays a process the
kernel would not let go); then, as root, the janitor on real cgroup hierarchies, after
a run that ends and after one whose `hvdtrain cluster` is killed. The whole chain with
podman and runc is test_image.py's leftovers test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from hvdtrain.cluster import cgroups

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
42 23 0:39 / /sys/fs/cgroup-lookalike rw shared:7 - tmpfs cgroup rw
"""


def test_the_hierarchies_are_the_cgroup_and_cgroup2_mounts():
    assert cgroups.hierarchies(MOUNTINFO) == ["/sys/fs/cgroup/memory", "/sys/fs/cgroup/systemd",
                                              "/sys/fs/cgroup/unified"]


def test_every_run_gets_a_parent_of_its_own():
    first, second = cgroups.run_parent(), cgroups.run_parent()
    assert first != second and first.startswith("/hvdtrain-cluster-")


def test_a_tree_goes_deepest_first_and_a_busy_cgroup_keeps_itself_and_its_parents(tmp_path):
    top = tmp_path / "hvdtrain-cluster-ab"
    (top / "libpod-1").mkdir(parents=True)
    (top / "conmon").mkdir()
    (top / "libpod-2" / "nested").mkdir(parents=True)
    (top / "libpod-2" / "nested" / "process").touch()
    assert not cgroups.remove_tree(str(top))
    assert sorted(os.listdir(top)) == ["libpod-2"]
    (top / "libpod-2" / "nested" / "process").unlink()
    assert cgroups.remove_tree(str(top)) and not top.exists()


def _run_tree(points, parent: str) -> None:
    for point in points:
        os.makedirs(point + parent + "/libpod-0123")
        os.makedirs(point + parent + "/conmon")


def test_the_runs_cgroups_go_from_every_hierarchy_once_their_last_process_ends(tmp_path):
    points = [str(tmp_path / "memory"), str(tmp_path / "pids")]
    parent = cgroups.run_parent()
    _run_tree(points, parent)
    held = tmp_path / "pids" / parent.lstrip("/") / "conmon" / "process"
    held.touch()
    threading.Timer(0.3, held.unlink).start()
    assert cgroups.remove_run_cgroups(parent, points, timeout=20, poll=0.05) == []
    assert sorted(os.listdir(tmp_path)) == ["memory", "pids"]
    assert os.listdir(tmp_path / "memory") == os.listdir(tmp_path / "pids") == []


def test_a_cgroup_that_never_empties_is_left_and_named(tmp_path):
    parent = cgroups.run_parent()
    _run_tree([str(tmp_path)], parent)
    (tmp_path / parent.lstrip("/") / "conmon" / "process").touch()
    assert cgroups.remove_run_cgroups(parent, [str(tmp_path)], timeout=0.2, poll=0.05) == [
        str(tmp_path) + parent]


@pytest.mark.parametrize("parent", ["/", "/libpod_parent", "/hvdtrain-cluster-", "hvdtrain-cluster-ab",
                                    "/hvdtrain-cluster-ab/../libpod_parent"])
def test_only_a_runs_own_parent_is_ever_removed(tmp_path, parent):
    with pytest.raises(ValueError, match="not a run's cgroup parent"):
        cgroups.remove_run_cgroups(parent, [str(tmp_path)])


# --- as root, on the machine's own hierarchies ---

def _machine_hierarchies() -> list[str]:
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        return cgroups.hierarchies(fh.read())


def _cannot_make_cgroups() -> str | None:
    points = _machine_hierarchies()
    if not points:
        return "no cgroup hierarchy is mounted"
    if os.geteuid() != 0 or not all(os.access(point, os.W_OK) for point in points):
        return "making cgroups needs root"
    return None


needs_cgroups = pytest.mark.skipif(_cannot_make_cgroups() is not None,
                                   reason=f"{_cannot_make_cgroups()}")

# What `hvdtrain cluster` does around a run: the janitor before, the run inside (here:
# runc's cgroups made, then the line that says so), the wait for the janitor after.
RUN = """
import os, sys, time
from hvdtrain.cluster import cgroups
parent, points = sys.argv[1], sys.argv[2:]
with cgroups.removed_after_the_run(parent):
    for point in points:
        os.makedirs(point + parent + "/libpod-0123")
    print("made", flush=True)
    if os.environ.get("STAY"):
        time.sleep(300)
"""


def _gone(points, parent: str) -> bool:
    return not any(os.path.exists(point + parent) for point in points)


@needs_cgroups
@pytest.mark.parametrize("ending", ["ends", "killed"])
def test_the_janitor_removes_the_runs_cgroups_after_a_run_that_ends_or_is_killed(ending):
    points, parent = _machine_hierarchies(), cgroups.run_parent()
    env = dict(os.environ, PYTHONPATH=ROOT, STAY="1" if ending == "killed" else "")
    run = subprocess.Popen([sys.executable, "-c", RUN, parent, *points], env=env,
                           stdout=subprocess.PIPE, text=True)
    try:
        assert run.stdout.readline() == "made\n"
        assert all(os.path.isdir(point + parent + "/libpod-0123") for point in points)
        if ending == "killed":
            run.send_signal(signal.SIGKILL)  # no finally, no exit handler runs
        run.wait(timeout=60)
        if ending == "ends":
            assert _gone(points, parent)  # before the run's process returned
        deadline = time.monotonic() + 20
        while not _gone(points, parent):
            assert time.monotonic() < deadline, [p + parent for p in points]
            time.sleep(0.1)
    finally:
        run.kill()
        cgroups.remove_run_cgroups(parent, points, timeout=0)
