"""How many workers share this machine, read once from horovodrun's environment."""

from __future__ import annotations

from hvdtrain.machine_share import MachineShare

# Worker 5 of 32: the second of its host's 4 (8 emulated hosts of 4 workers).
WORKER = {"HOROVOD_RANK": "5", "HOROVOD_SIZE": "32", "HOROVOD_LOCAL_RANK": "1",
          "HOROVOD_LOCAL_SIZE": "4", "HOROVOD_HOSTNAME": "h2"}
SHARED = {**WORKER, "HVDTRAIN_HOSTS_SHARE_ONE_MACHINE": "1"}


def test_a_bare_process_is_one_worker_alone():
    assert MachineShare.from_environ({}) == MachineShare(workers=1, index=0, rank=0)


def test_a_hosts_workers_share_its_machine():
    assert MachineShare.from_environ(WORKER) == MachineShare(workers=4, index=1, rank=5)
    assert MachineShare.from_environ({**WORKER, "HVDTRAIN_HOSTS_SHARE_ONE_MACHINE": "0"}) == \
        MachineShare(workers=4, index=1, rank=5)


def test_on_emulated_hosts_the_whole_jobs_workers_share_the_machine():
    assert MachineShare.from_environ(SHARED) == MachineShare(workers=32, index=5, rank=5)
