"""The CPU image built here and run as the hosts of an emulated cluster: docker/README.md's
multi-node recipe, rehearsed (`make test-image`; root and podman).

The module's fixture builds hvdtrain:cpu with `launch/image.sh` (BASE=debootstrap: no
image registry is reachable here), which takes minutes once and seconds after, since
every layer is cached. Every job then runs with `hvdtrain cluster --image`: each host a
container of the image in its own network namespace, horovodrun over ssh on the
image's port 2222, run folders on a --volume.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest

from conftest import load_rank_files
from hvdtrain.cluster.cgroups import hierarchies
from test_cluster import HVDTRAIN, VENV_BIN, _cannot_make_a_cluster, listed_namespaces
from test_cluster_faults import ended_after_event

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGE = os.environ.get("HVDTRAIN_TEST_IMAGE", "hvdtrain:cpu")
TRAIN_WORKER = os.path.join(ROOT, "tests", "workers", "train_worker.py")
# Inside the image: Fashion-MNIST comes with it (dataset-fashion-mnist).
TRAIN = ["hvdtrain", "train", "--model", "lenet", "--batch-size", "32", "--no-validate"]


def _cannot_run_images() -> str | None:
    reason = _cannot_make_a_cluster()
    if reason:
        return reason
    if not shutil.which("podman"):
        return "podman is not installed (apt-get install podman)"
    return None


pytestmark = [pytest.mark.skipif(_cannot_run_images() is not None,
                                 reason=f"cannot run the image here: {_cannot_run_images()}"),
              pytest.mark.image, pytest.mark.slow, pytest.mark.multiprocess]


def _env() -> dict:
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""))


@pytest.fixture(scope="module")
def image() -> str:
    built = subprocess.run(["bash", os.path.join(ROOT, "launch", "image.sh")], capture_output=True,
                           text=True, timeout=3600, env=dict(_env(), BASE="debootstrap", IMAGE=IMAGE))
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return IMAGE


def podman_run(image: str, *command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs", "run", "--rm",
                           "--network", "host", "--ulimit", "nofile=16384:16384", "--ulimit",
                           "nproc=4096:4096", image, *command],
                          capture_output=True, text=True, timeout=300)


def cluster(volume, *command: str, hosts: int = 2, extra=(), image: str = IMAGE) -> list[str]:
    return [HVDTRAIN, "cluster", "--hosts", str(hosts), "--link-rate", "1gbit", "--image", image,
            "--volume", str(volume), *extra, "--", *command]


def horovodrun(workers: int, *command: str) -> list[str]:
    hosts = ",".join(f"h{k}:1" for k in range(1, workers + 1))
    return ["horovodrun", "-np", str(workers), "-H", hosts, "-p", "2222", "--gloo",
            "--start-timeout", "60", *command]


def test_the_image_passes_its_checks_and_keeps_no_ca_bundle(image):
    """The build ran horovodrun --check-build and both smoke tests as its last step; they
    pass again in a container, and the CA bundle given to the build is in no layer."""
    smoke = podman_run(image, "horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", "python",
                       "docker/smoke_test.py")
    assert smoke.returncode == 0, smoke.stdout[-2000:] + smoke.stderr[-2000:]
    assert smoke.stdout.count("smoke test ok") == 2
    secrets = podman_run(image, "sh", "-c", "test -e /run/secrets/ca-bundle; echo bundle $?; "
                         "env | grep -c PIP_CERT; pip config list | grep -c cert")
    assert secrets.stdout.split() == ["bundle", "1", "0", "0"], secrets.stdout
    labels = subprocess.run(["podman", "image", "inspect", "--format",
                             '{{index .Labels "org.hvdtrain.ssh-port"}}', image],
                            capture_output=True, text=True)
    assert labels.stdout.strip() == "2222"


def test_the_docker_readme_recipe_trains_across_two_containers_and_leaves_the_run_on_the_host(
        image, tmp_path):
    readme_recipe_trains_across_two_hosts(image, tmp_path)


def readme_recipe_trains_across_two_hosts(image: str, tmp_path) -> None:
    """docker/README.md's two-host job on hosts running `image`: the run folder is on the
    volume afterwards, and no container of the run is left."""
    out = tmp_path / "run"
    job = horovodrun(2, *TRAIN, "--epochs", "1", "--steps-per-epoch", "30", "--out", str(out))
    result = subprocess.run(cluster(tmp_path, *job, image=image), capture_output=True, text=True,
                            timeout=600, env=_env())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"running {image}" in result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["workers"], summary["total_steps"]) == (2, 30)
    assert not _run_containers_left()


def test_sync_and_local_jobs_across_containers_end_in_consensus(image, tmp_path):
    sync_and_local_jobs_end_in_consensus(image, tmp_path)


def sync_and_local_jobs_end_in_consensus(image: str, tmp_path) -> None:
    """Each rank's own weights, written by the test worker (run from the volume, with the
    image's hvdtrain): every rank holds the same at the end of each run."""
    worker = tmp_path / "train_worker.py"
    shutil.copy(TRAIN_WORKER, worker)
    tiny = dict(model="lenet", batch_size=16, epochs=1, steps_per_epoch=8, validate=False)
    modes = {"sync": {}, "local": dict(mode="local", n_sync=3)}
    runs = [{"name": name, "config": dict(tiny, **cfg, out=str(tmp_path / f"run-{name}"))}
            for name, cfg in modes.items()]
    result = subprocess.run(cluster(tmp_path, *horovodrun(2, "python", str(worker), str(tmp_path),
                                                          json.dumps(runs)), image=image),
                            capture_output=True, text=True, timeout=600, env=_env())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for name in modes:
        ranks = load_rank_files(str(tmp_path), name, workers=2)
        np.testing.assert_allclose(ranks[1]["trainable"], ranks[0]["trainable"], rtol=0, atol=1e-6)
        summary = json.loads((tmp_path / f"run-{name}" / "summary.json").read_text())
        assert summary["workers"] == 2 and summary["mode"] == name


