"""The hosts' layout read from the environment hvdtrain's horovodrun gives each worker
(`hvdtrain.machine.host_layout`, `hvdtrain.machine.horovodrun.tell_workers_the_host_sizes`), made by
Horovod's own Gloo launcher functions for every layout of up to 4 hosts of up to 4
workers."""

from __future__ import annotations

import itertools

import pytest
from horovod.runner import gloo_run
from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts

from hvdtrain.machine.horovodrun import tell_workers_the_host_sizes
from hvdtrain.machine.host_layout import (HOST_SIZES, HostLayout, hosts_from_environment,
                                          layout_from_environment)


@pytest.fixture
def launcher(monkeypatch):
    """horovodrun's Gloo launcher as hvdtrain's horovodrun leaves it (undone after)."""
    for name in ("get_host_assignments", "create_slot_env_vars"):
        monkeypatch.setattr(gloo_run, name, getattr(gloo_run, name))
    monkeypatch.setenv(HOST_SIZES, "9,9")  # an outer job's, which must not reach a worker
    tell_workers_the_host_sizes()

    def worker_environments(per_host: tuple[int, ...]) -> list[dict[str, str]]:
        """What `horovodrun -H h0:n0,h1:n1,...` gives each worker, in rank order, as
        `launch_gloo` calls the two functions."""
        hosts = parse_hosts(",".join(f"h{i}:{n}" for i, n in enumerate(per_host)))
        slots = gloo_run.get_host_assignments(hosts, sum(per_host))
        return [gloo_run.create_slot_env_vars(slot)
                for slot in sorted(slots, key=lambda slot: slot.rank)]
    return worker_environments


def true_host_groups(environments: list[dict[str, str]]) -> list[list[int]]:
    groups: dict[str, list[int]] = {}
    for env in environments:
        groups.setdefault(env["HOROVOD_HOSTNAME"], []).append(int(env["HOROVOD_RANK"]))
    return list(groups.values())


LAYOUTS = [sizes for hosts in range(1, 5)
           for sizes in itertools.product(range(1, 5), repeat=hosts)]


def test_every_worker_reads_the_same_layout_only_when_the_hosts_are_equal(launcher):
    for per_host in LAYOUTS:
        environments = launcher(per_host)
        layouts = {layout_from_environment(env) for env in environments}
        # Every worker must start Horovod alike: with the same sets, or all without.
        if len(set(per_host)) == 1:
            assert layouts == {HostLayout(len(per_host), per_host[0])}, per_host
            assert HostLayout(len(per_host), per_host[0]).host_sets() == \
                true_host_groups(environments)
        else:
            assert layouts == {None}, per_host


def test_every_worker_counts_the_hosts_alike_whatever_their_sizes(launcher):
    # A flat job's plan counts hosts on every worker without a collective: equal or not.
    for per_host in LAYOUTS:
        counts = {hosts_from_environment(env) for env in launcher(per_host)}
        assert counts == {len(per_host)}, per_host
    assert hosts_from_environment({}) is None  # another launcher: Horovod's own count


def test_a_workers_own_place_alone_cannot_tell_unequal_hosts_from_equal_ones(launcher):
    # Rank 1 of hosts of 3, 1 and 2 sees what rank 1 of two hosts of 3 sees: only the
    # host sizes tell them apart.
    unequal, equal = launcher((3, 1, 2))[1], launcher((3, 3))[1]
    assert {k: v for k, v in unequal.items() if k.startswith("HOROVOD_") and k != "HOROVOD_HOSTNAME"} \
        == {k: v for k, v in equal.items() if k.startswith("HOROVOD_") and k != "HOROVOD_HOSTNAME"}
    assert (unequal[HOST_SIZES], equal[HOST_SIZES]) == ("3,1,2", "3,3")
    assert layout_from_environment(unequal) is None
    assert layout_from_environment(equal) == HostLayout(2, 3)


def test_peer_sets_hold_the_workers_at_one_place_in_every_host():
    layout = HostLayout(hosts=3, per_host=2)
    assert layout.host_sets() == [[0, 1], [2, 3], [4, 5]]
    assert layout.peer_sets() == [[0, 2, 4], [1, 3, 5]]
    assert layout.process_sets() == layout.host_sets() + layout.peer_sets()


def test_hosts_of_one_worker_have_no_peer_sets_and_one_host_needs_no_sets():
    assert HostLayout(hosts=4, per_host=1).process_sets() == [[0], [1], [2], [3]]
    assert HostLayout(hosts=1, per_host=4).process_sets() == []


def test_elastic_jobs_other_launchers_and_horovods_own_horovodrun_start_without_a_layout(
        launcher):
    env = launcher((2, 2))[0]
    assert layout_from_environment(env) == HostLayout(2, 2)
    assert layout_from_environment({**env, "HOROVOD_ELASTIC": "1"}) is None
    assert layout_from_environment({"OMPI_COMM_WORLD_RANK": "0"}) is None  # mpirun
    assert layout_from_environment({k: v for k, v in env.items() if k != HOST_SIZES}) is None
    assert layout_from_environment({**env, HOST_SIZES: "2,x"}) is None
    assert layout_from_environment({**env, "HOROVOD_LOCAL_SIZE": "4"}) is None  # disagrees


def test_slots_of_an_elastic_job_which_its_driver_assigns_go_without_host_sizes(launcher):
    # horovodrun's elastic driver assigns slots itself; only their commands pass here.
    slot = next(iter(get_host_assignments(parse_hosts("h0:2,h1:2"), 4)))
    assert HOST_SIZES not in gloo_run.create_slot_env_vars(slot)
