"""The launchers: two "hosts" on one machine, local.sh, pin-gpu.sh, the Slurm script and the MPIJob.

Launchers are checked two ways: with a stand-in `horovodrun` on PATH that records the
command it was given (what exactly reaches horovodrun), and with real runs.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest
import yaml

from conftest import horovodrun, load_rank_files
from helpers import write_learnable_idx_dataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.path.join(ROOT, "launch")
LOCAL_SH = os.path.join(LAUNCH, "local.sh")
PIN_GPU = os.path.join(LAUNCH, "pin-gpu.sh")
SBATCH = os.path.join(LAUNCH, "slurm", "train.sbatch")
VENV_BIN = os.path.dirname(sys.executable)
TINY_RUN = dict(model="lenet", batch_size=16, epochs=1, steps_per_epoch=4, validate=False)

FAKE_HOROVODRUN = """#!{python}
import json, os, sys
args = sys.argv[1:]
record = {{"argv": args}}
if "-hostfile" in args:
    with open(args[args.index("-hostfile") + 1]) as f:
        record["hostfile"] = f.read()
with open(os.environ["FAKE_HOROVODRUN_OUT"], "w") as f:
    json.dump(record, f)
"""


@pytest.fixture
def fake_horovodrun(tmp_path):
    """(env, read): an environment whose `horovodrun` only records its arguments."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    script = bin_dir / "horovodrun"
    script.write_text(FAKE_HOROVODRUN.format(python=sys.executable))
    script.chmod(0o755)
    out = tmp_path / "horovodrun-call.json"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "HOROVODRUN_", "HVDTRAIN_"))}
    env.update(PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
               FAKE_HOROVODRUN_OUT=str(out))
    return env, lambda: json.loads(out.read_text())


def run(command, env, **kwargs):
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120,
                          check=False, **kwargs)


# --- several hosts on one machine ---

@pytest.mark.long  # a job of 15 to 20 seconds here
@pytest.mark.multiprocess
def test_two_hosts_on_one_machine_train_with_one_worker_each(tmp_path):
    """localhost and 127.0.0.1 are two hosts to Horovod: cross size 2, local size 1.

    Both resolve to this machine, so horovodrun starts them without ssh and picks the
    loopback interface itself; no --network-interfaces is needed.
    """
    data_dir = write_learnable_idx_dataset(str(tmp_path / "data"), train=256, test=64)
    runs = [{"name": "two-hosts", "config": dict(TINY_RUN, data_dir=data_dir,
                                                 out=str(tmp_path / "run"))}]
    horovodrun("train_worker.py", str(tmp_path), json.dumps(runs), np_=2,
               hosts="localhost:1,127.0.0.1:1", timeout=300)
    ranks = load_rank_files(str(tmp_path), "two-hosts")
    for rank, saved in enumerate(ranks):
        assert int(saved["local_size"]) == 1      # one worker per "host"
        assert int(saved["cross_rank"]) == rank   # each on its own host
    np.testing.assert_array_equal(ranks[0]["trainable"], ranks[1]["trainable"])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["total_steps"] == 4


# --- launch/local.sh ---

def test_local_sh_splits_horovodrun_flags_from_train_options(fake_horovodrun):
    env, call = fake_horovodrun
    env["HOROVODRUN_ARGS"] = "--autotune --timeline-filename tl.json"
    result = run([LOCAL_SH, "4", "--fusion-threshold-mb", "32", "--cycle-time-ms", "2.5",
                  "--", "--epochs", "3", "--fp16-allreduce"], env)
    assert result.returncode == 0, result.stderr
    assert call()["argv"] == [
        "-np", "4", "-H", "localhost:4", "--gloo",
        "--autotune", "--timeline-filename", "tl.json",     # HOROVODRUN_ARGS first...
        "--fusion-threshold-mb", "32", "--cycle-time-ms", "2.5",  # ...then the command line
        "hvdtrain", "train", "--epochs", "3", "--fp16-allreduce"]


def test_local_sh_without_separator_passes_everything_to_hvdtrain_train(fake_horovodrun):
    env, call = fake_horovodrun
    assert run([LOCAL_SH, "2", "--epochs", "1", "--model", "resnet20"], env).returncode == 0
    assert call()["argv"] == ["-np", "2", "-H", "localhost:2", "--gloo",
                              "hvdtrain", "train", "--epochs", "1", "--model", "resnet20"]


