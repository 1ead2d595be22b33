"""The Docker images: hadolint-clean, built by launch/install.sh, versions pinned once, smoke test real.

No Docker engine is needed: the Dockerfiles are linted and parsed, and the smoke
test every image build ends with is run here on the host.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import re
import shutil
import subprocess
import sys

import pytest
from dockerfile_parse import DockerfileParser

from conftest import horovodrun

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCKERFILES = sorted(glob.glob(os.path.join(ROOT, "docker", "Dockerfile*")))
NAMES = [os.path.basename(p) for p in DOCKERFILES]
INSTALL_RUN = re.compile(r"\bbash launch/install\.sh /opt/venv\b")


def instructions(path: str) -> list[dict]:
    with open(path, "rb") as f:
        return [i for i in DockerfileParser(fileobj=f).structure if i["instruction"] != "COMMENT"]


def runs(path: str) -> list[str]:
    return [i["value"] for i in instructions(path) if i["instruction"] == "RUN"]


def build_args(path: str) -> dict[str, str]:
    args = {}
    for i in instructions(path):
        if i["instruction"] == "ARG" and "=" in i["value"]:
            key, value = i["value"].split("=", 1)
            args[key] = value
    return args


def hadolint_binary() -> str:
    found = shutil.which("hadolint") or shutil.which(
        "hadolint", path=os.path.dirname(sys.executable))
    if not found:
        pytest.fail("hadolint is not installed: `make setup` installs it with the dev extras "
                    "(pip install -e '.[dev]')")
    return found


def test_there_is_a_cpu_and_a_gpu_image():
    assert NAMES == ["Dockerfile.cpu", "Dockerfile.gpu"]


@pytest.mark.parametrize("path", DOCKERFILES, ids=NAMES)
def test_dockerfile_passes_hadolint(path):
    result = subprocess.run([hadolint_binary(), "--no-color", path], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", DOCKERFILES, ids=NAMES)
def test_images_install_through_launch_install_sh_and_nothing_else(path):
    steps = runs(path)
    installs = [i for i, run in enumerate(steps) if INSTALL_RUN.search(run)]
    # Twice: TensorFlow and Horovod alone (DEPS_ONLY=1, a layer that survives code
    # changes), then hvdtrain itself once the code is copied in.
    assert len(installs) == 2, steps
    assert "DEPS_ONLY=1" in steps[installs[0]] and "DEPS_ONLY" not in steps[installs[1]]
    # The script CI runs is the one the image runs: no pip of its own.
    assert not [run for run in steps if re.search(r"\bpip3? install\b", run)]
    # The first layer needs the Horovod patches too: install.sh reads them from the
    # folder next to it.
    # (The GPU image's first stage also copies launch/nvcc-cu12.sh, which makes its nvcc.)
    copies = [i["value"] for i in instructions(path) if i["instruction"] == "COPY"
              and not i["value"].startswith("--from=") and "nvcc-cu12" not in i["value"]]
    assert copies == ["launch/install.sh launch/install.sh", "launch/patches/ launch/patches/",
                      ". ."]
    assert os.path.isfile(os.path.join(ROOT, "launch", "install.sh"))
    assert glob.glob(os.path.join(ROOT, "launch", "patches", "*.patch"))


@pytest.mark.parametrize("path", DOCKERFILES, ids=NAMES)
def test_images_end_with_check_build_and_a_two_worker_smoke_test(path):
    last = runs(path)[-1]
    assert re.search(r"horovodrun --check-build\b.*python docker/smoke_test\.py\b.*"
                     r"horovodrun -np 2 -H localhost:2 --gloo python docker/smoke_test\.py", last)
    assert instructions(path)[-1]["instruction"] == "CMD"
    for script in ("docker/smoke_test.py", "docker/ssh-setup.sh"):
        assert os.path.isfile(os.path.join(ROOT, script))
    assert any("bash docker/ssh-setup.sh \"$SSH_PORT\"" in run for run in runs(path))


@pytest.mark.parametrize("path", DOCKERFILES, ids=NAMES)
def test_versions_are_build_args_matching_install_sh(path):
    with open(os.path.join(ROOT, "launch", "install.sh")) as f:
        script = f.read()
    pinned = dict(re.findall(r"^(TF_VERSION|HOROVOD_VERSION)=\$\{\1:-([^}]+)\}$", script, re.M))
    assert pinned == {"TF_VERSION": "2.21.0", "HOROVOD_VERSION": "0.28.1"}
    args = build_args(path)
    for name, version in pinned.items():
        assert args[name] == version, name


def test_cpu_image_is_python_3_12_on_a_debian_with_cmake_3():
    # Bookworm's cmake is 3.25; Horovod's bundled Gloo does not build with CMake 4.
    args = build_args(os.path.join(ROOT, "docker", "Dockerfile.cpu"))
    assert re.fullmatch(r"python:3\.12(\.\d+)?-slim-bookworm", args["PYTHON_IMAGE"])


def test_gpu_image_builds_horovod_with_nccl_and_mpi_on_cuda_12_5_and_python_3_12():
    path = os.path.join(ROOT, "docker", "Dockerfile.gpu")
    args = build_args(path)
    # TensorFlow 2.21 is built for CUDA 12.5 (cuDNN 9.3 comes with its and-cuda extra);
    # Ubuntu 24.04 ships Python 3.12. The image is the second stage, on a base without nvcc.
    assert re.fullmatch(r"nvidia/cuda:12\.5\.\d+-devel-ubuntu24\.04", args["BASE_IMAGE"])
    assert re.fullmatch(r"nvidia/cuda:12\.5\.\d+-base-ubuntu24\.04", args["RUNTIME_IMAGE"])
    assert args["PYTHON_VERSION"] == "3.12"
    assert args["EFA"] == "0" and args["EFA_INSTALLER_VERSION"] and args["AWS_OFI_NCCL_VERSION"]
    # V100 (p3), A100 (p4d) and H100 (p5) must be among the compiled GPU generations.
    assert {"70", "80", "90"} <= set(args["CUDA_CC_LIST"].split(","))
    installs = [run for run in runs(path) if INSTALL_RUN.search(run)]
    for run in installs:
        assert "GPU=1" in run and "MPI=1" in run
    assert 'HOROVOD_BUILD_CUDA_CC_LIST="$CUDA_CC_LIST"' in installs[0]
    # The image's stage installs hvdtrain only (it has no compiler to build Horovod with).
    assert "CODE_ONLY=1" in installs[1]
    apt = " ".join(runs(path))
    for package in ("openmpi-bin", "libopenmpi-dev", "openssh-server", "openssh-client"):
        assert package in apt
    efa = next(run for run in runs(path) if "efa_installer.sh" in run)
    assert efa.startswith('if [ "$EFA" = 1 ]') and "aws-ofi-nccl" in efa


def test_the_gpu_images_last_stage_installs_no_compiler_and_takes_only_the_built_venv():
    stages, current = [], None
    for i in instructions(os.path.join(ROOT, "docker", "Dockerfile.gpu")):
        if i["instruction"] == "FROM":
            current = {"from": i["value"], "runs": [], "copies": []}
            stages.append(current)
        elif current is not None and i["instruction"] in ("RUN", "COPY"):
            current["runs" if i["instruction"] == "RUN" else "copies"].append(i["value"])
    assert [stage["from"] for stage in stages] == ["${BASE_IMAGE} AS build", "${RUNTIME_IMAGE}"]
    final = stages[1]
    assert not re.search(r"\b(g\+\+|gcc|make|cmake|clang|[\w.${}]+-dev)\b", " ".join(final["runs"]))
    assert [c for c in final["copies"] if c.startswith("--from=build")] == [
        "--from=build /opt/aws-ofi-nccl /opt/aws-ofi-nccl", "--from=build /opt/venv /opt/venv"]
    # The CUDA stub is mounted for the checks that may load it, never copied.
    assert all("/opt/cuda-stub" not in c for c in final["copies"])


def left_out_of_the_build_context(path: str) -> bool:
    """Whether a .dockerignore pattern matches `path` or a folder above it (Docker's
    matching, but for `*` crossing a `/`, which these patterns never rely on)."""
    with open(os.path.join(ROOT, ".dockerignore")) as f:
        patterns = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return any(fnmatch.fnmatchcase(prefix, pattern) for pattern in patterns for prefix in prefixes)


@pytest.mark.parametrize("path", [
    ".venv/bin/python", ".venv-gpu/bin/python", "runs/demo/summary.json",
    "shared/run/checkpoints/step-30/meta.json",  # docker/README.md's recipe writes its runs here
    "build/lib/hvdtrain/cli.py", "dist/hvdtrain-0.1.tar.gz", "hvdtrain.egg-info/PKG-INFO",
    "hvdtrain/__pycache__/cli.cpython-311.pyc", ".git/HEAD", "train.log"])
def test_build_context_leaves_out_venvs_run_folders_and_build_outputs(path):
    assert left_out_of_the_build_context(path)


@pytest.mark.parametrize("path", [
    "hvdtrain/cli.py", "launch/install.sh", "launch/patches", "docker/smoke_test.py",
    "docker/start-sshd.sh", "pyproject.toml", "setup.cfg"])
def test_build_context_keeps_what_the_image_installs_and_runs(path):
    assert not left_out_of_the_build_context(path)


def test_install_script_refuses_a_gpu_build_without_cuda_before_doing_anything(tmp_path):
    venv = tmp_path / "venv"
    env = dict(os.environ, GPU="1", HOROVOD_CUDA_HOME=str(tmp_path / "no-cuda"))
    result = subprocess.run(["bash", "launch/install.sh", str(venv)], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"install: error: GPU=1 needs the CUDA toolkit: no working nvcc in {tmp_path}/no-cuda/bin "
        "(set HOROVOD_CUDA_HOME, or NVCC_HOME: see the top of launch/install.sh)")
    assert not venv.exists()


def fake_cuda(folder, release):
    """A CUDA toolkit folder whose bin/nvcc only reports its release, as the real one does."""
    (folder / "bin").mkdir(parents=True)
    nvcc = folder / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release %s, V%s.88'\n" % (release, release))
    nvcc.chmod(0o755)
    return folder


def run_install(tmp_path, **env):
    return subprocess.run(["bash", "launch/install.sh", str(tmp_path / "venv")], cwd=ROOT,
                          env=dict(os.environ, GPU="1", **env), capture_output=True, text=True,
                          timeout=120, check=False)


def test_install_script_refuses_a_cuda_13_nvcc_since_tensorflow_runs_on_cuda_12(tmp_path):
    # This machine's /usr/local/cuda is CUDA 13: kernels built with it would not match
    # the CUDA 12 runtime and NCCL that tensorflow[and-cuda] brings.
    cuda = fake_cuda(tmp_path / "cuda-13", "13.0")
    result = run_install(tmp_path, HOROVOD_CUDA_HOME=str(cuda))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"install: error: GPU=1 needs CUDA 12, which TensorFlow 2.21.0 runs on: {cuda}/bin/nvcc "
        "is CUDA 13.0 (set HOROVOD_CUDA_HOME, or NVCC_HOME: see the top of launch/install.sh)")
    assert not (tmp_path / "venv").exists()


def test_install_script_refuses_an_nvcc_home_without_a_working_nvcc(tmp_path):
    (tmp_path / "empty").mkdir()
    result = run_install(tmp_path, NVCC_HOME=str(tmp_path / "empty"))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"install: error: NVCC_HOME={tmp_path}/empty has no working bin/nvcc")
    assert not (tmp_path / "venv").exists()


def test_make_check_gpu_build_runs_the_gpu_check_make_test_no_gpu_build_and_test_image_both_images():
    with open(os.path.join(ROOT, "Makefile")) as f:
        rules = {name: prerequisites + recipe for name, prerequisites, recipe
                 in re.findall(r"^([\w-]+):(.*)\n((?:\t.*\n)*)", f.read(), re.M)}
    assert rules["check-gpu-build"].strip() == "bash launch/check-gpu-build.sh .venv-gpu"
    assert "gpu" not in rules["test-fast"]
    assert "gpu" not in rules["test"].replace("not image_gpu", "")  # the GPU image deselected
    # The GPU image is tested with the CPU image's, in CI (issue 46): both markers.
    assert '-m "image or image_gpu"' in rules["test-image"]


@pytest.mark.long  # a job of 16 seconds here
@pytest.mark.multiprocess
def test_the_smoke_test_every_image_ends_with_passes_on_two_workers():
    result = horovodrun("python", os.path.join(ROOT, "docker", "smoke_test.py"), timeout=180)
    for rank in (0, 1):
        assert f"[{rank}]<stdout>:smoke test ok: rank {rank} of 2, sum over workers 3" in result.stdout


# --- launch/image.sh, with stand-ins for podman, mmdebstrap and apt-get (no image is built) ---

REGISTRY_DOWN = (  # podman 4's pull where no registry can be reached
    'Resolved "python" as an alias (/etc/containers/registries.conf.d/shortnames.conf)\n'
    "Trying to pull docker.io/library/python:3.12-slim-bookworm...\n"
    "Error: initializing source docker://python:3.12-slim-bookworm: pinging container registry "
    'registry-1.docker.io: Get "https://registry-1.docker.io/v2/": dial tcp: lookup '
    "registry-1.docker.io on 10.0.0.1:53: no such host\n")
FAKE_PODMAN = """#!/bin/sh
echo "$*" >> "$FAKE_LOG"
for arg; do
    case $arg in
        info | import | build) exit 0 ;;
        inspect) exit 1 ;;  # no image here yet
        pull) printf '%s' "$FAKE_PULL_ERROR" >&2; exit 125 ;;
    esac
