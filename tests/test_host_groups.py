"""Making the host groups of hierarchical local SGD (`comm.init(host_groups=True)`), with
Horovod faked: two hosts of one worker each, seen from rank 0."""

from __future__ import annotations

import pytest
import tensorflow as tf

from hvdtrain import comm
from hvdtrain.errors import ConfigError


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


class RecordingHorovod:
    """Four workers on two hosts of two (ranks 0, 1 and 2, 3), seen from rank 0, in a world
    where every worker sends what rank 0 does: records what its alltoalls are handed."""

    def __init__(self):
        self.alltoalls: list[tuple[list[float], list[int]]] = []
        self.process_sets: list[list[int]] = []
        self.global_process_set = object()

    def is_initialized(self):
        return True

    def allgather_object(self, name):
        return ["h1", "h1", "h2", "h2"]

    def rank(self):
        return 0

    def size(self):
        return 4

    def add_process_set(self, ranks):
        self.process_sets.append(list(ranks))
        return tuple(ranks)

    def alltoall(self, tensor, splits=None, name=None, process_set=None):
        self.alltoalls.append((tensor.numpy().tolist(), list(splits)))
        mine = splits[0]  # every sender's rows for rank 0 are what rank 0 sends to itself
        got = tf.concat([tensor[:mine]] * sum(1 for part in splits if part), axis=0)
        return got, tf.constant(splits)


@pytest.fixture
def recorded(monkeypatch):
    monkeypatch.setattr(comm, "_host_group", None)
    monkeypatch.setattr(comm, "_peer_group", None)
    monkeypatch.setattr(comm, "_wants_host_groups", False)
    monkeypatch.setenv(comm.DYNAMIC_PROCESS_SETS, "1")
    horovod = RecordingHorovod()
    monkeypatch.setattr(comm, "hvd", horovod)
    comm.init(host_groups=True)
    return horovod


def test_the_peer_groups_are_routed_through_the_worlds_alltoalls_not_process_sets(recorded):
    # Horovod coordinates every process set every cycle; sets spanning hosts cost NICs.
    assert recorded.process_sets == [[0, 1], [2, 3]]
    peers = comm.peer_group()
    assert peers.ranks == (0, 2) and peers.routed and peers.process_set is None


def test_a_routed_alltoall_and_allgather_send_nothing_to_workers_outside_the_group(recorded):
    peers = comm.peer_group()
    comm.alltoall(tf.constant([1.0, 2.0]), name="a", group=peers)
    comm.allgather(tf.constant([5.0]), name="g", group=peers)
    assert recorded.alltoalls == [([1.0, 2.0], [1, 0, 1, 0]),   # part i to member i
                                  ([5.0, 5.0], [1, 0, 1, 0])]   # a copy to each member


def test_a_routed_average_sums_one_part_a_worker_then_gathers_the_parts(recorded):
    (mean,) = comm.average([tf.constant([1.0, 2.0, 3.0])], name="m", group=comm.peer_group())
    # Rank 0's part is the mean of equal parts (itself); the rest is rank 2's to send.
    assert mean.numpy().tolist()[:2] == [1.0, 2.0]
    # Scatter: 3 values padded to 2 parts of 2, one to each member; gather: rank 0's part.
    assert recorded.alltoalls == [([[1.0, 2.0], [3.0, 0.0]], [1, 0, 1, 0]),
                                  ([1.0, 2.0, 1.0, 2.0], [2, 0, 2, 0])]
