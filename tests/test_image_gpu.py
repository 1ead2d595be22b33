"""The GPU image built here (`make image GPU=1 BASE=debootstrap`) and run on CPU: what it
was built with, that its final stage holds no compiler, and docker/README.md's
multi-node recipe with it as the hosts of an emulated cluster (`make test-image`, in CI,
and `make test-image-gpu` alone; root and podman).

The module's fixture builds hvdtrain:gpu with `launch/image.sh`: the first time from
scratch (Horovod compiles its CUDA kernels; 10.5 minutes here from an empty store),
then from the engine's layer cache: seconds, or about 3 minutes after a change to
hvdtrain's code. There is no GPU: the checks are those that need none.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import time

import pytest

from test_image import (_cannot_run_images, _env, _machine_containers, _run_containers_left,
                        podman_run, readme_recipe_trains_across_two_hosts,
                        sync_and_local_jobs_end_in_consensus)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGE = os.environ.get("HVDTRAIN_TEST_GPU_IMAGE", "hvdtrain:gpu")

pytestmark = [pytest.mark.skipif(_cannot_run_images() is not None,
                                 reason=f"cannot run the image here: {_cannot_run_images()}"),
              pytest.mark.image_gpu, pytest.mark.slow, pytest.mark.multiprocess,
              pytest.mark.timeout(3600)]  # the first build compiles Horovod for CUDA


@pytest.fixture(scope="module")
def image() -> str:
    built = subprocess.run(["bash", os.path.join(ROOT, "launch", "image.sh")], capture_output=True,
                           text=True, timeout=3600,
                           env=dict(_env(), BASE="debootstrap", GPU="1", IMAGE=IMAGE))
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return IMAGE


def _idle_container_cgroups() -> set[str]:
    """Container cgroups (podman's cgroupfs manager names them libpod-ID) that hold no
    process: what a container that is gone leaves if it leaks its cgroup."""
    idle = set()
    for folder in glob.glob("/sys/fs/cgroup/*/libpod_parent/libpod-*"):
        try:
            with open(os.path.join(folder, "cgroup.procs"), encoding="utf-8") as fh:
                if not fh.read().strip():
                    idle.add(folder)
        except OSError:  # removed meanwhile
            pass
    return idle


@pytest.fixture(scope="module", autouse=True)
def leaves_nothing():
    """After the module: no container in the machine's store or of a run, no run mount,
    and no container cgroup left by these tests (other users' containers come and go:
    a new idle cgroup counts once it stays for 20 seconds)."""
    containers, cgroups = _machine_containers(), _idle_container_cgroups()
    yield
    deadline = time.monotonic() + 20
    while _idle_container_cgroups() - cgroups and time.monotonic() < deadline:
        time.sleep(1)
    assert not _idle_container_cgroups() - cgroups
    assert _machine_containers() <= containers and not _run_containers_left()
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        assert "hvdtrain-cluster" not in fh.read()


def in_image(image: str, script: str) -> subprocess.CompletedProcess:
    result = podman_run(image, "python", "-c", script)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result


def test_horovod_in_the_gpu_image_has_nccl_mpi_and_gloo(image):
    result = podman_run(image, "horovodrun", "--check-build")
    assert result.returncode == 0, result.stdout + result.stderr
    for feature in ("TensorFlow", "MPI", "Gloo", "NCCL"):
        assert any(line.strip() == f"[X] {feature}" for line in result.stdout.splitlines()), \
            (feature, result.stdout)


CUDA_LIBRARIES = """
import ctypes, json, os
import tensorflow as tf
nvidia = os.path.join(os.path.dirname(os.path.dirname(tf.__file__)), "nvidia")
info = tf.sysconfig.get_build_info()
loaded = []
for folder, name in [("cudnn", "libcudnn.so.%s" % info["cudnn_version"]),
                     ("cublas", "libcublas.so.%s" % info["cuda_version"].split(".")[0]),
                     ("nccl", "libnccl.so.2")]:
    ctypes.CDLL(os.path.join(nvidia, folder, "lib", name))
    loaded.append(name)
print(json.dumps({"cuda_build": tf.test.is_built_with_cuda(), "loaded": loaded,
                  "cuda": info["cuda_version"], "cudnn": info["cudnn_version"]}))
"""


def test_tensorflow_is_a_cuda_build_whose_cudnn_cublas_and_nccl_load(image):
    """The libraries TensorFlow was built for (its build info), from the wheels its
    and-cuda extra installed, load: all that can be checked without a driver."""
    found = json.loads(in_image(image, CUDA_LIBRARIES).stdout.strip().splitlines()[-1])
    assert found["cuda_build"] is True
    assert found["cuda"].startswith("12.") and found["cudnn"] == "9"
    assert found["loaded"] == ["libcudnn.so.9", "libcublas.so.12", "libnccl.so.2"]


def test_the_gpu_image_passes_its_smoke_test_on_cpu_and_keeps_no_compiler(image):
    smoke = podman_run(image, "horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", "python",
                       "docker/smoke_test.py")
    assert smoke.returncode == 0, smoke.stdout[-2000:] + smoke.stderr[-2000:]
    assert smoke.stdout.count("smoke test ok") == 2
    # The first stage's nvcc, compilers and CUDA stub stay there; so does the CA bundle.
    left = podman_run(image, "sh", "-c",
                      "for tool in nvcc gcc g++ cc c++ cicc; do command -v $tool; done; "
                      "find / -xdev \\( -name nvcc -o -name 'libcuda.so*' -o -name cuda-stub "
                      "-o -name nvcc-cu12 -o -name cuda-from-wheels \\) -print; "
                      "test -e /run/secrets/ca-bundle && echo ca-bundle; true")
    assert left.returncode == 0 and left.stdout == "", left.stdout + left.stderr


def test_the_docker_readme_recipe_runs_on_two_gpu_image_hosts_and_leaves_nothing(image, tmp_path):
    readme_recipe_trains_across_two_hosts(image, tmp_path)


def test_sync_and_local_jobs_across_gpu_image_hosts_end_in_consensus(image, tmp_path):
    sync_and_local_jobs_end_in_consensus(image, tmp_path)
    assert not _run_containers_left()