@pytest.mark.parametrize("workers", ["0", "-2", "two", "08", ""])
def test_local_sh_rejects_a_bad_worker_count_in_one_line(fake_horovodrun, workers):
    env, _ = fake_horovodrun
    result = run([LOCAL_SH, workers, "--epochs", "1"], env)
    assert result.returncode == 2
    assert result.stderr == (f"local.sh: error: N (the number of workers) must be a positive "
                             f"integer, got '{workers}'\n")


@pytest.mark.long  # a job of 15 to 20 seconds here
@pytest.mark.multiprocess
def test_local_sh_trains_and_horovodrun_gets_the_tuning_flags(tmp_path):
    data_dir = write_learnable_idx_dataset(str(tmp_path / "data"), train=256, test=64)
    timeline, out = tmp_path / "timeline.json", tmp_path / "run"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", HOROVODRUN_ARGS=f"--timeline-filename {timeline}",
               PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    result = subprocess.run(
        [LOCAL_SH, "2", "--fusion-threshold-mb", "1", "--cycle-time-ms", "2", "--",
         "--data-dir", data_dir, "--epochs", "1", "--steps-per-epoch", "3", "--batch-size", "16",
         "--no-validate", "--out", str(out)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert json.loads((out / "summary.json").read_text())["workers"] == 2
    # The timeline exists only because --timeline-filename reached horovodrun.
    assert "ALLREDUCE" in timeline.read_text()


# --- launch/quiet-horovodrun.sh: the venv's horovodrun as quiet as `make demo` ---

# What TensorFlow and absl print on loading, however they come (raw, or as "[0]<stderr>:").
TF_NOTICE = re.compile(r"absl::InitializeLog|oneDNN custom operations|cpu_feature_guard"
                       r"|To enable the following instructions")


def quiet_venv(tmp_path) -> str:
    """A venv folder whose bin/python runs this venv's Python and whose bin/horovodrun was
    Horovod's own script, after launch/quiet-horovodrun.sh."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    # A shell script, not a link: Python finds its venv from the path it is started as.
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    (bin_dir / "python").chmod(0o755)
    shutil.copy(os.path.join(VENV_BIN, "horovodrun"), bin_dir / "horovodrun")
    subprocess.run(["bash", os.path.join(LAUNCH, "quiet-horovodrun.sh"), str(tmp_path / "venv")],
                   check=True, timeout=60)
    return str(bin_dir)


@pytest.mark.long  # a job of 15 to 20 seconds here
@pytest.mark.multiprocess
def test_a_plain_horovodrun_of_the_venv_prints_no_tensorflow_notice(tmp_path):
    # The README's command as a user types it: no hvdtrain.quiet, no TF_CPP_MIN_LOG_LEVEL.
    # Horovod's own script printed 4 notices (6 lines) here, from its Gloo build check.
    bin_dir = quiet_venv(tmp_path)
    data_dir = write_learnable_idx_dataset(str(tmp_path / "data"), train=256, test=64)
    env = {k: v for k, v in os.environ.items()
           if k not in ("HVDTRAIN_VERBOSE", "TF_CPP_MIN_LOG_LEVEL")}
    env.update(PATH=os.pathsep.join([bin_dir, VENV_BIN, os.environ.get("PATH", "")]),
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    result = subprocess.run(
        ["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", "hvdtrain", "train",
         "--model", "lenet", "--data-dir", data_dir, "--epochs", "1", "--steps-per-epoch", "3",
         "--batch-size", "16", "--no-validate", "--out", str(tmp_path / "run")],
        env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = (result.stdout + result.stderr).splitlines()
    assert [line for line in lines if TF_NOTICE.search(line)] == []
    assert any("hvdtrain: test accuracy" in line for line in lines)


def test_the_quiet_horovodrun_is_horovods_own_and_can_be_written_again(tmp_path):
    bin_dir = quiet_venv(tmp_path)
    with open(os.path.join(bin_dir, "horovodrun")) as fh:
        first = fh.read()
    # install.sh writes it on every install: the same script again, nothing left beside it.
    subprocess.run(["bash", os.path.join(LAUNCH, "quiet-horovodrun.sh"), str(tmp_path / "venv")],
                   check=True, timeout=60)
    with open(os.path.join(bin_dir, "horovodrun")) as fh:
        assert fh.read() == first
    assert sorted(os.listdir(bin_dir)) == ["horovodrun", "python"]
    result = subprocess.run([os.path.join(bin_dir, "horovodrun"), "--version"],
                            capture_output=True, text=True, timeout=120, check=False)
    assert (result.returncode, result.stdout.strip()) == (0, "0.28.1")


# --- launch/pin-gpu.sh ---

@pytest.mark.parametrize("extra_env, expected", [
    ({"HOROVOD_LOCAL_RANK": "3"}, "3"),
    ({"HOROVOD_LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "4,5,6,7"}, "5"),
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "2"}, "2"),                          # horovodrun --mpi
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, "0,1"),                            # not under horovodrun
    ({}, "unset"),
])
def test_pin_gpu_shows_each_worker_the_gpu_of_its_local_rank(extra_env, expected):
    env = {k: v for k, v in os.environ.items()
           if k not in ("CUDA_VISIBLE_DEVICES", "HOROVOD_LOCAL_RANK",
                        "OMPI_COMM_WORLD_LOCAL_RANK")}
    env.update(extra_env)
    result = run([PIN_GPU, "bash", "-c", 'echo "${CUDA_VISIBLE_DEVICES-unset}"'], env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected + "\n"


def test_pin_gpu_refuses_more_workers_than_gpus():
    env = dict(os.environ, HOROVOD_LOCAL_RANK="2", CUDA_VISIBLE_DEVICES="0,1")
    result = run([PIN_GPU, "true"], env)
    assert result.returncode == 2
    assert result.stderr == ("pin-gpu.sh: error: local rank 2 but CUDA_VISIBLE_DEVICES=0,1 lists "
                             "2 GPUs: more workers than GPUs on this host\n")


# --- launch/slurm/train.sbatch, run as sbatch would run it on the first node ---

def slurm_env(env, port):
    env.update(SLURM_JOB_NODELIST="localhost,127.0.0.1", SLURM_TASKS_PER_NODE="2(x2)",
               SLURM_SUBMIT_DIR=ROOT, HVDTRAIN_SSH_PORT=str(port))
    return env


def test_sbatch_builds_the_hostfile_from_the_allocation_and_passes_options(
        fake_horovodrun, listening_port, tmp_path):
    env, call = fake_horovodrun
    slurm_env(env, listening_port)
    env["HOROVODRUN_ARGS"] = "--autotune"
    # Slurm runs a copy of the script from its spool folder, not from the checkout.
    spooled = tmp_path / "slurm_script"
    shutil.copy(SBATCH, spooled)
    result = run(["bash", str(spooled), "--fusion-threshold-mb", "64", "--",
                  "--epochs", "30"], env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    recorded = call()
    argv = recorded["argv"]
    assert argv[:3] == ["-np", "4", "-hostfile"]
    assert argv[4:] == ["--gloo", "--ssh-port", str(listening_port), "--autotune",
                        "--fusion-threshold-mb", "64", "hvdtrain", "train",
                        "--epochs", "30"]
    assert recorded["hostfile"] == "localhost slots=2\n127.0.0.1 slots=2\n"
    assert not os.path.exists(argv[3])  # the temporary hostfile is cleaned up
    assert "4 workers on 2 nodes" in result.stdout


def test_sbatch_stops_before_launch_with_one_line_naming_the_nodes_that_do_not_answer(fake_horovodrun, tmp_path):
    env, call = fake_horovodrun
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
    try:
        slurm_env(env, closed.getsockname()[1])
        result = run(["bash", SBATCH, "--epochs", "1"], env, cwd=tmp_path)
    finally:
        closed.close()
    assert result.returncode == 1
    # One line, the script's whole output on stderr, naming both nodes.
    [line] = result.stderr.splitlines()
    assert line.startswith("hostfile: error: 2 of 2 hosts do not answer (tcp port ")
    assert line.index(" localhost (") < line.index(" 127.0.0.1 (")
    with pytest.raises(FileNotFoundError):
        call()  # horovodrun never ran


def fake_nvidia_smi(env, gpus):
    """Put an nvidia-smi that lists `gpus` GPUs first on env's PATH."""
    bin_dir = env["PATH"].split(os.pathsep)[0]
    lines = "".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i})\\n" for i in range(gpus))
    path = os.path.join(bin_dir, "nvidia-smi")
    with open(path, "w") as script:
        script.write(f"#!/bin/sh\nprintf '{lines}'\n")
    os.chmod(path, 0o755)


