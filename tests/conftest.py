"""Shared test helpers: small learnable IDX datasets and a horovodrun launcher."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS_DIR = os.path.join(HERE, "workers")
sys.path.insert(0, HERE)

from helpers import write_learnable_idx_dataset  # noqa: E402


@pytest.fixture
def idx_dataset_dir(tmp_path):
    """A Fashion-MNIST-shaped folder of gzipped IDX files with an easy pattern to learn."""
    return write_learnable_idx_dataset(str(tmp_path / "idx"), train=512, test=128)


@pytest.fixture
def listening_port():
    """A port on 127.0.0.1 that accepts connections (a stand-in for sshd)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    yield server.getsockname()[1]
    server.close()


def horovodrun(script: str, *args: str, np_: int = 2, hosts: str = "localhost:2",
               timeout: float = 300, check: bool = True,
               cwd: str | None = None) -> subprocess.CompletedProcess:
    """Run tests/workers/<script> (a script path, or a command when script has no .py) under
    horovodrun --gloo, in `cwd`."""
    bin_dir = os.path.dirname(sys.executable)
    command = [os.path.join(bin_dir, "horovodrun"), "-np", str(np_), "-H", hosts, "--gloo"]
    if script.endswith(".py"):
        command += [sys.executable, os.path.join(WORKERS_DIR, script)]
    else:
        command += [os.path.join(bin_dir, script)]
    # The caller's PYTHONPATH stays behind the tests' folder: a worktree run with
    # PYTHONPATH=WORKTREE must launch workers that import that worktree's hvdtrain.
    python_path = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=python_path,
               PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
    result = subprocess.run(command + list(args), capture_output=True, text=True,
                            timeout=timeout, env=env, cwd=cwd)
    if check and result.returncode != 0:
        raise AssertionError(f"horovodrun failed ({result.returncode}):\n"
                             f"{result.stdout[-5000:]}\n{result.stderr[-5000:]}")
    return result


def load_rank_files(folder: str, stem: str, workers: int = 2) -> list[dict]:
    out = []
    for rank in range(workers):
        with np.load(os.path.join(folder, f"{stem}-rank{rank}.npz"), allow_pickle=True) as data:
            out.append({k: data[k] for k in data.files})
    return out
