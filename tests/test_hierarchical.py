"""Hierarchical local SGD (--hierarchical-sgd): sync inside a host, local SGD across hosts.

The multi-process tests run one Horovod job of four workers on two "hosts" of one
machine (horovodrun counts localhost and 127.0.0.1 as two hostnames).
"""

from __future__ import annotations

import json
from dataclasses import fields

import numpy as np
import pytest

from conftest import horovodrun, load_rank_files
from helpers import agreeing_pieces, lenet_fragments, piece_size, runs_on_learnable_data
from hvdtrain.rounds import quantize
from hvdtrain.config import TrainConfig, load_config
from hvdtrain.errors import ConfigError
from hvdtrain.rounds.periods import PerWorkerPeriod, parse_period, resolve_period
from hvdtrain.rounds.triggers import RateFollowingPeriod
from hvdtrain.schedules import ScheduleSpec, learning_rate_at

PLAIN = dict(model="lenet", batch_size=16, epochs=1, steps_per_epoch=7, validate=False,
             momentum=0.0, warmup_epochs=0.0, lr_decay="constant")
# At 4 workers a hierarchical step's rate counts as many workers as sync's (a host's 2,
# but never fewer than flat local SGD's min(4, 4)): one step of each is the same update.
# Rounds in float32 (local mode's default is int8): the equalities below are exact for them.
HIERARCHICAL = dict(PLAIN, mode="local", hierarchical_sgd=True, round_compression="none")
RUNS = {  # the first run starts Horovod, with the host groups hierarchical runs need
    "every3": dict(HIERARCHICAL, n_sync=3),
    "every1": dict(HIERARCHICAL, n_sync=1),
    "every3_int8": dict(HIERARCHICAL, n_sync=3, round_compression="int8"),
    "every3_f2": dict(HIERARCHICAL, n_sync=3, round_fragments=2),
    "sync": dict(PLAIN),
    # Equal periods: the hierarchy's inner period is one step (sync inside a host); with
    # rounds across hosts every step too it is flat local SGD at period 1, momentum and all.
    "every1_momentum": dict(HIERARCHICAL, n_sync=1, momentum=0.9),
    "flat1_momentum": dict(PLAIN, mode="local", n_sync=1, momentum=0.9, round_compression="none"),
    # The quadratic synchronization rule across hosts: rounds thin out as the cosine decays.
    "qsr_cosine": dict(HIERARCHICAL, n_sync="qsr:1", lr_decay="cosine"),
}


