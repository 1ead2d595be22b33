"""Rounds every T seconds (`--sync-seconds`): the counts they carry, and two real ranks at
different speeds."""

import json
import os

import numpy as np
import pytest

from conftest import horovodrun, load_rank_files
from hvdtrain.rounds import quantize
from hvdtrain.config import load_config
from hvdtrain.errors import ConfigError
from hvdtrain.progress import TrainingProgress
from hvdtrain.rounds.timed import ReportedCounts, RoundTimer, epoch_end_due, report_vector


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_round_is_due_once_the_period_has_passed_since_the_last_one_started():
    clock = FakeClock()
    timer = RoundTimer(2.0, clock)
    assert not timer.due()  # not started
    timer.restart()
    clock.now += 1.9
    assert not timer.due()
    clock.now += 0.1
    assert timer.due()
    timer.restart()
    assert not timer.due()
    with pytest.raises(ValueError, match="sync_seconds must be positive"):
        RoundTimer(0.0)


def test_a_report_holds_the_new_examples_and_the_steps_at_the_workers_rank():
    np.testing.assert_array_equal(report_vector(96, 7, rank=1, workers=3), [96, 0, 7, 0])


def test_a_blocking_round_ends_the_epoch_on_its_count_an_overlapped_one_adds_a_period():
    assert not epoch_end_due(900, 600, 1000, overlapped=False)
    assert epoch_end_due(1000, 600, 1000, overlapped=False)
    # One period late: 900 known, 300 per period, so about 1200 by now.
    assert epoch_end_due(900, 600, 1000, overlapped=True)
    assert not epoch_end_due(650, 600, 1000, overlapped=True)


def test_reports_give_every_worker_the_jobs_examples_and_each_workers_steps():
    # Two workers out of step: rank 0 took 3 steps of 32, rank 1 one step.
    fast, slow = (TrainingProgress(epoch_examples=1000, workers_in_step=False)
                  for _ in range(2))
    counts = [ReportedCounts(p, rank, 2) for rank, p in enumerate((fast, slow))]
    fast.advance(3, 32)
    slow.advance(1, 32)
    summed = counts[0].report() + counts[1].report()   # what the round's allreduce sums
    fast.advance(2, 32)                                  # they train on while it travels
    slow.advance(1, 32)
    for c in counts:
        c.learn(summed)
    assert (fast.examples, slow.examples) == (128 + 64, 128 + 32)  # job's + own since
    assert fast.worker_steps == slow.worker_steps == (3, 1)
    assert counts[0].known == counts[1].known == 128
    # The next report sends only what is new since the last one.
    summed = counts[0].report() + counts[1].report()
    for c in counts:
        c.learn(summed)
    assert fast.examples == slow.examples == 224
    assert (counts[0].previous, counts[0].known) == (128, 224)


def test_a_second_report_before_the_first_is_summed_is_refused():
    counts = ReportedCounts(TrainingProgress(epoch_examples=10), 0, 2)
    counts.report()
    with pytest.raises(RuntimeError, match="has not been summed"):
        counts.report()
    counts.learn(np.zeros(3))
    with pytest.raises(RuntimeError, match="no report of this worker"):
        counts.learn(np.zeros(3))


@pytest.mark.parametrize("overrides, message", [
    (dict(mode="sync"), "--sync-seconds needs --mode local or async, got --mode sync"),
    (dict(mode="local", sync_seconds=0), "--sync-seconds must be positive, got 0"),
    (dict(mode="local", elastic=True, out="runs/x"), "--sync-seconds does not work with --elastic"),
    (dict(mode="local", checkpoint_every="100"), "--sync-seconds checkpoints at epoch ends"),
])
def test_what_timed_rounds_cannot_do_is_refused_in_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, dict(dict(sync_seconds=5.0), **overrides))


