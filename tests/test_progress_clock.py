"""The run's two clocks: `wall_seconds`, this process's, and `train_seconds`, the run's
time training (evaluations left out) over every process, kept by checkpoints and elastic
commits with the run's evaluation time beside it (hvdtrain.progress.TrainingProgress)."""

import pytest

from hvdtrain.benchmarks.compare import _run_seconds
from hvdtrain.benchmarks.time_to_accuracy import accuracy_points
from hvdtrain.progress import TrainingProgress


def test_a_resumed_runs_train_seconds_go_on_from_its_checkpoints_and_leave_evaluations_out():
    # The checkpoint kept 70 s trained and 5 s evaluated; this process started at t=1000.
    progress = TrainingProgress(epoch_examples=80, train_seconds=70.0, eval_seconds=5.0)
    progress.start_clock(1000.0)
    progress.eval_seconds += 10.0  # an evaluation in this process
    assert progress.trained_seconds(1030.0) == pytest.approx(70.0 + 30.0 - 10.0)
    saved = progress.saved(1030.0)
    assert (saved["train_seconds"], saved["eval_seconds"]) == (pytest.approx(90.0), 15.0)
    # What a checkpoint keeps reads back as the run's seconds, not lost at the next resume.
    again = TrainingProgress(**saved)
    again.start_clock(5000.0)
    assert again.trained_seconds(5010.0) == pytest.approx(100.0)
    assert again.eval_seconds == 15.0


def test_an_elastic_commit_carries_the_seconds_and_a_reset_counts_on_from_them():
    progress = TrainingProgress(epoch_examples=80)
    progress.start_clock(0.0)
    commit = progress.saved(40.0)  # rank 0's commit at 40 s
    # After a reset every worker, a newcomer too, takes the commit and counts from now.
    joined = TrainingProgress(epoch_examples=80)
    joined.start_clock(0.0)
    joined.restore(commit)
    assert joined.trained_seconds(joined.clock_start + 5.0) == pytest.approx(45.0)
    # A count restored alone (the step, as LocalSGD does) leaves the clock running.
    running = TrainingProgress(epoch_examples=80)
    running.start_clock(0.0)
    running.restore({"steps": 3})
    assert running.trained_seconds(12.0) == pytest.approx(12.0)


def test_time_to_target_and_compare_read_the_runs_seconds_of_a_resumed_run():
    # Resumed after 100 s trained and 20 evaluating; this process ran 50 s, 10 evaluating.
    summary = {"test_accuracy": 0.9, "examples_trained": 640, "bytes_allreduced": 0,
               "wall_seconds": 50.0, "train_seconds": 140.0, "eval_seconds": 30.0}
    assert accuracy_points([], summary)[-1].train_seconds == 140.0
    assert _run_seconds(summary) == 170.0
    # A summary written before the run's seconds were kept: its wall time.
    old = {"test_accuracy": 0.9, "examples_trained": 640, "bytes_allreduced": 0,
           "wall_seconds": 150.0, "eval_seconds": 10.0}
    assert accuracy_points([], old)[-1].train_seconds == 140.0
    assert _run_seconds(old) == 150.0
