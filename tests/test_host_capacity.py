"""Whether a host can hold the workers started on it: the arithmetic (pure), the job's
workers already running (read from a fake /proc), and the one line every refused worker
says before TensorFlow starts."""

from __future__ import annotations

import pytest

from hvdtrain import cli
from hvdtrain.errors import ConfigError
from hvdtrain.machine.host_capacity import (MIB, WORKER_FLOOR_BYTES, check_this_host, cores_warning,
                                    mem_available, memory_problem, rendezvous_timeout)
from hvdtrain.machine.share import MachineShare
from hvdtrain.machine.running_workers import memory_held_by_peers
from hvdtrain.training import start

MEMINFO = "MemTotal:       24576000 kB\nMemFree:  100 kB\nMemAvailable:   {kib} kB\n"


def test_available_memory_is_read_from_meminfo_in_bytes():
    assert mem_available(MEMINFO.format(kib=2048)) == 2 * MIB
    with pytest.raises(ValueError, match="no MemAvailable"):
        mem_available("MemTotal: 1 kB\n")


def test_workers_that_fit_the_available_memory_are_no_problem():
    assert memory_problem(32, 32 * 400 * MIB, floor=400 * MIB) is None


def test_too_many_workers_for_the_memory_is_one_line_naming_the_values_and_how_many_fit():
    problem = memory_problem(32, 4000 * MIB, floor=400 * MIB)
    assert problem == ("32 workers on this host need at least 12800 MiB (400 MiB each, the "
                       "least a worker was measured to take) but it has 4000 MiB available: "
                       "start at most 10 here")


def test_more_workers_than_cores_is_a_warning_with_the_workers_per_core():
    assert cores_warning(2, 2) is None and cores_warning(8, 64) is None
    assert cores_warning(32, 2).startswith(
        "hvdtrain: warning: 32 workers share 2 core(s) on this host (16 a core)")


