"""Open MPI as the launcher: Horovod built with MPI (`make setup-slurm` builds it into
.venv-mpi, or HVDTRAIN_MPI_VENV), its workers started by mpirun over ssh on emulated
hosts, Horovod's MPI controller in place of Gloo (`make test-slurm`)."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest

from conftest import load_rank_files
from helpers import write_learnable_idx_dataset
from test_cluster import ROOT, TINY, TRAIN_WORKER, needs_cluster, run_cluster

MPI_VENV = os.environ.get("HVDTRAIN_MPI_VENV") or os.path.join(ROOT, ".venv-mpi")
MPI_BIN = os.path.join(MPI_VENV, "bin")


def _cannot_run_mpi() -> str | None:
    horovodrun = os.path.join(MPI_BIN, "horovodrun")
    if not os.path.exists(horovodrun):
        return f"no Horovod built with MPI in {MPI_VENV} (make setup-slurm)"
    check = subprocess.run([horovodrun, "--check-build"], capture_output=True, text=True, timeout=300)
    if "[X] MPI" not in check.stdout:
        return f"{horovodrun} was built without MPI"
    return None


REASON = _cannot_run_mpi()
pytestmark = [needs_cluster, pytest.mark.skipif(REASON is not None, reason=f"no MPI: {REASON}"),
              pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.slurm]

# Open MPI's own TCP transport and its out-of-band channel on the hosts' NIC only; no
# binding (the emulated hosts share this machine's cores); root is the cluster's user.
MPIRUN_OPTIONS = ["--allow-run-as-root", "--bind-to", "none", "--map-by", "slot",
                  "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "eth0",
                  "--mca", "oob_tcp_if_include", "eth0",
                  "-x", "PATH", "-x", "HVDTRAIN_HOSTS_SHARE_ONE_MACHINE", "-x", "TF_CPP_MIN_LOG_LEVEL"]


def _two_hosts_of_two(tmp_path, launcher: list[str]) -> list[dict]:
    data_dir = write_learnable_idx_dataset(str(tmp_path / "data"), train=256, test=64)
    runs = [{"name": "sync", "config": dict(TINY, data_dir=data_dir, out=str(tmp_path / "run"))}]
    job = [*launcher, os.path.join(MPI_BIN, "python"), TRAIN_WORKER, str(tmp_path), json.dumps(runs)]
    env = dict(os.environ, PATH=MPI_BIN + os.pathsep + os.environ.get("PATH", ""))
    result = run_cluster(["--hosts", "2", "--link-rate", "1gbit", "--", *job], timeout=600, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return load_rank_files(str(tmp_path), "sync", workers=4)


def _assert_two_hosts_of_two_in_consensus(ranks: list[dict]) -> None:
    assert [int(r["cross_rank"]) for r in ranks] == [0, 0, 1, 1]
    assert all(int(r["local_size"]) == 2 for r in ranks)
    for other in ranks[1:]:
        np.testing.assert_allclose(other["trainable"], ranks[0]["trainable"], rtol=0, atol=1e-6)


def test_mpirun_starts_four_workers_on_two_hosts_over_ssh_and_they_end_in_consensus(tmp_path):
    ranks = _two_hosts_of_two(tmp_path, ["mpirun", "-np", "4", "-H", "h1:2,h2:2", *MPIRUN_OPTIONS])
    _assert_two_hosts_of_two_in_consensus(ranks)


def test_horovodrun_mpi_starts_the_same_job_through_mpirun(tmp_path):
    launcher = [os.path.join(MPI_BIN, "horovodrun"), "--mpi", "-np", "4", "-H", "h1:2,h2:2",
                "--network-interface", "eth0", "--start-timeout", "120",
                "--mpi-args=--allow-run-as-root --bind-to none"]
    _assert_two_hosts_of_two_in_consensus(_two_hosts_of_two(tmp_path, launcher))
