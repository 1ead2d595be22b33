"""Sweep runs the divergence guard stopped: told apart from failures, and remembered.

`hvdtrain train` ends a run whose loss blew up with one line and exit code 4
(`TrainingDiverged`: the guard, a loss or weights no longer finite), and writes no
summary.json. A sweep over rates or settings expects some of them to diverge: such a run
is a result, not a failure. The sweep writes its line, and the step the line names, to
diverged.json in the run folder, so that a sweep started again does not train it again,
and `hvdtrain compare` and `hvdtrain plot` can say so. Any other exit stays a failure.
"""

from __future__ import annotations

import os
import re

from hvdtrain import files
from hvdtrain.errors import DataError, TrainingDiverged

MARKER = "diverged.json"
FINISHED, DIVERGED = "finished", "diverged"  # a sweep row's status
ERROR_PREFIX = "hvdtrain: error: "
# Every TrainingDiverged line names its step: "training diverged at step 22: ...",
# "loss is nan at step 3; ...", "weights are not finite at step 40; ...".
STEP = re.compile(r"\bat step (\d+)")


def is_divergence(exit_code: int) -> bool:
    """Whether a job's exit code is the one a diverged run ends with."""
    return exit_code == TrainingDiverged.exit_code


def first_error(log_path: str) -> str | None:
    """The first one-line error in a job's log, the cause: the other workers' lines
    after it are peers that lost it (or stopped at the same step)."""
    if not os.path.isfile(log_path):
        return None
    with open(log_path, encoding="utf-8", errors="replace") as fh:
        errors = [line.split(ERROR_PREFIX, 1)[1].strip() for line in fh if ERROR_PREFIX in line]
    return errors[0] if errors else None


def mark_diverged(run_dir: str, log_path: str) -> dict:
    """Write the run's diverged.json (atomically) from its job's log; returns it."""
    reason = first_error(log_path) or (f"exit {TrainingDiverged.exit_code} without an "
                                       f"error line in {log_path}")
    match = STEP.search(reason)
    marker = {"reason": reason, "step": int(match[1]) if match else None}
    os.makedirs(run_dir, exist_ok=True)
    files.write_json(os.path.join(run_dir, MARKER), marker)
    return marker


def read_marker(run_dir: str) -> dict | None:
    """The run folder's diverged.json, or None if the run was not recorded as diverged."""
    path = os.path.join(run_dir, MARKER)
    if not os.path.isfile(path):
        return None
    try:
        marker = files.read_json(path)
    except ValueError as exc:
        raise DataError(f"{path} is not JSON ({exc}); delete it to train the run again") from None
    if not isinstance(marker, dict) or "reason" not in marker:
        raise DataError(f"{path} has no 'reason'; delete it to train the run again")
    return marker


def is_diverged(row: dict) -> bool:
    """Whether a sweep row is a run that diverged (rows without a status finished)."""
    return row.get("status") == DIVERGED


def described(step: int | None) -> str:
    """'diverged at step 22', or 'diverged' when the line named no step."""
    return DIVERGED if step in (None, "") else f"{DIVERGED} at step {step}"