def half(count: int) -> int:
    """A host shard's part of `count` at hosts of 2 (the first takes the odd one)."""
    return -(-count // 2)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("hierarchical")
    runs = runs_on_learnable_data(root, RUNS)
    horovodrun("hierarchical_worker.py", str(root), json.dumps(runs), np_=4,
               hosts="localhost:2,127.0.0.1:2", timeout=600)
    return {name: load_rank_files(str(root), name, workers=4) for name in RUNS}


@pytest.mark.ci
@pytest.mark.long  # their job takes over a minute here
@pytest.mark.multiprocess
def test_a_hosts_workers_agree_after_every_step_and_all_after_every_round(results):
    ranks = results["every3"]
    assert [r["host"].tolist() for r in ranks] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    steps = [r["steps"] for r in ranks]
    assert len(steps[0]) == 7
    for step in range(7):
        np.testing.assert_array_equal(steps[0][step], steps[1][step])
        np.testing.assert_array_equal(steps[2][step], steps[3][step])
        across_hosts = np.array_equal(steps[0][step], steps[2][step])
        # Rounds after steps 3 and 6 (the epoch's end, after step 7, ends in one too).
        assert across_hosts == (step + 1 in (3, 6)), step + 1
    for r in ranks[1:]:
        np.testing.assert_array_equal(r["final"], ranks[0]["final"])


@pytest.mark.ci
@pytest.mark.long  # their job takes over a minute here
@pytest.mark.multiprocess
def test_hierarchical_rounds_every_step_of_plain_sgd_are_large_batch_sgd(results):
    hierarchical, sync = results["every1"][0]["final"], results["sync"][0]["final"]
    np.testing.assert_allclose(hierarchical, sync, rtol=1e-5, atol=1e-6)
    assert not np.allclose(results["every1"][0]["steps"][0], results["every1"][0]["steps"][-1])


@pytest.mark.ci
@pytest.mark.long  # their job takes over a minute here
@pytest.mark.multiprocess
def test_a_hierarchy_whose_outer_period_equals_its_inner_one_is_flat_local_sgd(results):
    """Momentum is kept per host (on the host's averaged gradients) or per worker; both are
    linear in the gradients, so after every step's round the mean is the same update.
    This is the sandwich bound's tight case (Wang et al. 2022): the rate rule gives both
    the same rate."""
    hierarchical, flat = results["every1_momentum"], results["flat1_momentum"]
    for step in range(7):
        np.testing.assert_allclose(hierarchical[0]["steps"][step], flat[0]["steps"][step],
                                   rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(hierarchical[3]["final"], flat[3]["final"], rtol=1e-5, atol=1e-6)
    assert not np.allclose(flat[0]["steps"][0], flat[0]["steps"][-1])


@pytest.mark.ci
@pytest.mark.long  # their job takes over a minute here
@pytest.mark.multiprocess
def test_the_summary_records_the_hosts_and_the_period_in_hosts(results):
    summary = json.loads(str(results["every3"][0]["summary"]))
    assert summary["hierarchical"] is True
    assert summary["hosts"] == 2 and summary["workers_per_host"] == 2
    assert summary["host_shards"] == 2  # hosts of one size: rounds cut in host shards
    # horovodrun's environment showed equal hosts: Horovod started with the groups.
    assert summary["host_groups_at_start"] is True
    assert summary["workers"] == 4 and summary["n_sync"] == 3
    # Every step's gradients were averaged, inside the host; 2 rounds and the epoch's end.
    assert summary["gradient_steps_averaged"] == 7 and summary["averaging_rounds"] == 3
    # The gradients of 7 steps among the host's workers; 3 rounds of the weights across
    # hosts, each worker sending its host shard, half of them, to its peer on the other.
    weights = 4 * summary["parameters"]
    assert summary["bytes_allreduced_within_host"] == 7 * weights
    assert summary["bytes_allreduced_across_hosts"] == 3 * 4 * half(summary["parameters"])
    assert summary["bytes_allreduced"] == 7 * weights + 3 * 4 * half(summary["parameters"])
    assert "hierarchical" not in json.loads(str(results["sync"][0]["summary"]))


@pytest.mark.ci
@pytest.mark.long  # their job takes over a minute here
@pytest.mark.multiprocess
def test_int8_rounds_between_hosts_leave_every_worker_on_the_same_bits(results):
    ranks = results["every3_int8"]
    for step in (3, 6):
        for rank in ranks[1:]:
            np.testing.assert_array_equal(rank["steps"][step - 1], ranks[0]["steps"][step - 1])
    for rank in ranks[1:]:
        np.testing.assert_array_equal(rank["final"], ranks[0]["final"])
    summary = json.loads(str(ranks[0]["summary"]))
    # 3 rounds of the weights (no momentum here), a host shard of them between 2 peers,
    # encoded: the bytes that cross the hosts.
    assert summary["bytes_allreduced_across_hosts"] == 3 * quantize.payload_bytes(
        half(summary["parameters"]), 2, "int8")
    assert summary["bytes_allreduced_within_host"] == 7 * 4 * summary["parameters"]


@pytest.mark.ci
@pytest.mark.long  # their job takes over a minute here
@pytest.mark.multiprocess
def test_fragmented_rounds_between_hosts_average_one_fragment_in_turn(results):
    ranks = results["every3_f2"]
    shapes = json.loads(str(ranks[0]["shapes"]))
    fragments = lenet_fragments(shapes, 2)  # no momentum: a round carries the weights alone
    for step in range(1, 8):
        for host in ((0, 1), (2, 3)):  # sync inside a host: its workers agree every step
            np.testing.assert_array_equal(ranks[host[0]]["steps"][step - 1],
                                          ranks[host[1]]["steps"][step - 1])
        expected = {3: set(fragments[0]), 6: set(fragments[1])}.get(step, set())
        across = agreeing_pieces(ranks[0]["steps"][step - 1], ranks[2]["steps"][step - 1],
                                 shapes, fragments)
        assert across == expected, step
    for rank in ranks[1:]:
        np.testing.assert_array_equal(rank["final"], ranks[0]["final"])
    summary = json.loads(str(ranks[0]["summary"]))
    sent = sum(4 * half(sum(piece_size(shapes, p) for p in fragment)) for fragment in fragments)
    # A fragment after steps 3 and 6, then every fragment at the epoch's end; each worker
    # sends its host shard of a fragment.
    assert summary["bytes_allreduced_across_hosts"] == 2 * sent


def qsr_rounds(steps: int) -> list[int]:
    """The steps after which `qsr:1` holds a round under a cosine decay over `steps` steps
    from the peak: the rule fed the schedule's rate at each round's last step."""
    spec = ScheduleSpec(1.0, 16, 4, warmup_steps=0, total_steps=steps, decay="cosine")
    rule, rounds = RateFollowingPeriod(1, 1.0), []
    while rule.next_round <= steps:
        step = rule.next_round
        rule.learn(learning_rate_at(step - 1, spec))
        rule.held(step)
        rounds.append(step)
    return rounds


@pytest.mark.ci
@pytest.mark.long  # their job takes over a minute here
@pytest.mark.multiprocess
def test_rounds_across_hosts_follow_the_quadratic_rule_and_leave_every_worker_agreeing(results):
    ranks = results["qsr_cosine"]
    rounds = qsr_rounds(7)
    assert 2 < len(rounds) < 7  # every step at first, then fewer
    for step in range(1, 8):
        np.testing.assert_array_equal(ranks[0]["steps"][step - 1], ranks[1]["steps"][step - 1])
        across = np.array_equal(ranks[0]["steps"][step - 1], ranks[2]["steps"][step - 1])
        assert across == (step in rounds), step
    for rank in ranks[1:]:
        np.testing.assert_array_equal(rank["final"], ranks[0]["final"])
    summary = json.loads(str(ranks[0]["summary"]))
    assert summary["averaging_rounds"] == len(rounds) + (7 not in rounds)  # and the epoch's end


@pytest.fixture(scope="module")
def unequal(tmp_path_factory):
    """SlowMo with momentum on hosts of two workers and one: with flat local SGD's count
    at 1 (--local-lr-workers 1) each host scales its rate for its own workers, and warms
    up to it from one worker's rate, so the hosts' rates are not in a fixed ratio (which
    the outer step would cancel)."""
    root = tmp_path_factory.mktemp("hierarchical_unequal")
    runs = runs_on_learnable_data(root, {"slowmo": dict(
        HIERARCHICAL, n_sync=3, outer_optimizer="slowmo", outer_momentum=0.5,
        warmup_epochs=1.0, local_lr_workers=1)})
    horovodrun("hierarchical_worker.py", str(root), json.dumps(runs), np_=3,
               hosts="localhost:2,127.0.0.1:1", timeout=600)
    return load_rank_files(str(root), "slowmo", workers=3)


@pytest.mark.multiprocess
@pytest.mark.long  # a second job of 22 s: the hierarchy's wiring is the `results` job's above
def test_hosts_of_unequal_size_agree_after_every_round_of_an_outer_optimizer(unequal):
    assert [r["host"].tolist() for r in unequal] == [[0, 1], [0, 1], [2]]
    summary = json.loads(str(unequal[0]["summary"]))
    assert summary["hosts"] == 2 and summary["averaging_rounds"] == 3
    assert summary["host_shards"] == 1  # hosts of unequal size: rounds among all workers
    assert summary["host_groups_at_start"] is False  # added to a dynamic Horovod
    for step in (3, 6):  # the rounds' steps: x0 and the momentum are the job's, one of each
        for rank in unequal[1:]:
            np.testing.assert_array_equal(rank["steps"][step - 1], unequal[0]["steps"][step - 1])
    for rank in unequal[1:]:
        np.testing.assert_array_equal(rank["final"], unequal[0]["final"])


# --- configuration ---

def test_a_period_in_hosts_divides_by_the_hosts():
    assert parse_period("40/hosts") == PerWorkerPeriod(40, "hosts")
    assert resolve_period("40/hosts", workers=8, hosts=4) == 10
    assert resolve_period("40/workers", workers=8, hosts=4) == 5


@pytest.mark.parametrize("mode, n_sync, said", [("local", 2, "2 steps in local mode"),
                                                ("async", "10/hosts", "10/hosts in async")])
def test_the_default_period_when_hierarchical_and_the_help_says_which(mode, n_sync, said):
    assert load_config(None, {"mode": mode, "hierarchical_sgd": True}).resolved().n_sync == n_sync
    option = next(f for f in fields(TrainConfig) if f.name == "hierarchical_sgd")
    assert said in option.metadata["help"]


@pytest.mark.parametrize("overrides, message", [
    (dict(hierarchical_sgd=True), "--hierarchical-sgd needs --mode local or async"),
    (dict(mode="local", hierarchical_sgd=True, sync_seconds=2.0),
     "--hierarchical-sgd does not work with --sync-seconds 2.0 yet"),
    (dict(mode="local", hierarchical_sgd=True, warm_start_steps=10),
     "--hierarchical-sgd does not work with --warm-start-steps 10 yet"),
    (dict(mode="local", n_sync="40/hosts"), "--n-sync 40/hosts counts hosts, which only --hierarchical-sgd"),
])
def test_what_hierarchical_cannot_do_yet_is_refused_in_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_config(None, overrides)


@pytest.mark.parametrize("n_sync, workers, hosts, warns", [
    ("40/hosts", 40, 20, True),   # 2 steps: a round of weights and momentum every 2 steps
    ("40/hosts", 40, 4, False),   # 10 steps
    (None, 40, 20, True),         # the default period, 2 steps, of such rounds
    (4, 40, 20, False),           # 4 steps: half of sync's
    (1, 8, 2, True),              # the weights and momentum between the hosts every step
    (1, 8, 1, False),             # one host: no round crosses hosts
])  # with --average-optimizer-state: a round of the weights alone costs half
def test_rank_0_warns_when_hierarchical_rounds_move_as_many_bytes_between_hosts_as_sync(
        n_sync, workers, hosts, warns):
    from hvdtrain.plan import Job, costly_period, settle

    cfg = load_config(None, dict(mode="local", hierarchical_sgd=True, n_sync=n_sync,
                                 average_optimizer_state=True, round_compression="none"))
    job = Job(workers, hosts)
    plan = settle(cfg, job)
    warning = costly_period(plan.config, job)
    assert (warning is not None) == warns and (warning in plan.warnings or not warns)
    if n_sync == "40/hosts" and warns:
        assert warning.startswith("--n-sync 40/hosts is 2 step(s) at 40 workers on 20 "
                                  "hosts, and each round moves 2x a sync step's bytes")