def _meminfo(tmp_path, workers_that_fit: int) -> str:
    path = tmp_path / "meminfo"
    path.write_text(MEMINFO.format(kib=workers_that_fit * WORKER_FLOOR_BYTES // 1024))
    return str(path)


def test_a_host_too_small_is_named_by_every_worker_refused(tmp_path):
    meminfo = _meminfo(tmp_path, workers_that_fit=3)
    for local_rank in range(4):
        with pytest.raises(ConfigError, match="4 workers on this host need .* start at most 3 here"):
            check_this_host(MachineShare(4, local_rank, rank=local_rank), {}, meminfo)


def test_only_rank_0_warns_of_more_workers_than_cores(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    meminfo = _meminfo(tmp_path, workers_that_fit=8)
    check_this_host(MachineShare(8, 1, rank=1), {}, meminfo)
    assert capsys.readouterr().out == ""
    check_this_host(MachineShare(8, 0, rank=0), {}, meminfo)
    assert capsys.readouterr().out.startswith("hvdtrain: warning: 8 workers share 2 core(s)")


def test_a_bare_process_has_nothing_to_check(tmp_path):
    check_this_host(MachineShare(), {}, str(tmp_path / "no-such-file"))  # reads nothing


@pytest.mark.parametrize("local_rank", ["0", "1"])
def test_hvdtrain_train_refuses_a_host_too_small_in_one_line_from_every_worker(
        monkeypatch, capsys, local_rank):
    monkeypatch.setattr(start, "_started", None)  # a fresh worker process, as horovodrun's
    monkeypatch.setenv("HOROVOD_LOCAL_SIZE", "100000")
    monkeypatch.setenv("HOROVOD_LOCAL_RANK", local_rank)
    assert cli.main(["train", "--model", "lenet"]) == ConfigError.exit_code
    err = capsys.readouterr().err
    assert err.startswith("hvdtrain: error: 100000 workers on this host need at least")
    assert len(err.splitlines()) == 1


def test_workers_crowded_on_few_cores_wait_twice_their_import_time_for_the_last_one():
    assert rendezvous_timeout(2, 2) is None and rendezvous_timeout(6, 2) is None  # 30 s do
    assert rendezvous_timeout(8, 2) == 32
    assert rendezvous_timeout(16, 2) == 64 and rendezvous_timeout(32, 2) == 128
    assert rendezvous_timeout(32, 64) is None


def test_workers_already_running_are_asked_only_what_they_lack_of_the_floor():
    floor = 400 * MIB
    # 3 of 4 workers hold their floor already: the 4th needs its own, and 1000 MiB do.
    assert memory_problem(4, 1000 * MIB, floor=floor, peers_held=[floor] * 3) is None
    # Started together, the others hold little yet: nearly all of every floor is needed.
    problem = memory_problem(4, 1000 * MIB, floor=floor, peers_held=[100 * MIB] * 3)
    assert problem == ("4 workers on this host, 3 of them running already, need at least "
                       "1300 MiB more (400 MiB each, the least a worker was measured to "
                       "take) but it has 1000 MiB available: start at most 3 here")


JOB = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": "4321"}


def _process(proc, pid: int, parent: int, environ: dict[str, str], held_mib: int) -> None:
    folder = proc / str(pid)
    folder.mkdir()
    folder.joinpath("environ").write_bytes(
        b"".join(f"{k}={v}".encode() + b"\0" for k, v in environ.items()))
    folder.joinpath("status").write_text(
        f"Name:\tpython\nPPid:\t{parent}\nRssAnon:\t{held_mib * 1024} kB\n")


def _worker(rank: int, host: str = "h1", **extra: str) -> dict[str, str]:
    return dict(JOB, HOROVOD_RANK=str(rank), HOROVOD_HOSTNAME=host, **extra)


def _running_host(tmp_path, held_mib: int):
    """A fake /proc of 3 of a host's workers running, each holding `held_mib`."""
    proc = tmp_path / "proc"
    proc.mkdir()
    for rank in range(3):
        _process(proc, 100 + rank, 1, _worker(rank), held_mib)
    return proc


def test_the_running_workers_are_the_jobs_on_this_host_without_their_wrappers(tmp_path):
    proc = _running_host(tmp_path, held_mib=300)
    _process(proc, 200, 1, _worker(3), 3)      # a shell script that runs the late worker
    _process(proc, 201, 200, _worker(3), 20)   # the late worker itself: this process
    _process(proc, 300, 1, dict(_worker(0), HOROVOD_GLOO_RENDEZVOUS_PORT="999"), 5)  # another job
    _process(proc, 400, 1, _worker(5, host="h2"), 5)  # the job's worker on another host
    _process(proc, 500, 1, {"PATH": "/bin"}, 5)       # not a worker
    assert memory_held_by_peers(_worker(3), str(proc), me=201) == [300 * MIB] * 3
    # On emulated hosts the whole job's workers on this machine share it.
    shared = dict(_worker(3), HVDTRAIN_HOSTS_SHARE_ONE_MACHINE="1")
    assert memory_held_by_peers(shared, str(proc), me=201) == [300 * MIB] * 3 + [5 * MIB]


def test_a_late_worker_is_not_refused_for_the_memory_its_running_peers_hold(tmp_path):
    """3 of a host's 4 workers run, each holding its floor already (which the host's
    available memory no longer includes); the 4th starts late, as an elastic host taken
    back does, with room for itself alone."""
    proc = _running_host(tmp_path, held_mib=WORKER_FLOOR_BYTES // MIB + 50)
    meminfo = _meminfo(tmp_path, workers_that_fit=1)
    late = MachineShare(4, 3, rank=3)
    check_this_host(late, _worker(3), meminfo, proc=str(proc))  # no error
    (tmp_path / "no-workers").mkdir()
    with pytest.raises(ConfigError, match="4 workers on this host need"):  # all 4 to come
        check_this_host(late, _worker(3), meminfo, proc=str(tmp_path / "no-workers"))