def test_a_timed_runs_summary_records_its_period_in_seconds_and_no_step_period():
    from hvdtrain.training.summary import round_schedule

    assert round_schedule(load_config(None, dict(mode="async", sync_seconds=5.0)), 4, 1) == \
        {"sync_seconds": 5.0}
    assert round_schedule(load_config(None, dict(mode="local", n_sync=7)), 4, 1) == {"n_sync": 7}
    assert round_schedule(load_config(None, dict(mode="sync")), 4, 1) == {"n_sync": 1}
    from hvdtrain.plan import Job, settle

    default = load_config(None, dict(mode="local")).resolved()
    assert round_schedule(settle(default, Job(8)).config, 8, 1) == {"n_sync": 2}  # SGD's
    assert round_schedule(settle(default, Job(32)).config, 32, 1) == {"n_sync": 1}  # LAMB's
    # A period by rule: the summary gives the steps it came to, and the rule.
    per_worker = dict(mode="local", n_sync="40/workers:5")
    assert round_schedule(load_config(None, per_worker).resolved(), 32, 1) == \
        {"n_sync": 5, "n_sync_rule": "40/workers:5"}
    hierarchical = dict(mode="local", n_sync="40/hosts", hierarchical_sgd=True)
    assert round_schedule(load_config(None, hierarchical).resolved(), 8, 4) == \
        {"n_sync": 10, "n_sync_rule": "40/hosts"}


def test_local_sgd_with_timed_rounds_needs_the_batch_size_and_the_epoch_length():
    from hvdtrain.keras.local_sgd import LocalSGD

    with pytest.raises(ValueError, match="needs batch_size"):
        LocalSGD(n_sync=10, sync_seconds=1.0, epoch_examples=100)
    with pytest.raises(ValueError, match="needs epoch_examples"):
        LocalSGD(n_sync=10, sync_seconds=1.0, batch_size=8)


# --- two ranks, rank 1 four times slower (tests/workers/timed_rounds_worker.py) ---

EPOCH_EXAMPLES, BATCH = 2048, 16
MODES = ("local", "async")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("timed")
    horovodrun("timed_rounds_worker.py", str(root))
    return {mode: load_rank_files(str(root), mode)
            for mode in (*MODES, "slowmo", "long", "refused")}


@pytest.mark.ci
@pytest.mark.long  # their job takes over a minute here
@pytest.mark.multiprocess
def test_a_period_longer_than_an_epoch_logs_every_epoch_it_passed_and_trains_no_more(results):
    summary = json.loads(str(results["long"][0]["summary"]))
    out = str(results["long"][0]["out"])
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as fh:
        lines = [json.loads(line) for line in fh]
    epoch_examples = summary["epoch_examples"]
    # Each line's epoch is the count's, and a line that passed several boundaries says so.
    ended = 0
    for line in lines:
        assert line["epoch"] == line["examples"] // epoch_examples
        assert line.get("epochs_passed", 1) == line["epoch"] - ended
        ended = line["epoch"]
    assert any(line.get("epochs_passed", 1) > 1 for line in lines)  # the case under test
    # No fit after the count reached the 3 epochs asked for.
    assert [line["epoch"] >= 3 for line in lines].count(True) == 1
    assert summary["examples_trained"] // epoch_examples == lines[-1]["epoch"]


@pytest.mark.ci
@pytest.mark.long  # their job takes over a minute here
@pytest.mark.multiprocess
def test_a_fit_of_several_epochs_with_timed_rounds_is_refused_in_one_line(results):
    for rank in results["refused"]:
        message = str(rank["message"])
        assert "must train one epoch" in message and "got 3 epochs from epoch 1" in message
        assert "\n" not in message


@pytest.mark.ci
@pytest.mark.long  # their job takes over a minute here
@pytest.mark.multiprocess
@pytest.mark.parametrize("mode", MODES)
def test_both_ranks_run_the_same_rounds_while_the_faster_takes_more_steps(results, mode):
    ranks = results[mode]
    np.testing.assert_array_equal(ranks[0]["rounds"], ranks[1]["rounds"])
    assert int(ranks[0]["rounds"][0]) >= 2  # timed rounds, not only the epoch ends
    fast, slow = int(ranks[0]["steps"]), int(ranks[1]["steps"])
    assert fast > 1.5 * slow
    for r in ranks:  # every rank learned every rank's steps from the rounds' reports
        assert json.loads(str(r["summary"]))["steps_per_worker"] == [fast, slow]


