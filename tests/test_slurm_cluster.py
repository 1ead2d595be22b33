"""`hvdtrain cluster --slurm`: Slurm's configuration (pure), its options, and real jobs
submitted with sbatch to slurmctld on emulated hosts (`make test-slurm`; root, slurm-wlm,
munge). Every real run also checks that nothing of it is left: no namespace, mount,
process, spool folder or munge key of the run, and no cgroup made by Slurm.
"""

from __future__ import annotations

import glob
import json
import os
import re

import pytest

from helpers import write_learnable_idx_dataset
from hvdtrain import cli
from hvdtrain.cluster import command, requirements
from hvdtrain.cluster.slurm import munged_command, slurm_conf
from hvdtrain.cluster.topology import plan_hosts
from hvdtrain.errors import ConfigError
from test_cluster import RECORD_NAMESPACES, ROOT, TRAIN_OPTIONS, assert_nothing_left, needs_cluster, run_cluster

TRAIN_SBATCH = os.path.join(ROOT, "launch", "slurm", "train.sbatch")


# --- the configuration ---

def test_slurm_conf_names_h1_the_controller_and_every_host_a_node_with_its_slots():
    conf = slurm_conf(plan_hosts(3), 2, "/run/hvdtrain-cluster/slurm")
    lines = conf.splitlines()
    assert "SlurmctldHost=h1" in lines
    assert [line for line in lines if line.startswith("NodeName=")] == [
        f"NodeName=h{k} NodeAddr=198.18.0.{k} CPUs=2 State=UNKNOWN" for k in (1, 2, 3)]
    # every file Slurm writes is in the run's folder, one spool per slurmd
    paths = [line.split("=", 1)[1] for line in lines
             if line.split("=")[0].endswith(("Location", "SpoolDir", "PidFile"))]
    assert len(paths) == 4 and all(p.startswith("/run/hvdtrain-cluster/slurm/") for p in paths)
    assert "SlurmdSpoolDir=/run/hvdtrain-cluster/slurm/%n" in lines


def test_munged_keeps_its_key_seed_log_and_socket_in_the_runs_folders():
    argv = munged_command("/usr/sbin/munged", "/run/hvdtrain-cluster/slurm")
    files = [a.split("=", 1)[1] for a in argv if a.startswith("--") and "=" in a]
    assert len(files) == 5 and all(f.startswith("/run/") for f in files)


@pytest.mark.parametrize("argv, message", [
    (["--slots", "2"], "--slots needs --slurm: it is what each host offers Slurm (got --slots 2)"),
    (["--slurm", "--slots", "0"], "--slots must be a positive integer, got 0"),
    (["--slurm", "--image", "hvdtrain:cpu"], "--slurm runs this machine's Slurm daemons"),
])
def test_slurm_options_that_do_not_fit_are_one_line_naming_them(argv, message):
    args = cli.build_parser().parse_args(["cluster", *argv, "--", "true"])
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        command.make_spec(args, {"unshare": "/usr/bin/unshare"})


def test_slurm_spec_carries_the_slots_to_the_supervisor():
    args = cli.build_parser().parse_args(["cluster", "--slurm", "--slots", "2", "--", "true"])
    assert command.make_spec(args, {"unshare": "/usr/bin/unshare"})["slurm"] == {"slots": 2}
    args = cli.build_parser().parse_args(["cluster", "--", "true"])
    assert command.make_spec(args, {"unshare": "/usr/bin/unshare"})["slurm"] is None


