"""Progress counted in examples: epochs, fit phases and checkpoints across worker counts."""

from __future__ import annotations

import math

import pytest

from hvdtrain.progress import (FitPhase, TrainingProgress, epoch_length, executed_steps,
                               fit_phases, steps_to_epoch_end)
from hvdtrain import comm
from hvdtrain.training import callbacks
from hvdtrain.training.callbacks import ThroughputMeter, job_rate
from hvdtrain.training.checkpoints import SavedProgress


def test_epochs_of_a_multiple_of_the_global_batch_go_in_one_fit():
    assert fit_phases(0, 640, 3, 64) == [FitPhase(0, 3, 10)]
    assert fit_phases(1920, 640, 3, 64) == []


def test_resume_mid_epoch_runs_the_rest_of_that_epoch_first():
    assert fit_phases(13 * 64, 640, 3, 64) == [FitPhase(1, 2, 7), FitPhase(2, 3, 10)]


def test_epochs_end_at_the_first_step_past_each_multiple_of_the_epoch_length():
    # 60000 examples in global batches of 128: 468.75 steps per epoch.
    phases = fit_phases(0, 60000, 4, 128)
    steps = [p.steps for p in phases for _ in range(p.first_epoch, p.end_epoch)]
    assert steps == [469, 469, 469, 468]
    total = sum(steps) * 128
    assert 0 <= total - 4 * 60000 < 128  # within one global batch of epochs × dataset


def test_a_smaller_world_finishes_the_epoch_in_examples_not_in_steps():
    # Two workers of 32 stopped at step 500 of 468-step epochs (60000 examples each):
    # 32000 examples, epoch 1 of 2. One worker goes on with global batch 32.
    progress = TrainingProgress(epoch_examples=60000, examples=500 * 64, steps=500)
    assert progress.epoch == 0
    assert steps_to_epoch_end(progress.examples, 60000, 32) == 875
    phases = fit_phases(progress.examples, 60000, 2, 32)
    assert phases == [FitPhase(0, 1, 875), FitPhase(1, 2, 1875)]


def test_epoch_length_is_the_dataset_or_the_cap_in_the_starting_global_batch():
    assert epoch_length(60000, None, 128) == 60000
    assert epoch_length(60000, 10, 128) == 1280
    assert epoch_length(1000, 10, 128) == 1000     # the cap is a cap
    assert epoch_length(None, 10, 128) == 1280     # endless data
    with pytest.raises(ValueError):
        epoch_length(None, None, 128)


def test_progress_advances_steps_and_examples_and_knows_its_epoch():
    progress = TrainingProgress(epoch_examples=100)
    progress.advance(3, 32)
    assert (progress.steps, progress.examples, progress.epoch) == (3, 96, 0)
    progress.advance(1, 32)
    assert progress.epoch == 1
    assert progress.in_consensus  # synchronous training: always
    progress.consensus_step = 2
    assert not progress.in_consensus


def test_one_batch_callback_covers_every_step_of_an_execution():
    assert executed_steps(0, 0) == 1
    assert executed_steps(4, 7) == 4


def test_checkpoints_written_before_examples_were_counted_still_resume():
    old = {"step": 23, "steps_per_epoch": 10, "workers": 2, "batch_size": 8, "sync_count": 4}
    saved = SavedProgress.from_json(old)
    assert saved.progress == TrainingProgress(epoch_examples=160, examples=368, steps=23,
                                              averaging_rounds=4)
    assert (saved.workers, saved.batch_size, saved.progress.epoch) == (2, 8, 2)
    assert SavedProgress.from_json(saved.to_json()) == saved


def test_the_jobs_rate_spans_the_earliest_first_batch_to_the_latest_last_batch():
    # Rank 0 trained 320 images from t=100 to 102; rank 1 started late, 320 from 104 to 106.
    images, seconds = job_rate([[100.0, 102.0, 0.0, 320.0], [104.0, 106.0, 0.0, 320.0]])
    assert (images, seconds) == (640, 6.0)  # not 640 images in either worker's 2 s
    # A worker without a batch this epoch adds neither images nor time.
    assert job_rate([[100.0, 102.0, 0.0, 320.0], [math.inf, -math.inf, 0.0, 0.0]]) == (320, 2.0)
    assert job_rate([[math.inf, -math.inf, 0.0, 0.0]]) == (0, 0.0)


def test_the_jobs_rate_leaves_out_the_evaluations_the_workers_held_together():
    assert job_rate([[100.0, 110.0, 3.0, 500.0], [100.5, 110.0, 3.2, 500.0]]) == (
        1000, pytest.approx(10.0 - 3.1))


class _Clock:
    """time.time and time.perf_counter of the callbacks module, moved by hand."""

    def __init__(self, now: float):
        self.now = now

    def time(self) -> float:
        return self.now

    def perf_counter(self) -> float:
        return self.now


def test_an_epochs_span_runs_to_its_end_and_takes_in_the_round_held_there(monkeypatch):
    comm.init()  # a world of one worker
    clock = _Clock(100.0)
    monkeypatch.setattr(callbacks, "time", clock)
    progress = TrainingProgress()
    meter = ThroughputMeter(progress)
    meter.on_epoch_begin(0)
    for batch in range(3):  # batches of 16 ending at t=100, 101 and 102
        clock.now = 100.0 + batch
        progress.advance(1, 16)
        meter.on_train_batch_end(batch)
    clock.now = 103.0       # the epoch-end round: a second of training's time
    progress.eval_seconds += 0.5
    clock.now = 103.5       # then validation: evaluation's, left out
    logs = {}
    meter.on_epoch_end(0, logs)
    # 32 images after the first batch's end, over 3.5 s less 0.5 s of validation.
    assert logs["images_per_sec"] == pytest.approx(32 / 3.0)
    assert (meter.timed_images, meter.timed_seconds) == (32, pytest.approx(3.0))
