"""The hosts' layout read from horovodrun's environment (`hvdtrain.host_layout`), against
the environment horovodrun's own Gloo launcher makes for every worker of every layout of
up to 4 hosts of up to 4 workers."""

from __future__ import annotations

import itertools

import pytest
from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
from horovod.runner.gloo_run import create_slot_env_vars

from hvdtrain.host_layout import HostLayout, layout_from_environment


def worker_environments(per_host: tuple[int, ...]) -> list[dict[str, str]]:
    """What horovodrun -H h0:n0,h1:n1,... gives each worker, in rank order."""
    hosts = parse_hosts(",".join(f"h{i}:{n}" for i, n in enumerate(per_host)))
    slots = get_host_assignments(hosts, sum(per_host))
    return [create_slot_env_vars(slot) for slot in sorted(slots, key=lambda s: s.rank)]


def true_host_groups(environments: list[dict[str, str]]) -> list[list[int]]:
    groups: dict[str, list[int]] = {}
    for env in environments:
        groups.setdefault(env["HOROVOD_HOSTNAME"], []).append(int(env["HOROVOD_RANK"]))
    return list(groups.values())


LAYOUTS = [sizes for hosts in range(1, 5)
           for sizes in itertools.product(range(1, 5), repeat=hosts)]


@pytest.mark.parametrize("per_host", LAYOUTS, ids=str)
def test_every_worker_reads_the_same_layout_only_when_the_hosts_are_equal(per_host):
    environments = worker_environments(per_host)
    layouts = [layout_from_environment(env) for env in environments]
    equal = len(set(per_host)) == 1
    # Every worker must start Horovod alike: with the same sets, or all without.
    assert all(layout is not None for layout in layouts) == equal
    if equal:
        assert set(layouts) == {HostLayout(len(per_host), per_host[0])}
        assert layouts[0].host_sets() == true_host_groups(environments)
    else:
        # The last worker of each host declines, so Horovod's start cannot pair a worker
        # with sets against one without silently.
        lasts = [env for env in environments
                 if int(env["HOROVOD_LOCAL_RANK"]) == int(env["HOROVOD_LOCAL_SIZE"]) - 1]
        assert all(layout_from_environment(env) is None for env in lasts)


def test_unequal_hosts_can_fool_some_workers_which_is_why_a_failed_start_is_explained():
    # Rank 0 of hosts of 2, 1 and 3 sees 2 workers here and 3 hosts: 6, as on 3 hosts of 2.
    layouts = [layout_from_environment(env) for env in worker_environments((2, 1, 3))]
    assert layouts[0] == HostLayout(3, 2)
    assert None in layouts


def test_peer_sets_hold_the_workers_at_one_place_in_every_host():
    layout = HostLayout(hosts=3, per_host=2)
    assert layout.host_sets() == [[0, 1], [2, 3], [4, 5]]
    assert layout.peer_sets() == [[0, 2, 4], [1, 3, 5]]
    assert layout.process_sets() == layout.host_sets() + layout.peer_sets()


def test_hosts_of_one_worker_have_no_peer_sets_and_one_host_needs_no_sets():
    assert HostLayout(hosts=4, per_host=1).process_sets() == [[0], [1], [2], [3]]
    assert HostLayout(hosts=1, per_host=4).process_sets() == []


def test_elastic_jobs_and_other_launchers_start_without_a_layout():
    env = worker_environments((2, 2))[0]
    assert layout_from_environment({**env, "HOROVOD_ELASTIC": "1"}) is None
    assert layout_from_environment({"OMPI_COMM_WORLD_RANK": "0"}) is None  # mpirun
    assert layout_from_environment({**env, "HOROVOD_CROSS_SIZE": "two"}) is None