@pytest.mark.ci
@pytest.mark.long  # their job takes over a minute here
@pytest.mark.multiprocess
@pytest.mark.parametrize("mode", MODES)
def test_every_epoch_ends_in_consensus_on_the_jobs_examples_and_schedule_step(results, mode):
    ranks = results[mode]
    for a, b in zip(ranks[0]["weights"], ranks[1]["weights"]):
        np.testing.assert_array_equal(a, b)
    # The optimizer's step follows the job's examples, the same on both ranks.
    np.testing.assert_array_equal(ranks[0]["iterations"], ranks[1]["iterations"])
    out = str(ranks[0]["out"])
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as fh:
        epochs = [json.loads(line) for line in fh]
    # One line per fit; a period under load may pass two boundaries at once (then the
    # line says so: test_a_period_longer_than_an_epoch_...).
    assert epochs[-1]["epoch"] >= 2 and len(epochs) == len(ranks[0]["iterations"])
    for record, iterations in zip(epochs, ranks[0]["iterations"]):
        # An epoch never ends short: the count has reached the boundary it names.
        assert record["epoch"] == record["examples"] // EPOCH_EXAMPLES
        assert record["step"] == iterations == record["examples"] // (2 * BATCH)
        assert len(record["steps_per_worker"]) == 2
    summary = json.loads(str(ranks[0]["summary"]))
    assert summary["sync_seconds"] == 0.4 and "n_sync" not in summary
    assert summary["examples_trained"] == epochs[-1]["examples"]
    assert summary["examples_trained"] == BATCH * sum(summary["steps_per_worker"])


@pytest.mark.ci
@pytest.mark.long  # their job takes over a minute here
@pytest.mark.multiprocess
@pytest.mark.parametrize("mode", MODES)
def test_the_step_log_has_a_line_per_step_of_each_worker(results, mode):
    ranks = results[mode]
    with open(os.path.join(str(ranks[0]["out"]), "steps.jsonl"), encoding="utf-8") as fh:
        lines = [json.loads(line) for line in fh]
    for rank, r in enumerate(ranks):
        steps = [line["step"] for line in lines if line["rank"] == rank]
        assert steps == list(range(1, int(r["steps"]) + 1))
    walls = [line["wall_seconds"] for line in lines]
    assert walls == sorted(walls)


@pytest.mark.ci
@pytest.mark.long  # their job takes over a minute here
@pytest.mark.multiprocess
@pytest.mark.parametrize("mode", MODES)
def test_bytes_count_the_state_and_the_report_of_every_round(results, mode):
    summary = json.loads(str(results[mode][0]["summary"]))
    rounds = summary["averaging_rounds"]
    per_round = summary["bytes_allreduced"] / rounds
    # LeNet's weights (each worker keeps its momentum by default in both modes; no
    # BatchNorm), as int8 codes and scales in local mode (its default) and float32 in
    # async mode, plus a float64 report of 3 numbers.
    values = summary["parameters"]
    state = quantize.payload_bytes(values, 2, "int8") if mode == "local" else 4 * values
    assert per_round == state + 8 * 3


@pytest.mark.ci
@pytest.mark.long  # their job takes over a minute here
@pytest.mark.multiprocess
def test_slowmo_with_timed_rounds_leaves_both_ranks_on_the_same_weights(results):
    """The outer step divides by and multiplies with the inner rate: taken at each
    worker's own step, the slow rank would compute another x0 and momentum."""
    ranks = results["slowmo"]
    fast, slow = int(ranks[0]["steps"]), int(ranks[1]["steps"])
    assert fast > 1.5 * slow and int(ranks[0]["rounds"][0]) >= 2
    for a, b in zip(ranks[0]["weights"], ranks[1]["weights"]):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(ranks[0]["iterations"], ranks[1]["iterations"])
