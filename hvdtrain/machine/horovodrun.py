"""horovodrun as the venv's `bin/horovodrun` runs it (launch/quiet-horovodrun.sh writes it).

Three things Horovod's own entry point does not: TensorFlow's start-up notices from its
Gloo build check are dropped (`hvdtrain.quiet`); every worker is told every host's worker
count, which lets hierarchical jobs start Horovod with their groups (`hvdtrain.machine.host_layout`);
and a job ended by a failed worker closes with one line and that worker's exit status,
not a Python traceback of the launcher's. The worker has already said why it failed
(hvdtrain's one-line errors, such as the divergence guard's); Horovod's RuntimeError only
repeats that it stopped, and exiting 1 instead of the worker's status hid which failure
it was (4: diverged).
"""

from __future__ import annotations

import os
import re
import sys

from hvdtrain.machine.host_layout import HOST_SIZES, host_sizes
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


def tell_workers_the_host_sizes() -> None:
    """Have horovodrun's Gloo launcher give every worker every host's worker count
    (`host_layout.HOST_SIZES`) beside its own place, so that hierarchical jobs on equal
    hosts start Horovod with their groups. Its two functions are wrapped where
    `launch_gloo` calls them; elastic and MPI jobs go other ways and go without."""
    from horovod.runner import gloo_run

    # An outer job's value would be exported to the workers after theirs, and win.
    os.environ.pop(HOST_SIZES, None)
    assign, slot_environment = gloo_run.get_host_assignments, gloo_run.create_slot_env_vars
    plan_sizes: list[str] = []

    def assignments(*args, **kwargs):
        plan = assign(*args, **kwargs)
        plan_sizes[:] = [host_sizes(plan)]
        return plan

    def environment(slot_info):
        # Elastic jobs assign slots elsewhere (their driver), and go without.
        return {**slot_environment(slot_info), **{HOST_SIZES: size for size in plan_sizes}}

    gloo_run.get_host_assignments = assignments
    gloo_run.create_slot_env_vars = environment


def main() -> int:
    quiet_startup()
    from horovod.runner.launch import run_commandline

    tell_workers_the_host_sizes()

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
