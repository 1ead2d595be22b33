"""`hvdtrain plan --json` prints the plan that `hvdtrain train` writes to plan.json, for
every job the invariant matrix runs (pairs and triples) (tests/invariant_matrix.py): both read one YAML file
of the cell's options through their own command lines, the plan command for the cell's
job shape given as flags, the trainer for the workers Horovod reports."""

from __future__ import annotations

import json
import os
from unittest import mock

import pytest
import yaml

import invariant_matrix as matrix
from hvdtrain import cli, comm
from hvdtrain.config_options import config_of
from hvdtrain.machine.host_layout import HOST_SIZES
from hvdtrain.training import run_folder, runner
from hvdtrain.training.saved_run import read_saved_run

PAIRWISE = matrix.cells(strength=2)
# The triples beyond them, which test-long's matrix runs.
_PAIRS = {matrix.cell_id(cell) for cell in PAIRWISE}
TRIPLES = [cell for cell in matrix.cells(3, including=tuple(PAIRWISE))
           if matrix.cell_id(cell) not in _PAIRS]


def _config_file(cell, folder) -> str:
    path = os.path.join(folder, "cell.yaml")
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump({**matrix.options(cell), "out": os.path.join(folder, "run")}, fh)
    return path


def _job_flags(cell) -> list[str]:
    """The cell's job as `hvdtrain plan`'s flags."""
    job = matrix.job(cell)
    if job.host_sizes:
        return ["--host-sizes", ",".join(str(size) for size in job.host_sizes)]
    return ["--workers", str(job.workers), "--hosts", str(job.hosts)]


def _printed_plan(path: str, cell, capsys) -> dict:
    assert cli.main(["plan", "--config", path, *_job_flags(cell), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _written_plan(path: str, cell) -> dict:
    """plan.json as rank 0 of `hvdtrain train --config PATH` writes it, with Horovod's
    count of workers and hosts (and hvdtrain's horovodrun's sizes of unequal hosts)."""
    job = matrix.job(cell)
    args = cli.build_parser().parse_args(["train", "--config", path])
    cfg = config_of(args).resolved()
    environment = {HOST_SIZES: ",".join(str(size) for size in job.host_sizes)} \
        if job.host_sizes else {}
    with mock.patch.object(comm, "size", return_value=job.workers), \
            mock.patch.object(comm, "host_count", return_value=job.hosts), \
            mock.patch.object(comm, "is_chief", return_value=True), \
            mock.patch.dict(os.environ, environment):
        written = runner._announced_plan(cfg, read_saved_run(cfg))
    run_folder.start(cfg.out, cfg.save_yaml, 0, written.to_dict())
    with open(os.path.join(cfg.out, run_folder.PLAN), encoding="utf-8") as fh:
        return json.load(fh)


def _check_printed_equals_written(cell, folder, capsys) -> None:
    path = _config_file(cell, folder)
    printed = _printed_plan(path, cell, capsys)
    written = _written_plan(path, cell)
    capsys.readouterr()  # the trainer's plan lines, printed on rank 0
    assert printed == written


@pytest.mark.parametrize("cell", PAIRWISE, ids=matrix.cell_id)
def test_the_plan_command_prints_the_plan_the_trainer_writes_for_each_matrix_job(
        cell, tmp_path, capsys):
    _check_printed_equals_written(cell, str(tmp_path), capsys)


@pytest.mark.long  # alongside test-long's matrix, whose jobs these are
@pytest.mark.parametrize("cell", TRIPLES, ids=matrix.cell_id)
def test_the_plan_command_prints_the_plan_the_trainer_writes_for_each_long_matrix_job(
        cell, tmp_path, capsys):
    _check_printed_equals_written(cell, str(tmp_path), capsys)


def test_a_plan_that_differs_from_the_trainers_is_seen(tmp_path, capsys):
    """The comparison is not vacuous: the job shape is part of what both must agree on."""
    cell = next(cell for cell in PAIRWISE if cell["hosts"] == "unequal")
    path = _config_file(cell, str(tmp_path))
    printed = _printed_plan(path, cell, capsys)
    flat = dict(cell, hosts="equal")  # the trainer told of other hosts than the plan
    assert printed != _written_plan(path, flat)
