"""Whether a host can hold the workers started on it: the arithmetic (pure), and the one
line a worker says before TensorFlow starts."""

from __future__ import annotations

import pytest

from hvdtrain import cli
from hvdtrain.errors import ConfigError
from hvdtrain.host_capacity import (MIB, WORKER_FLOOR_BYTES, check_this_host, cores_warning,
                                    mem_available, memory_problem, rendezvous_timeout)
from hvdtrain.machine_share import MachineShare
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


def test_a_host_too_small_is_named_by_its_first_worker_and_the_others_exit_quietly(
        tmp_path, capsys):
    meminfo = _meminfo(tmp_path, workers_that_fit=3)
    with pytest.raises(ConfigError, match="4 workers on this host need .* start at most 3 here"):
        check_this_host(MachineShare(4, 0, rank=4), meminfo)
    with pytest.raises(SystemExit) as exited:
        check_this_host(MachineShare(4, 1, rank=5), meminfo)
    assert exited.value.code == ConfigError.exit_code
    assert capsys.readouterr().out == ""


def test_only_rank_0_warns_of_more_workers_than_cores(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    meminfo = _meminfo(tmp_path, workers_that_fit=8)
    check_this_host(MachineShare(8, 1, rank=1), meminfo)
    assert capsys.readouterr().out == ""
    check_this_host(MachineShare(8, 0, rank=0), meminfo)
    assert capsys.readouterr().out.startswith("hvdtrain: warning: 8 workers share 2 core(s)")


def test_a_bare_process_has_nothing_to_check(tmp_path):
    check_this_host(MachineShare(), str(tmp_path / "no-such-file"))  # reads nothing


def test_hvdtrain_train_refuses_a_host_too_small_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(start, "_started", None)  # a fresh worker process, as horovodrun's
    monkeypatch.setenv("HOROVOD_LOCAL_SIZE", "100000")
    monkeypatch.setenv("HOROVOD_LOCAL_RANK", "0")
    assert cli.main(["train", "--model", "lenet"]) == ConfigError.exit_code
    err = capsys.readouterr().err
    assert err.startswith("hvdtrain: error: 100000 workers on this host need at least")
    assert len(err.splitlines()) == 1


def test_workers_crowded_on_few_cores_wait_twice_their_import_time_for_the_last_one():
    assert rendezvous_timeout(2, 2) is None and rendezvous_timeout(6, 2) is None  # 30 s do
    assert rendezvous_timeout(8, 2) == 32
    assert rendezvous_timeout(16, 2) == 64 and rendezvous_timeout(32, 2) == 128
    assert rendezvous_timeout(32, 64) is None
