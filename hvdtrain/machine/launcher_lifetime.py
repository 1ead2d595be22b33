"""A worker that horovodrun started ends when the process that started it ends.

On another host that process is the worker's ssh session. When a host drops off the
network, horovodrun's ssh client gives up on it and the job goes on without it, but the
worker on that host lives on: nothing there has told it. Once the network is back it
reaches horovodrun's rendezvous server again, and an elastic job's driver then counts it
as the worker of its slot beside the new one it started there, so a barrier fills early
and the driver ends a healthy job (seen in tests/test_cluster_faults.py). sshd on the lost
host does notice (ClientAliveInterval), and ends the session: the worker must go with it.

Only horovodrun's workers are tied so. A worker of `mpirun` or `srun` is ended by their
own daemons, and a process a user started from a shell (one worker, no launcher) must
not end because that shell did.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Mapping

PR_SET_PDEATHSIG = 1  # linux/prctl.h
# horovodrun sets it for every worker it starts with Gloo, elastic or not; mpirun does not.
HOROVODRUN_MARK = "HOROVOD_GLOO_RENDEZVOUS_ADDR"


def started_by_horovodrun(env: Mapping[str, str]) -> bool:
    return bool(env.get(HOROVODRUN_MARK))


def end_with_launcher(env: Mapping[str, str] = os.environ) -> bool:
    """Ask Linux for SIGTERM when this process's parent ends, if horovodrun started it:
    whether it did. A parent that ended already ends this process now."""
    if not started_by_horovodrun(env) or not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        return False  # a kernel that refuses it: the worker runs as before
    # The parent may have ended before the request, which then never fires.
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)
    return True
