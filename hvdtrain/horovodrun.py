"""horovodrun as the venv's `bin/horovodrun` runs it (launch/quiet-horovodrun.sh writes it).

Two things Horovod's own entry point does not: TensorFlow's start-up notices from its
Gloo build check are dropped (`hvdtrain.quiet`), and a job ended by a failed worker
closes with one line and that worker's exit status, not a Python traceback of the
launcher's. The worker has already said why it failed (hvdtrain's one-line errors, such
as the divergence guard's); Horovod's RuntimeError only repeats that it stopped, and
exiting 1 instead of the worker's status hid which failure it was (4: diverged).
"""

from __future__ import annotations

import re
import sys

from hvdtrain.quiet import quiet_startup

# Horovod 0.28.1's message when a process of a static job exits with a non-zero status
# (horovod/runner/launch.py, _launch_job).
FAILED_WORKER = re.compile(r"one or more processes exited with non-zero status.*?"
                           r"Process name: (\S+)\s+Exit code: (-?\d+)", re.S)


def failed_worker(exc: BaseException) -> tuple[str, int] | None:
    """The first failed worker's name and exit status from Horovod's error, or None for
    any other error."""
    found = FAILED_WORKER.search(str(exc)) if isinstance(exc, RuntimeError) else None
    return (found[1], int(found[2])) if found else None


def main() -> int:
    quiet_startup()
    from horovod.runner.launch import run_commandline

    try:
        run_commandline()
    except RuntimeError as exc:
        failed = failed_worker(exc)
        if failed is None:
            raise
        name, status = failed
        print(f"horovodrun: worker {name} exited with status {status}, so the job was ended "
              "(the worker's own lines above say why)", file=sys.stderr)
        # A status a shell cannot return (negative: killed by a signal) is still a failure.
        return status if 0 < status < 256 else 1
    return 0