done
"""
FAKE_MMDEBSTRAP = """#!/bin/sh
for arg; do case $arg in *.tar) echo partial > "$arg" ;; esac; done
echo "mmdebstrap $*" >> "$FAKE_LOG"
exit $FAKE_MMDEBSTRAP_EXIT
"""


def run_image_script(tmp_path, pull_error=REGISTRY_DOWN, mmdebstrap_exit=None, **env):
    """launch/image.sh with podman's pull failing with `pull_error`, and mmdebstrap
    exiting with `mmdebstrap_exit` (None: not installed, nor installable: apt-get fails)."""
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    scripts = {"podman": FAKE_PODMAN, "apt-get": "#!/bin/sh\nexit 100\n"}
    if mmdebstrap_exit is not None:
        scripts["mmdebstrap"] = FAKE_MMDEBSTRAP
    for name, text in scripts.items():
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    (tmp_path / "tmp").mkdir()
    if mmdebstrap_exit is None and shutil.which("mmdebstrap", path="/usr/bin:/bin"):
        pytest.skip("this machine has mmdebstrap: the stand-in cannot hide it")
    result = subprocess.run(
        ["bash", "launch/image.sh"], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env=dict(PATH=f"{stubs}:/usr/bin:/bin", HOME=str(tmp_path), ENGINE="podman",
                 CA_BUNDLE="", TMPDIR=str(tmp_path / "tmp"), FAKE_LOG=str(tmp_path / "calls"),
                 FAKE_PULL_ERROR=pull_error, FAKE_MMDEBSTRAP_EXIT=str(mmdebstrap_exit), **env))
    calls = (tmp_path / "calls").read_text().splitlines() if (tmp_path / "calls").exists() else []
    return result, calls


def test_a_failed_debootstrap_base_says_so_in_one_line_and_leaves_no_tarball(tmp_path):
    result, calls = run_image_script(tmp_path, mmdebstrap_exit=1, BASE="debootstrap")
    assert result.returncode == 2
    assert result.stderr == (
        "image: error: mmdebstrap could not make the Debian bookworm base from "
        "http://deb.debian.org/debian (its messages above; DEBIAN_MIRROR=URL picks another "
        "mirror)\n")
    assert os.listdir(tmp_path / "tmp") == []  # the tarball it began is gone
    assert not any(" build " in f" {call} " for call in calls)


def test_without_a_registry_the_image_is_built_on_a_base_from_debians_packages(tmp_path):
    result, calls = run_image_script(tmp_path, mmdebstrap_exit=0)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # podman's own lines stay out
    assert ("image: no image registry answers (pulling python:3.12-slim-bookworm: Error: "
            "initializing source docker://python:3.12-slim-bookworm: pinging container registry "
            "registry-1.docker.io: Get \"https://registry-1.docker.io/v2/\": dial tcp: lookup "
            "registry-1.docker.io on 10.0.0.1:53: no such host); making the base from Debian's "
            "packages instead (BASE=debootstrap)\n") in result.stdout
    (build,) = [call for call in calls if " build " in f" {call} "]
    assert "--build-arg PYTHON_IMAGE=localhost/hvdtrain-base:bookworm" in build
    assert os.listdir(tmp_path / "tmp") == []


@pytest.mark.parametrize("pull_error, reason", [
    (REGISTRY_DOWN, "no image registry answers (pulling python:3.12-slim-bookworm: Error: "
                    "initializing source docker://python:3.12-slim-bookworm: pinging container "
                    "registry registry-1.docker.io: Get \"https://registry-1.docker.io/v2/\": "
                    "dial tcp: lookup registry-1.docker.io on 10.0.0.1:53: no such host), and "
                    "BASE=debootstrap needs mmdebstrap (as root on Debian or Ubuntu: apt-get "
                    "install mmdebstrap)"),
    ("Trying to pull docker.io/library/python:3.12-slim-bookworm...\n"
     "Error: reading manifest 3.12-slim-bookworm in docker.io/library/python: manifest unknown\n",
     "cannot pull python:3.12-slim-bookworm: Error: reading manifest 3.12-slim-bookworm in "
     "docker.io/library/python: manifest unknown")])
def test_a_pull_that_cannot_be_worked_around_is_refused_in_one_line(tmp_path, pull_error, reason):
    result, calls = run_image_script(tmp_path, pull_error=pull_error)
    assert (result.returncode, result.stderr) == (2, f"image: error: {reason}\n")
    assert not any(" build " in f" {call} " for call in calls)


# --- `make setup`'s flavour: CPU, or GPU=1 ---

def make_setup_dry_run(venv, **env) -> str:
    """What `make setup` would run for `venv` (make -n: nothing is run)."""
    environ = {k: v for k, v in os.environ.items() if k != "GPU"}
    result = subprocess.run(["make", "-n", "setup", f"VENV={venv}"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60, env=dict(environ, **env), check=True)
    return result.stdout


@pytest.mark.parametrize("installed, gpu, installs", [
    ("cpu", "1", "GPU=1 bash launch/install.sh"),   # GPU=1 after a CPU setup: the GPU build
    ("cpu", None, None),                            # up to date
    ("gpu", None, None),                            # unset GPU keeps the venv's flavour
    ("gpu", "0", "GPU=0 bash launch/install.sh"),   # and GPU=0 goes back
])
def test_make_setup_installs_again_when_gpu_changes_the_flavour(tmp_path, installed, gpu, installs):
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / f".hvdtrain-installed-{installed}").touch()  # newer than every prerequisite
    ran = make_setup_dry_run(venv, **({"GPU": gpu} if gpu is not None else {}))
    if installs is None:
        assert "install.sh" not in ran, ran
    else:
        assert f"{installs} {venv}" in ran, ran


def test_gpu_1_builds_the_gpu_image_with_both_stages_on_the_debian_base(tmp_path):
    result, calls = run_image_script(tmp_path, mmdebstrap_exit=0, GPU="1", BASE="debootstrap")
    assert result.returncode == 0, result.stderr
    (build,) = [call for call in calls if " build " in f" {call} "]
    assert f"-f {ROOT}/docker/Dockerfile.gpu -t hvdtrain:gpu" in build
    for arg in ("BASE_IMAGE=localhost/hvdtrain-base:bookworm",
                "RUNTIME_IMAGE=localhost/hvdtrain-base:bookworm", "PYTHON_VERSION=3.11",
                "DEBIAN_MIRROR=http://deb.debian.org/debian"):
        assert f"--build-arg {arg}" in build


def test_gpu_without_a_registry_says_which_cuda_image_it_could_not_pull(tmp_path):
    result, calls = run_image_script(tmp_path, mmdebstrap_exit=0, GPU="1")
    assert result.returncode == 0, result.stderr
    assert ("image: no image registry answers (pulling nvidia/cuda:12.5.1-devel-ubuntu24.04: "
            "Error: initializing source") in result.stdout
    assert [call for call in calls if " build " in f" {call} "]


def test_install_script_code_only_refuses_a_venv_without_tensorflow_and_horovod(tmp_path):
    result = subprocess.run(["bash", "launch/install.sh", str(tmp_path / "venv")], cwd=ROOT,
                            env=dict(os.environ, GPU="1", CODE_ONLY="1"), capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"install: error: CODE_ONLY=1 needs a VENV with TensorFlow and Horovod: {tmp_path}/venv "
        "has no bin/python")


def test_a_gpu_install_into_a_cpu_venv_removes_tensorflow_cpu_before_installing_tensorflow(tmp_path):
    """GPU=1 make setup after a CPU one: tensorflow-cpu and tensorflow are one package
    under two names, and would overwrite each other's files. (pip is a stand-in that logs.)"""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    os.symlink(sys.executable, venv / "bin" / "python")
    (venv / "bin" / "pip").write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/pip.log\n'
                                      '[ "$1 $3" = "show tensorflow-cpu" ] || [ "$1" != show ]\n')
    (venv / "bin" / "pip").chmod(0o755)
    nccl = tmp_path / "nccl" / "include"
    nccl.mkdir(parents=True)
    (nccl / "nccl.h").touch()
    run_install(tmp_path, HOROVOD_CUDA_HOME=str(fake_cuda(tmp_path / "cuda", "12.5")),
                HOROVOD_NCCL_HOME=str(nccl.parent))
    pip = (tmp_path / "pip.log").read_text().splitlines()
    assert pip[:3] == ["show -q tensorflow-cpu", "uninstall -q -y tensorflow-cpu",
                       "install -q tensorflow[and-cuda]==2.21.0"]
