"""Making the host groups of hierarchical local SGD (`comm.init(host_groups=True)`), with
Horovod faked: two hosts of one worker each, seen from rank 0."""

from __future__ import annotations

import pytest

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