def test_without_slurmctld_the_slurm_cluster_names_the_package(monkeypatch, capsys):
    monkeypatch.setattr(requirements, "find_tool", lambda name: None if name == "slurmctld" else f"/x/{name}")
    monkeypatch.setattr(command, "check_all", lambda: {"unshare": "/x/unshare"})
    assert cli.main(["cluster", "--slurm", "--", "true"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["hvdtrain: error: hvdtrain cluster --slurm needs slurmctld, which is not "
                   "installed: it comes with slurm-wlm (apt-get install slurm-wlm, or "
                   "`make setup-slurm` as root)"]


# --- real jobs under slurmctld ---

def _cannot_run_slurm() -> str | None:
    try:
        requirements.check_slurm()
    except ConfigError as exc:
        return str(exc)
    return None


needs_slurm = pytest.mark.skipif(_cannot_run_slurm() is not None,
                                 reason=f"no Slurm here: {_cannot_run_slurm()}")


def slurm_cgroups() -> set[str]:
    return set(glob.glob("/sys/fs/cgroup/*/slurm*") + glob.glob("/sys/fs/cgroup/slurm*"))


def submit_script(record: str) -> str:
    """On h1: record the run's namespaces, show that Slurm refuses GPUs it does not have,
    then sbatch --wait train.sbatch with the test's arguments and no shape (the script's
    defaults: every idle node, whole), and print its output."""
    return RECORD_NAMESPACES + (
        'sbatch --gpus-per-node=8 --wrap true 2>&1; '
        'sbatch --wait "$@"; code=$?; '
        'cat hvdtrain-*.out; exit $code')


@needs_cluster
@needs_slurm
@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.slurm
def test_slurm_runs_train_sbatch_as_shipped_six_workers_on_three_nodes_and_leaves_nothing(
        tmp_path, idx_dataset_dir, monkeypatch):
    cgroups = slurm_cgroups()
    record, out = str(tmp_path / "namespaces.txt"), tmp_path / "run"
    env = dict(os.environ, HVDTRAIN_HOME=ROOT)
    hvd_flags = ["--network-interface", "eth0", "--start-timeout", "120"]
    monkeypatch.chdir(tmp_path)  # sbatch's output file and SLURM_SUBMIT_DIR
    result = run_cluster(["--hosts", "3", "--slots", "2", "--slurm", "--", "sh", "-c",
                          submit_script(record), "sh", record, TRAIN_SBATCH, *hvd_flags, "--",
                          *TRAIN_OPTIONS, "--data-dir", idx_dataset_dir, "--out", str(out)],
                         timeout=900, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "sbatch: error: Invalid generic resource (gres) specification" in result.stdout
    assert "train.sbatch: 6 workers on 3 nodes: h1 slots=2 h2 slots=2 h3 slots=2" in result.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["workers"] == 6 and summary["total_steps"] == 3
    assert_nothing_left(record)
    assert slurm_cgroups() == cgroups


@needs_cluster
@needs_slurm
@pytest.mark.slow
@pytest.mark.slurm
def test_slurm_discovery_lists_the_allocations_usable_nodes_and_drops_drained_and_unreachable(tmp_path):
    """launch/discover/slurm.sh inside salloc: all three nodes; without h3 once Slurm
    drains it (sinfo, no reachability check); without h2 too once h2's NIC is down."""
    record, flag = str(tmp_path / "namespaces.txt"), str(tmp_path / "pull-h2")
    discover = os.path.join(ROOT, "launch", "discover", "slurm.sh")
    inside = (f'bash {discover}; echo ---; '
              'scontrol update nodename=h3 state=drain reason=discovery-test; '
              f'HVDTRAIN_HOST_CHECK=none bash {discover}; echo ---; '
              f'touch {flag}; sleep 1; bash {discover}')
    script = RECORD_NAMESPACES + f"exec salloc -N3 --ntasks-per-node=2 sh -c '{inside}'"
    result = run_cluster(["--hosts", "3", "--slots", "2", "--slurm",
                          "--fault", f"when={flag} host=h2 action=down",
                          "--", "sh", "-c", script, "sh", record], timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    blocks = [block.split() for block in result.stdout.split("---")]
    assert blocks == [["h1:2", "h2:2", "h3:2"], ["h1:2", "h2:2"], ["h1:2"]]
    assert_nothing_left(record)


STEP_TIMEOUT = 20


@needs_cluster
@needs_slurm
@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.slurm
def test_slurm_job_losing_a_nodes_nic_ends_in_one_line_and_the_same_sbatch_resumes(
        tmp_path, monkeypatch):
    """h3's NIC is pulled once the job's first checkpoint exists: the job ends within the
    step timeout, each surviving worker says so in one line, and Slurm marks h3 not
    responding. h3's NIC back, its slurmd returns to service, and the same sbatch line
    continues from the checkpoint."""
    data_dir = write_learnable_idx_dataset(str(tmp_path / "data"), train=1152, test=256)
    out, plug = tmp_path / "run", tmp_path / "plug-h3"
    train = ["--model", "lenet", "--data-dir", data_dir, "--batch-size", "16", "--epochs", "3",
             "--steps-per-epoch", "12", "--checkpoint-every", "6",
             "--step-timeout", str(STEP_TIMEOUT), "--resume", "auto", "--out", str(out)]
    submit = ("sbatch --wait --nodes=3 --ntasks-per-node=1 "
              f'{TRAIN_SBATCH} --network-interface eth0 --start-timeout 120 -- "$@"')
    script = (f'{submit}; echo "first=$?"; '
              "until sinfo -h -N -n h3 -o %t | grep -q '[*]'; do sleep 1; done; "
              "sinfo -h -N -n h3 -o 'h3 is %t'; "
              f"touch {plug}; until sinfo -h -N -n h3 -o %t | grep -qx idle; do sleep 1; done; "
              f'{submit}; echo "second=$?"; cat hvdtrain-*.out')
    monkeypatch.chdir(tmp_path)
    result = run_cluster(["--hosts", "3", "--slurm", "--link-rate", "1gbit",
                          "--fault", f"when={out}/checkpoints/step-* host=h3 action=down",
                          "--fault", f"when={plug} host=h3 action=up",
                          "--", "sh", "-c", script, "sh", *train], timeout=1200,
                         env=dict(os.environ, HVDTRAIN_HOME=ROOT))
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "first=0" not in output, output[-4000:]
    assert "second=0" in output and re.search(r"h3 is (idle|alloc|mix|comp|down)\*", output)
    first = (tmp_path / "hvdtrain-1.out").read_text()
    for rank in (0, 1):  # on h1 and h2: one line each, unless horovodrun ended them first
        said = re.search(rf"\[{rank}\]<stderr>:hvdtrain: error: worker {rank} (lost a peer|"
                         rf"waited more than {STEP_TIMEOUT} s)", first)
        assert said or "Terminating remaining workers" in first, first[-3000:]
        assert f"[{rank}]<stderr>:Traceback" not in first, first[-3000:]
    second = (tmp_path / "hvdtrain-2.out").read_text()
    assert f"resuming from {out}/checkpoints/step-0000000" in second, second[-3000:]
    resumed = json.loads((out / "summary.json").read_text())
    assert resumed["resumed_from_step"] >= 6 and resumed["total_steps"] == 36
