"""The cgroups of a run's containers under runc: a parent of the run's own, removed after it.

runc cannot run a container without cgroups (podman: "runc is not compatible with
NoCgroups"; crun's `--cgroups disabled` makes none, see containers.py). It makes
<parent>/libpod-<id> in every hierarchy, podman puts conmon in <parent>/conmon, and
only `podman rm` (runc delete) removes the first: the run never calls it, since it ends
by its PID 1's exit, which kills conmon and the containers at once, and no podman ever
removes a parent or conmon's cgroup. Under podman's shared default, libpod_parent, every
run left two empty folders per host in each of the machine's ten hierarchies.

So each run's containers get a parent of their own, /hvdtrain-cluster-<random>, known
before the run starts, and a janitor outside the run's namespaces removes that tree
once the run has ended, however it ended: it waits for its stdin to close, which
happens when `hvdtrain cluster` is done with the run or dies, even by SIGKILL. It removes
empty cgroups only, deepest first: the kernel refuses to remove one that still holds
a process (EBUSY), so a process dying late is waited for, never cut off, and nobody
else's cgroup is touched.

  python -m hvdtrain.cluster.cgroups PARENT   (stdin: a pipe `hvdtrain cluster` holds)
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
import uuid

PREFIX = "/hvdtrain-cluster-"
# The run's processes die within a second of PID 1's exit (or of SIGKILL to
# `hvdtrain cluster`); this bounds the wait for a cgroup that never empties.
TIMEOUT_SECONDS = 30.0
POLL_SECONDS = 0.1


def run_parent() -> str:
    """A cgroup parent that no other run on the machine has, for `podman run --cgroup-parent`."""
    return PREFIX + uuid.uuid4().hex[:16]


def hierarchies(mountinfo: str) -> list[str]:
    """Where the machine's cgroup hierarchies are mounted (v1 controllers and v2), from
    the text of /proc/self/mountinfo; the file system type follows the " - " separator."""
    points = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" in fields and fields[fields.index("-") + 1] in ("cgroup", "cgroup2"):
            points.append(fields[4])
    return points


def remove_tree(top: str) -> bool:
    """rmdir every folder of `top`, deepest first, `top` last; True once `top` is gone.
    A cgroup that holds a process or a child stays, and with it its parents."""
    for folder, _children, _files in os.walk(top, topdown=False):
        with contextlib.suppress(OSError):
            os.rmdir(folder)
    return not os.path.exists(top)


def remove_run_cgroups(parent: str, points: list[str], timeout: float = TIMEOUT_SECONDS,
                       poll: float = POLL_SECONDS) -> list[str]:
    """Remove `parent` from every hierarchy, waiting up to `timeout` for its processes to
    end; the folders still there after it (none when all went). Only a run's own
    parent is taken: any other tree could hold another run's or the machine's cgroups."""
    if not re.fullmatch(re.escape(PREFIX) + "[0-9a-f]+", parent):
        raise ValueError(f"not a run's cgroup parent: {parent!r}")
    left = [point + parent for point in points]
    deadline = time.monotonic() + timeout
    while True:
        left = [top for top in left if not remove_tree(top)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(poll)


@contextlib.contextmanager
def removed_after_the_run(parent: str | None):
    """The janitor of `parent` for the run in this block: started before the run, it
    removes the run's cgroups once the block ends (waited for) or this process dies."""
    if not parent:
        yield
        return
    # Its own session: a Ctrl-C at the terminal, which reaches the whole foreground
    # group, must not end the janitor before the run's processes are gone.
    janitor = subprocess.Popen([sys.executable, "-m", "hvdtrain.cluster.cgroups", parent],
                               stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        yield
    finally:
        janitor.stdin.close()
        janitor.wait()


def main(argv: list[str]) -> int:
    parent = argv[0]
    sys.stdin.buffer.read()  # until `hvdtrain cluster` closes it or dies
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        left = remove_run_cgroups(parent, hierarchies(fh.read()))
    if left:
        print(f"hvdtrain cluster: the run's cgroup {left[0]} still holds a process after "
              f"{TIMEOUT_SECONDS:g} s; left in place ({len(left)} hierarchies)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
