"""Making the host groups of hierarchical local SGD (`comm.init(host_groups=True)`), with
Horovod faked: two hosts of one worker each, seen from rank 0."""

from __future__ import annotations

import os

import pytest

from hvdtrain import comm
from hvdtrain.errors import ConfigError
from hvdtrain.machine.host_layout import HOST_SIZES


class TwoHostsHorovod:
    """Horovod started already, whose `add_process_set` fails with `error`."""

    def __init__(self, error: Exception):
        self.error = error

    def is_initialized(self):
        return True

    def allgather_object(self, name):
        return ["h1", "h2"]

    def rank(self):
        return 0

    def add_process_set(self, ranks):
        raise self.error


@pytest.fixture
def two_hosts(monkeypatch):
    monkeypatch.setattr(comm, "_host_group", None)
    monkeypatch.setattr(comm, "_wants_host_groups", False)

    def with_horovod(error: Exception, dynamic: bool):
        monkeypatch.setattr(comm, "hvd", TwoHostsHorovod(error))
        if dynamic:
            monkeypatch.setenv(comm.DYNAMIC_PROCESS_SETS, "1")
        else:
            monkeypatch.delenv(comm.DYNAMIC_PROCESS_SETS, raising=False)
    return with_horovod


def test_horovod_shutting_down_while_host_groups_are_made_keeps_horovods_own_error(two_hosts):
    # An elastic reset makes the groups again; a peer lost meanwhile shuts Horovod down.
    two_hosts(ValueError("Horovod is shutting down."), dynamic=True)
    with pytest.raises(ValueError, match="Horovod is shutting down"):
        comm.init(host_groups=True)


def test_host_groups_from_a_horovod_started_without_process_sets_are_refused_in_one_line(
        two_hosts):
    two_hosts(AssertionError("add_process_set must not be called"), dynamic=False)
    with pytest.raises(ConfigError, match="--hierarchical-sgd must start Horovod itself"):
        comm.init(host_groups=True)


class StartingHorovod:
    """Horovod not started yet, on two hosts of two workers each, seen from rank 0."""

    ProcessSet = staticmethod(lambda ranks: FakeProcessSet(list(ranks)))

    def __init__(self):
        self.started_with = None
        self.added: list[list[int]] = []

    def is_initialized(self):
        return self.started_with is not None

    def init(self, process_sets=None):
        self.started_with = process_sets

    def allgather_object(self, name):
        return ["h1", "h1", "h2", "h2"]

    def rank(self):
        return 0

    def add_process_set(self, ranks):
        self.added.append(list(ranks))
        return FakeProcessSet(list(ranks))


class FakeProcessSet:
    def __init__(self, ranks):
        self.ranks = ranks


HOROVODRUN_RANK_0_OF_2_HOSTS_OF_2 = {
    HOST_SIZES: "2,2", "HOROVOD_HOSTNAME": "h1", "HOROVOD_RANK": "0", "HOROVOD_SIZE": "4",
    "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "2",
    "HOROVOD_CROSS_RANK": "0", "HOROVOD_CROSS_SIZE": "2"}


@pytest.fixture
def starting(monkeypatch):
    monkeypatch.setattr(comm, "_host_group", None)
    monkeypatch.setattr(comm, "_peer_group", None)
    monkeypatch.setattr(comm, "_started_sets", {})
    monkeypatch.setattr(comm, "_started_layout", None)
    monkeypatch.setattr(comm, "_wants_host_groups", False)
    monkeypatch.setattr(comm, "_worlds_started", 0)
    monkeypatch.setattr(comm, "end_with_launcher", lambda: False)
    monkeypatch.delenv(comm.DYNAMIC_PROCESS_SETS, raising=False)
    for name in HOROVODRUN_RANK_0_OF_2_HOSTS_OF_2:
        monkeypatch.delenv(name, raising=False)

    def with_horovod(horovod: StartingHorovod, env: dict[str, str]):
        monkeypatch.setattr(comm, "hvd", horovod)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return horovod
    return with_horovod


def test_equal_hosts_under_hvdtrains_horovodrun_start_horovod_with_the_groups_and_add_none(starting):
    horovod = starting(StartingHorovod(), HOROVODRUN_RANK_0_OF_2_HOSTS_OF_2)
    comm.init(host_groups=True)
    assert [ps.ranks for ps in horovod.started_with] == [[0, 1], [2, 3], [0, 2], [1, 3]]
    assert horovod.added == []
    assert comm.host_group().process_set is horovod.started_with[0]
    assert comm.peer_group().process_set is horovod.started_with[2]


def test_without_hvdtrains_horovodruns_host_sizes_horovod_starts_dynamic_and_the_groups_are_added(
        starting):
    # Horovod's own horovodrun gives a worker its place but not the host sizes.
    horovod = starting(StartingHorovod(), {k: v for k, v in HOROVODRUN_RANK_0_OF_2_HOSTS_OF_2.items()
                                           if k != HOST_SIZES})
    # hvd.init(process_sets="dynamic") sets this itself; the fake does not.
    real_init = horovod.init
    horovod.init = lambda process_sets=None: (
        os.environ.__setitem__(comm.DYNAMIC_PROCESS_SETS, "1"), real_init(process_sets))
    comm.init(host_groups=True)
    assert horovod.started_with == "dynamic"
    assert horovod.added == [[0, 1], [2, 3], [0, 2], [1, 3]]


def test_host_names_that_disagree_with_horovodruns_places_are_refused(starting):
    horovod = starting(StartingHorovod(), HOROVODRUN_RANK_0_OF_2_HOSTS_OF_2)
    horovod.allgather_object = lambda name: ["h1", "h2", "h1", "h2"]
    with pytest.raises(ConfigError, match=r"host names group them as \[\[0, 2\], \[1, 3\]\], but horovodrun.s environment as \[\[0, 1\], \[2, 3\]\]"):
        comm.init(host_groups=True)


def test_one_host_under_hvdtrains_horovodrun_starts_horovod_without_sets_or_dynamic_mode(starting):
    horovod = starting(StartingHorovod(), {**HOROVODRUN_RANK_0_OF_2_HOSTS_OF_2,
                                           HOST_SIZES: "4", "HOROVOD_LOCAL_SIZE": "4",
                                           "HOROVOD_CROSS_SIZE": "1"})
    horovod.allgather_object = lambda name: ["h1"] * 4
    comm.init(host_groups=True)
    assert horovod.started_with == [] and horovod.added == []
    assert comm.host_groups_at_start() and comm.host_group().process_set is None
    assert comm.host_group().ranks == (0, 1, 2, 3) and comm.peer_group() is None