STEP_TIMEOUT = 20


def test_a_killed_container_host_stops_the_job_in_one_line_and_the_same_command_resumes(
        image, tmp_path):
    out = tmp_path / "run"
    job = horovodrun(2, *TRAIN, "--epochs", "2", "--steps-per-epoch", "12", "--checkpoint-every", "6",
                     "--step-timeout", str(STEP_TIMEOUT), "--out", str(out))
    kill = f"when={out}/checkpoints/step-* host=h2 action=kill"
    proc = subprocess.Popen(cluster(tmp_path, *job, extra=("--fault", kill)), env=_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output, ended_after = ended_after_event(
        proc, lambda: bool(glob.glob(f"{out}/checkpoints/step-*")), 400, 180)
    assert proc.returncode != 0 and not (out / "summary.json").exists(), output[-3000:]
    assert "h2 kill (once" in output
    assert ended_after < STEP_TIMEOUT + 15, output[-3000:]
    assert "[0]<stderr>:Traceback" not in output, output[-3000:]

    again = subprocess.run(cluster(tmp_path, *job), capture_output=True, text=True, timeout=600,
                           env=_env())
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"resuming from {out}/checkpoints/step-0000000" in again.stdout
    resumed = json.loads((out / "summary.json").read_text())
    assert resumed["resumed_from_step"] >= 6 and resumed["total_steps"] == 24


# --- nothing outlives the run ---

def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        try:
            with open(f"/proc/{current}/task/{current}/children", encoding="utf-8") as fh:
                children = [int(c) for c in fh.read().split()]
        except OSError:
            continue
        found += children
        todo += children
    return found


def _namespaces_of(pids: list[int]) -> set[str]:
    held = set()
    for pid in pids:
        for kind in ("net", "mnt", "pid", "uts", "ipc"):
            try:
                held.add(os.readlink(f"/proc/{pid}/ns/{kind}").split("[")[1].rstrip("]"))
            except OSError:
                pass
    return held


def _run_containers_left() -> list[str]:
    """Processes of a run's containers (conmon and the runtime name the run's podman store)."""
    texts = (_cmdline(int(folder[6:])) for folder in glob.glob("/proc/[0-9]*"))
    return [text for text in texts if "/run/hvdtrain-cluster/podman" in text]


def _cgroups_of(pids: list[int]) -> set[str]:
    """The cgroups the processes are in, as paths inside their hierarchies."""
    held = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cgroup", encoding="utf-8") as fh:
                held |= {line.split(":", 2)[2].strip() for line in fh if line.count(":") >= 2}
        except OSError:
            pass
    return held


def _cgroups_left(paths: set[str]) -> list[str]:
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        points = hierarchies(fh.read())
    return sorted(point + path for point in points for path in paths
                  if os.path.isdir(point + path))


def _left(namespaces: set[str], cgroups: set[str], janitors: list[int]) -> list:
    return [*(namespaces & listed_namespaces()), *_run_containers_left(), *_cgroups_left(cgroups),
            *(pid for pid in janitors if os.path.exists(f"/proc/{pid}"))]


def _janitors(pids: list[int]) -> list[int]:
    return [pid for pid in pids if "hvdtrain.cluster.cgroups" in _cmdline(pid)]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.parametrize("ending", ["exits", signal.SIGINT, signal.SIGKILL],
                         ids=["exits", "sigint", "sigkill"])
def test_a_container_cluster_that_ends_or_is_interrupted_leaves_nothing_behind(image, tmp_path,
                                                                             ending):
    """Namespaces, container processes, mounts and, under runc, the containers' cgroups
    (libpod-<id> and conmon's, under the run's own parent): gone once `hvdtrain cluster`
    has returned, or soon after it was killed."""
    started, stop = tmp_path / "started", tmp_path / "stop"
    containers_before = _machine_containers()
    waits = f"while [ ! -e {stop} ]; do sleep 0.2; done"
    proc = subprocess.Popen(cluster(tmp_path, "sh", "-c", f"ssh h2 'touch {started}; {waits}' & "
                                                          f"{waits}; wait"),
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        recorded, cgroups, janitors = _record_the_run(proc, started)
        if ending == "exits":
            stop.touch()
        else:
            proc.send_signal(ending)
        assert (proc.wait(timeout=60) == 0) == (ending == "exits")
    finally:
        if proc.poll() is None:  # a failed assertion must not leave the run going
            proc.kill()
    if ending != signal.SIGKILL:  # `hvdtrain cluster` returns once its cgroups are gone
        assert not _cgroups_left(cgroups), _cgroups_left(cgroups)
    deadline = time.monotonic() + 20
    while _left(recorded, cgroups, janitors):
        assert time.monotonic() < deadline, _left(recorded, cgroups, janitors)
        time.sleep(0.2)
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        mounts = fh.read()
    assert "hvdtrain-cluster" not in mounts
    assert _machine_containers() == containers_before


def _record_the_run(proc: subprocess.Popen, started) -> tuple[set[str], set[str], list[int]]:
    """Once the command runs on h2: the run's namespaces, its containers' cgroups (and their
    parents) and, under runc, the janitor that removes those."""
    deadline = time.monotonic() + 120
    while not started.exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "the command did not start on h2 within 120 s"
        time.sleep(0.2)
    run_pids = _descendants(proc.pid)
    namespaces = _namespaces_of(run_pids) - _namespaces_of([os.getpid()])
    assert len(namespaces) >= 8  # the run's, and each container's own
    cgroups = _cgroups_of(run_pids) - _cgroups_of([os.getpid()])
    cgroups |= {os.path.dirname(path) for path in cgroups} - {"/"}
    janitors = _janitors(run_pids)
    assert shutil.which("crun") or (sum("libpod-" in path for path in cgroups), len(janitors)) == (
        2, 1), (cgroups, janitors)
    return namespaces, cgroups, janitors


def _machine_containers() -> set[str]:
    """The machine's own podman store: the run never writes to it (it reads images only)."""
    listed = subprocess.run(["podman", "ps", "--all", "--quiet"], capture_output=True, text=True)
    return set(listed.stdout.split())
