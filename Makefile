# Two commands on a fresh machine: `make demo` (a short two-worker training) and `make test`.
VENV ?= .venv
BIN := $(VENV)/bin
# GPU=1: tensorflow[and-cuda] and Horovod with NCCL (launch/install.sh). The stamp names
# the flavour, so `GPU=1 make setup` after a CPU setup installs again (GPU=0 goes back);
# unset, GPU keeps the flavour the venv has.
VENV_FLAVOUR := $(if $(wildcard $(VENV)/.hvdtrain-installed-gpu),gpu,cpu)
FLAVOUR := $(if $(GPU),$(if $(filter 1,$(GPU)),gpu,cpu),$(VENV_FLAVOUR))
STAMP := $(VENV)/.hvdtrain-installed-$(FLAVOUR)
WORKERS ?= 2
EPOCHS ?= 2
VERBOSE ?= $(HVDTRAIN_VERBOSE)

.PHONY: setup setup-slurm demo test test-ci test-all test-long test-scale test-fast test-cluster test-slurm image test-image test-image-gpu check-gpu-build gpu-check clean

setup: $(STAMP)

$(STAMP): launch/install.sh launch/quiet-horovodrun.sh $(wildcard launch/patches/*.patch) setup.cfg pyproject.toml
	GPU=$(if $(filter gpu,$(FLAVOUR)),1,0) bash launch/install.sh $(VENV)
	rm -f $(VENV)/.hvdtrain-installed*
	touch $@

# The main job: synchronous data parallelism over WORKERS processes on Fashion-MNIST,
# launched as the docs launch it. The venv's horovodrun drops TensorFlow's start-up
# notices of its own Gloo build check (launch/quiet-horovodrun.sh); the workers' own are
# dropped by hvdtrain itself. VERBOSE=1 keeps them all.
demo: setup
	PATH=$(abspath $(BIN)):$$PATH HVDTRAIN_VERBOSE=$(VERBOSE) \
		horovodrun -np $(WORKERS) -H localhost:$(WORKERS) --gloo \
		hvdtrain train --model lenet --dataset fashion-mnist --epochs $(EPOCHS)

test: setup
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m pytest -m "not cluster and not image and not image_gpu and not long and not scale and not slurm" $(PYTEST_ARGS)

# The jobs of 8 seconds or more each here (the two-worker jobs of every round form, killed
# and hung workers, elastic resizes, sweeps, benches, bitwise repeats), kept out of `make
# test` to hold it to 8 minutes here (docs/development.md has what each target costs).
# CI runs those marked `ci` (test-ci).
test-long: setup
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m pytest -m "long and not cluster and not image" $(PYTEST_ARGS)

# What CI runs after `make test` (.ci/run): the real jobs marked `ci` among test-long's and
# test-cluster's, a job or two per feature (the two-worker jobs of every round form, a
# killed and an elastic job, a sweep, a bench, two hosts over ssh, an elastic host lost),
# sized to CI's 45-minute budget on this project's slowest 2-core machine.
test-ci: setup
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m pytest -m "ci and not image and not slurm" $(PYTEST_ARGS)

# Every test: what CI runs and the rest of the long, scale, cluster, Slurm and image sets.
test-all: test test-long test-scale test-cluster test-slurm test-image

# One job of 16 workers on this machine (LeNet, 3 steps: consensus, summary.json, each
# worker's thread pools, rank 0's one warning), kept out of `make test` for its start-up
# (16 TensorFlows on 2 cores): 4 tests.
test-scale: setup
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m pytest -m scale $(PYTEST_ARGS)

# Horovod jobs on an emulated cluster (hvdtrain cluster: root, namespaces, sshd):
# 17 tests; CI runs the three marked `ci` (test-ci); skipped, with the reason, without root.
test-cluster: setup
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m pytest -m cluster $(PYTEST_ARGS)

# Slurm and Open MPI on an emulated cluster (hvdtrain cluster --slurm, mpirun over ssh):
# as root, installs Debian's slurm-wlm, munge and Open MPI without starting a daemon,
# and builds Horovod with MPI into $(MPI_VENV) (the wheel is cached; ~5 minutes the
# first time here). Skipped, with the reason, without root.
MPI_VENV ?= .venv-mpi
setup-slurm:
	bash launch/install-packages.sh slurm-wlm munge openmpi-bin libopenmpi-dev
	MPI=1 bash launch/install.sh $(MPI_VENV)

test-slurm: setup
	$(MAKE) setup-slurm || echo "test-slurm: cannot install Slurm or Open MPI here; their tests will be skipped"
	PATH=$(abspath $(BIN)):$$PATH HVDTRAIN_MPI_VENV=$(abspath $(MPI_VENV)) $(BIN)/python -m pytest -m slurm $(PYTEST_ARGS)

# hvdtrain:cpu from docker/Dockerfile.cpu, with podman or docker (launch/image.sh; as root it
# installs podman when neither runs). BASE=debootstrap: the Python base from Debian's
# packages, which it also falls back to where no image registry answers. About 6 minutes
# the first time here (6.2 measured: docker/README.md), seconds after.
image:
	BASE=$(BASE) GPU=$(GPU) bash launch/image.sh

# The images as the hosts of an emulated cluster (root, podman): builds hvdtrain:cpu and
# hvdtrain:gpu first (cached), from Debian's packages, and runs both images' tests. Podman and mmdebstrap are installed first where they can be (root, apt); where
# they cannot, the tests are skipped with the reason. From an empty image store here the
# CPU image took 6 minutes and the GPU image (CUDA wheels, an nvcc, Horovod's CUDA kernels)
# the time docker/README.md gives; cached, seconds, and a change to hvdtrain's code a few
# minutes each. A change to launch/install.sh or launch/patches compiles Horovod again.
test-image: setup
	BASE=debootstrap bash launch/image.sh engine || echo "test-image: no container engine here; its tests will be skipped"
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m pytest -m "image or image_gpu" $(PYTEST_ARGS)

# The GPU image's tests alone (tests/test_image_gpu.py), for work on docker/Dockerfile.gpu.
test-image-gpu: setup
	BASE=debootstrap bash launch/image.sh engine || echo "test-image-gpu: no container engine here; its tests will be skipped"
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m pytest -m image_gpu $(PYTEST_ARGS)

# Unit tests only: no horovodrun, no full training (about a minute here).
test-fast: setup
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m pytest -m "not multiprocess and not slow" $(PYTEST_ARGS)

# The GPU build (tensorflow[and-cuda], Horovod with NCCL) compiled afresh in .venv-gpu; needs
# no GPU. Not part of `make test`: it downloads gigabytes (launch/check-gpu-build.sh).
check-gpu-build:
	bash launch/check-gpu-build.sh .venv-gpu

# For a GPU host (GPU=1 make setup first): 2 workers on 2 GPUs train ResNet-50 on random
# images kept on the GPUs for 300 steps; checks the allreduces ran through NCCL and both
# ranks end with the same weights, and prints images/sec per GPU beside NVIDIA's published
# figure (hvdtrain/benchmarks/gpu_check.py). Without two GPUs it says so and fails.
# GPU_CHECK_ARGS="--precision fp32" (default amp), "--steps N".
gpu-check: setup
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m hvdtrain.benchmarks.gpu_check $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) .venv-gpu build *.egg-info .pytest_cache
