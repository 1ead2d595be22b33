"""The period that follows the link (`--n-sync link:S:M`): its maths, its grammar, its
trigger and what a worker reports. Across workers in `fit`: tests/test_local_sgd_threads.py."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from hvdtrain.config import load_config
from hvdtrain.errors import ConfigError
from hvdtrain.rounds.averaging import link_period
from hvdtrain.rounds.periods import LinkPeriod, parse_period
from hvdtrain.rounds.spec import RoundRuleError, RoundSpec
from hvdtrain.rounds.triggers import LinkFollowingPeriod


@pytest.mark.parametrize("round_s, step_s, share, maximum, period", [
    (0.33, 0.29, 0.15, 8, 7),    # int8 rounds of ResNet-20 at 10 Mbit/s: 6.45 steps
    (0.33, 0.29, 0.15, 4, 4),    # ...held to the longest period
    (0.01, 0.29, 0.15, 8, 1),    # a fast link: every step
    (1.0, 1.0, 0.5, 8, 1),       # exactly half the time at 1 step
    (0.3, 0.1, 0.25, 100, 9),    # 0.3 × 0.75 / 0.025 = 9 exactly, not 10
])
def test_the_period_is_the_fewest_steps_that_hold_rounds_to_their_share(round_s, step_s, share,
                                                                         maximum, period):
    assert link_period(round_s, step_s, share, maximum) == period
    if 1 < period < maximum:   # one step fewer would take more than the share
        assert round_s / (round_s + (period - 1) * step_s) > share
        assert round_s / (round_s + period * step_s) <= share + 1e-12


@pytest.mark.parametrize("round_s, step_s", [(0.0, 0.1), (0.1, 0.0), (math.nan, 0.1),
                                             (0.1, math.inf), (-1.0, 0.1)])
def test_nothing_measured_keeps_the_shortest_period(round_s, step_s):
    assert link_period(round_s, step_s, 0.15, 8, minimum=1) == 1


@pytest.mark.parametrize("text, period", [
    ("link", LinkPeriod(15, 8, 2)), ("link:20", LinkPeriod(20, 8, 2)),
    ("LINK:5:16", LinkPeriod(5, 16, 2)), ("link:15:1", LinkPeriod(15, 1, 1)),
])
def test_link_reads_its_share_and_its_longest_period(text, period):
    assert parse_period(text) == period


@pytest.mark.parametrize("text", ["link:0", "link:91", "link:15:0", "link:", "link:1.5",
                                  "links"])
def test_a_bad_link_period_is_one_line_naming_the_flag(text):
    with pytest.raises(ConfigError) as caught:
        load_config(None, dict(mode="local", n_sync=text))
    message = str(caught.value)
    assert message.startswith(f"--n-sync must be a positive integer, got '{text}'")
    assert "link:S:M" in message and "\n" not in message


def test_the_trigger_sets_the_period_from_the_workers_summed_times_and_keeps_it():
    trigger = LinkFollowingPeriod(0.15, 8, initial_period=2)
    trigger.learn(0.0, 0, 1.2, 4)           # the first report: no round timed yet
    assert trigger.n_sync == 2
    # Two workers: rounds of 0.30 and 0.36 s, steps of 0.28 and 0.30 s, 2 steps each.
    trigger.learn(0.66, 2, 1.16, 4)
    assert trigger.n_sync == link_period(0.33, 0.29, 0.15, 8) == 7
    trigger.held(10)
    assert trigger.due(range(17, 18)) and not trigger.due(range(16, 17))
    again = LinkFollowingPeriod(0.15, 8, initial_period=2)
    again.restore(trigger.saved())
    assert (again.n_sync, again.next_round) == (7, 17)


def test_a_worker_reports_its_step_and_round_times_since_the_last_report():
    from hvdtrain.keras.link_rounds import LinkRounds

    clock = itertools.count(step=0.5).__next__          # every reading is 0.5 s later
    rounds = LinkRounds(LinkFollowingPeriod(0.15, 8, 2), clock)
    for steps in (1, 2):
        rounds.batch_begun()
        rounds.batch_ended(0, steps, None)              # 0.5 s for the batch's steps
    rounds.round_took(0.2)
    np.testing.assert_array_equal(rounds.report(), [0.2, 1, 1.0, 3])
    np.testing.assert_array_equal(rounds.report(), [0, 0, 0, 0])   # the next count starts
    rounds.batch_ended(0, 1, None)                      # no batch begun: nothing timed
    rounds.round_took(0.1)
    rounds.warm_start_ended()                           # the warm start's times are dropped
    np.testing.assert_array_equal(rounds.report(), [0, 0, 0, 0])


def test_a_link_period_counts_steps_so_rounds_by_time_are_refused_with_it():
    with pytest.raises(RoundRuleError, match="n_sync=link adapts a period of steps"):
        RoundSpec(n_sync="link", sync_seconds=2.0).check(lambda f, v, s: f"{f}={v}")
    with pytest.raises(ConfigError, match="--n-sync link adapts a period of steps"):
        load_config(None, dict(mode="local", n_sync="link", sync_seconds=2.0))