def test_sbatch_on_a_gpu_node_asking_no_gpus_and_no_tasks_stops_in_one_line(
        fake_horovodrun, listening_port, tmp_path):
    env, call = fake_horovodrun
    slurm_env(env, listening_port)
    fake_nvidia_smi(env, 8)
    result = run(["bash", SBATCH, "--epochs", "1"], env, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == (f"train.sbatch: error: {socket.gethostname()} has 8 GPUs but the job "
                             "asked for no GPUs and no task count, which starts a worker per CPU: "
                             "submit with --gpus-per-node=8 (or --ntasks-per-node)\n")
    with pytest.raises(FileNotFoundError):
        call()  # horovodrun never ran


@pytest.mark.parametrize("asked", [{"SLURM_GPUS_PER_NODE": "2"}, {"SLURM_NTASKS_PER_NODE": "2"},
                                   {"SLURM_NTASKS": "4"}])
def test_sbatch_on_a_gpu_node_launches_once_gpus_or_tasks_are_asked(
        fake_horovodrun, listening_port, tmp_path, asked):
    env, call = fake_horovodrun
    slurm_env(env, listening_port).update(asked)
    fake_nvidia_smi(env, 2)
    result = run(["bash", SBATCH, "--epochs", "1"], env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert call()["argv"][:2] == ["-np", "4"]


@pytest.mark.parametrize("asked", [
    {"SLURM_JOB_GPUS": "0,1,2", "SLURM_GPUS_ON_NODE": "3"},  # sbatch --gres=gpu:3
    {"SLURM_GPUS": "6", "SLURM_GPUS_ON_NODE": "3"},           # sbatch --gpus=6 on 2 nodes
])
def test_sbatch_on_a_gpu_node_asked_with_gres_or_a_total_launches_a_worker_per_gpu(
        fake_horovodrun, listening_port, tmp_path, asked):
    env, call = fake_horovodrun
    slurm_env(env, listening_port).update(asked)  # 2 tasks a node: not what is asked
    fake_nvidia_smi(env, 3)
    result = run(["bash", SBATCH, "--epochs", "1"], env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert call()["argv"][:2] == ["-np", "6"]


def test_sbatch_asked_gpus_slurm_gave_no_count_for_says_that_in_one_line(
        fake_horovodrun, listening_port, tmp_path):
    env, call = fake_horovodrun
    slurm_env(env, listening_port).update(SLURM_GPUS="16")
    fake_nvidia_smi(env, 8)
    result = run(["bash", SBATCH, "--epochs", "1"], env, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == (
        f"train.sbatch: error: {socket.gethostname()} has 8 GPUs but Slurm set no count of "
        "this node's GPUs (SLURM_GPUS_ON_NODE) for those the job asked (SLURM_GPUS '16', "
        "SLURM_JOB_GPUS '') and the job asked no task count, which starts a worker per CPU: "
        "submit with --gpus-per-node=8 (or --ntasks-per-node)\n")
    with pytest.raises(FileNotFoundError):
        call()  # horovodrun never ran


def test_sbatch_outside_a_checkout_says_where_it_looked(fake_horovodrun, tmp_path):
    env, _ = fake_horovodrun
    env["SLURM_SUBMIT_DIR"] = str(tmp_path)
    result = run(["bash", SBATCH], env, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == (f"train.sbatch: error: no hvdtrain checkout at '{tmp_path}': "
                             "submit from the checkout or set HVDTRAIN_HOME\n")


# --- launch/k8s/mpijob.yaml ---

def test_mpijob_manifest_runs_one_worker_per_gpu_with_valid_train_options():
    with open(os.path.join(LAUNCH, "k8s", "mpijob.yaml")) as f:
        job = yaml.safe_load(f)
    assert job["apiVersion"] == "kubeflow.org/v2beta1" and job["kind"] == "MPIJob"
    specs = job["spec"]["mpiReplicaSpecs"]
    assert set(specs) == {"Launcher", "Worker"} and specs["Launcher"]["replicas"] == 1
    launcher = specs["Launcher"]["template"]["spec"]["containers"][0]
    worker = specs["Worker"]["template"]["spec"]["containers"][0]
    assert launcher["image"] == worker["image"]
    assert job["spec"]["slotsPerWorker"] == worker["resources"]["limits"]["nvidia.com/gpu"]
    # Paths inside the image are this checkout's paths under /opt/hvdtrain.
    assert worker["command"] == ["/opt/hvdtrain/docker/start-sshd.sh"]
    script = launcher["args"][0]
    for path in re.findall(r"/opt/hvdtrain/(\S+)", script) + ["docker/start-sshd.sh"]:
        assert os.path.isfile(os.path.join(ROOT, path)), path
    assert subprocess.run(["bash", "-n", "-c", script], check=False).returncode == 0
    # The sshd port the launcher checks is the one the image's sshd listens on.
    port = re.search(r"--check tcp --port (\d+)", script).group(1)
    with open(os.path.join(ROOT, "docker", "Dockerfile.gpu")) as f:
        assert f"ARG SSH_PORT={port}\n" in f.read()
    # Every `hvdtrain train` option in the manifest is one the CLI accepts.
    from hvdtrain.cli import build_parser
    train_args = shlex.split(script.split("hvdtrain train", 1)[1].replace("\\\n", " "))
    build_parser().parse_args(["train", *train_args])


# --- shell scripts and docs ---

SHELL_SCRIPTS = ["launch/common.sh", "launch/local.sh", "launch/pin-gpu.sh",
                 "launch/slurm/train.sbatch", "launch/install.sh", "launch/check-gpu-build.sh",
                 "launch/image.sh", "launch/quiet-horovodrun.sh", "launch/nvcc-cu12.sh",
                 "docker/ssh-setup.sh",
                 "docker/start-sshd.sh"]


def test_shell_scripts_pass_shellcheck():
    shellcheck = shutil.which("shellcheck") or shutil.which("shellcheck", path=VENV_BIN)
    if not shellcheck:
        pytest.fail("shellcheck is not installed: `make setup` installs it with the dev extras")
    result = subprocess.run([shellcheck, "-x", *SHELL_SCRIPTS], cwd=ROOT, capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_launch_readme_documents_every_tuning_knob():
    with open(os.path.join(LAUNCH, "README.md")) as f:
        readme = f.read()
    for knob in ("--fusion-threshold-mb", "--cycle-time-ms", "--timeline-filename",
                 "--autotune", "--fp16-allreduce", "HOROVODRUN_ARGS"):
        assert knob in readme, knob


# --- hvdtrain/machine/horovodrun.py: the venv's horovodrun closes a failed job in one line ---

FAILED_JOB = ("Horovod detected that one or more processes exited with non-zero status, thus "
              "causing the job to be terminated. The first process to do so was:\n"
              "Process name: 1\nExit code: 4\n")


@pytest.mark.parametrize("error, expected", [
    (RuntimeError(FAILED_JOB), ("1", 4)),
    (RuntimeError(FAILED_JOB.replace("Exit code: 4", "Exit code: -9")), ("1", -9)),
    (RuntimeError("Horovod did not find any host"), None),   # not a failed worker: left alone
    (ValueError(FAILED_JOB), None),
])
def test_horovods_failed_job_error_gives_the_worker_and_its_status(error, expected):
    from hvdtrain.machine.horovodrun import failed_worker

    assert failed_worker(error) == expected


@pytest.mark.parametrize("code, status", [("4", 4), ("-9", 1)])
def test_a_job_ended_by_a_failed_worker_closes_in_one_line_with_its_status(
        monkeypatch, capsys, code, status):
    from horovod.runner import launch

    from hvdtrain.machine import horovodrun

    def failing():
        raise RuntimeError(FAILED_JOB.replace("Exit code: 4", f"Exit code: {code}"))

    monkeypatch.setattr(launch, "run_commandline", failing)
    monkeypatch.setattr(horovodrun, "quiet_startup", lambda: None)
    assert horovodrun.main() == status
    err = capsys.readouterr().err.splitlines()
    assert err == [f"horovodrun: worker 1 exited with status {code}, so the job was ended "
                   "(the worker's own lines above say why)"]


def test_any_other_horovodrun_error_is_left_as_horovod_raised_it(monkeypatch):
    from horovod.runner import launch

    from hvdtrain.machine import horovodrun

    def failing():
        raise RuntimeError("Horovod did not find any host")

    monkeypatch.setattr(launch, "run_commandline", failing)
    monkeypatch.setattr(horovodrun, "quiet_startup", lambda: None)
    with pytest.raises(RuntimeError, match="did not find any host"):
        horovodrun.main()
