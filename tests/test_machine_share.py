"""How many workers share this machine, read once from horovodrun's environment."""

from __future__ import annotations

from hvdtrain.machine.share import MachineShare, shares_the_machine

# Worker 5 of 32: the second of its host's 4 (8 emulated hosts of 4 workers).
WORKER = {"HOROVOD_RANK": "5", "HOROVOD_SIZE": "32", "HOROVOD_LOCAL_RANK": "1",
          "HOROVOD_LOCAL_SIZE": "4", "HOROVOD_HOSTNAME": "h2",
          "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": "4321"}
SHARED = {**WORKER, "HVDTRAIN_HOSTS_SHARE_ONE_MACHINE": "1"}


def test_a_bare_process_is_one_worker_alone():
    assert MachineShare.from_environ({}) == MachineShare(workers=1, index=0, rank=0)


def test_a_hosts_workers_share_its_machine():
    assert MachineShare.from_environ(WORKER) == MachineShare(workers=4, index=1, rank=5)
    assert MachineShare.from_environ({**WORKER, "HVDTRAIN_HOSTS_SHARE_ONE_MACHINE": "0"}) == \
        MachineShare(workers=4, index=1, rank=5)


def test_on_emulated_hosts_the_whole_jobs_workers_share_the_machine():
    assert MachineShare.from_environ(SHARED) == MachineShare(workers=32, index=5, rank=5)


def test_under_mpirun_open_mpis_names_give_the_workers_place_before_horovod_starts():
    mpi = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "32",
           "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
    assert MachineShare.from_environ(mpi) == MachineShare(workers=4, index=1, rank=5)
    assert MachineShare.from_environ({**mpi, "HVDTRAIN_HOSTS_SHARE_ONE_MACHINE": "1"}) == \
        MachineShare(workers=32, index=5, rank=5)
    # horovodrun's own names win where both are set
    assert MachineShare.from_environ({**WORKER, **mpi, "HOROVOD_RANK": "7"}).rank == 7


def test_a_process_shares_the_machine_if_it_is_a_worker_of_the_same_job_and_host():
    assert shares_the_machine(WORKER, {**WORKER, "HOROVOD_RANK": "4"})
    assert not shares_the_machine(WORKER, {**WORKER, "HOROVOD_HOSTNAME": "h3"})
    assert not shares_the_machine(WORKER, {**WORKER, "HOROVOD_GLOO_RENDEZVOUS_PORT": "1"})
    assert not shares_the_machine(WORKER, {"PATH": "/bin"})
    # Emulated hosts: the job's workers of every host.
    assert shares_the_machine(SHARED, {**WORKER, "HOROVOD_HOSTNAME": "h3"})
    # Outside horovodrun nothing tells a job's workers apart: none is counted.
    assert not shares_the_machine({}, {})
