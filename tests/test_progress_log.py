"""Progress lines within an epoch (`--log-every`), on a fake clock."""

import pytest

from hvdtrain.progress import TrainingProgress
from hvdtrain.training.progress_log import ProgressLog, clock_time, progress_line


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.mark.parametrize("seconds, text", [
    (0, "0:00:00"), (59.6, "0:01:00"), (4321.6, "1:12:02"), (2 * 86400 + 3725, "2d 1:02:05"),
    (-3, "0:00:00"),
])
def test_durations_read_as_hours_minutes_seconds(seconds, text):
    assert clock_time(seconds) == text


def test_a_line_names_step_epoch_loss_rate_and_the_time_left_in_the_epoch_and_run():
    progress = TrainingProgress(epoch_examples=1000, examples=2250, steps=70)
    line = progress_line(progress, epoch=2, epochs=4, loss=1.23456, images_per_sec=50.0)
    # 750 examples to the epoch's end and 1,750 to the run's, at 50 images/sec.
    assert line == ("hvdtrain: step 70 | epoch 3/4 (250/1000 examples) | loss 1.2346 | "
                    "50 images/sec | epoch ends in 0:00:15, run in 0:00:35")


def _fit_epoch(log, progress, clock, step_seconds, steps, epoch=0, global_batch=32):
    """One epoch of `steps` steps of `step_seconds` each, as Keras calls the callback."""
    log.on_epoch_begin(epoch)
    for batch in range(steps):
        clock.now += step_seconds
        progress.advance(1, global_batch // 2, workers=2)
        log.on_train_batch_end(batch, {"loss": 2.0 - 0.01 * progress.steps})


def test_a_line_every_interval_of_a_long_epoch_timed_from_its_first_batch():
    clock, lines, progress = FakeClock(), [], TrainingProgress(epoch_examples=32 * 100)
    log = ProgressLog(progress, epochs=2, every=30.0, clock=clock, write=lines.append)
    log.set_params({"verbose": 2, "epochs": 2, "steps": 100})
    # 100 steps of 1 s: intervals start at the first batch's end (step 1), so lines
    # come at steps 31, 61 and 91.
    _fit_epoch(log, progress, clock, 1.0, 100)
    assert [line.split(" | ")[0] for line in lines] == [
        "hvdtrain: step 31", "hvdtrain: step 61", "hvdtrain: step 91"]
    assert "loss 1.6900" in lines[0] and "| 32 images/sec |" in lines[0]
    # 69 steps of 32 examples left in the epoch at 32 images/sec; 169 in the run.
    assert lines[0].endswith("epoch ends in 0:01:09, run in 0:02:49")
    # A new epoch starts its own first interval: its first batch is not timed.
    _fit_epoch(log, progress, clock, 1.0, 40, epoch=1)
    assert len(lines) == 4 and lines[3].startswith("hvdtrain: step 131 | epoch 2/2 ")


def test_epochs_shorter_than_the_interval_print_nothing():
    clock, lines, progress = FakeClock(), [], TrainingProgress(epoch_examples=32 * 20)
    log = ProgressLog(progress, epochs=3, every=30.0, clock=clock, write=lines.append)
    log.set_params({"verbose": 2, "epochs": 3, "steps": 20})
    for epoch in range(3):
        _fit_epoch(log, progress, clock, 1.0, 20, epoch=epoch)
    assert lines == []


@pytest.mark.parametrize("verbose", [0, 1])
def test_no_lines_beside_keras_progress_bar_or_when_asked_for_silence(verbose):
    clock, lines, progress = FakeClock(), [], TrainingProgress(epoch_examples=32 * 100)
    log = ProgressLog(progress, epochs=1, every=30.0, clock=clock, write=lines.append)
    log.set_params({"verbose": verbose, "epochs": 1, "steps": 100})
    _fit_epoch(log, progress, clock, 1.0, 100)
    assert lines == []


def test_log_every_zero_leaves_the_callback_out():
    from hvdtrain.config import load_config
    from hvdtrain.training.build import save_plan
    from hvdtrain.training.callback_factory import get_callbacks, make_checkpointer

    def chief_callbacks(log_every, tmp="/nonexistent-run"):
        cfg = load_config(None, {"log_every": log_every, "step_timeout": 0})
        progress = TrainingProgress(epoch_examples=640)
        checkpointer = make_checkpointer(cfg, tmp, state=None, progress=progress,
                                         saves=save_plan(cfg))
        callbacks = get_callbacks(cfg, tmp, 0.0, progress, state_sync=None,
                                  checkpointer=checkpointer)
        return [type(c).__name__ for c in callbacks.chief_only]

    assert "ProgressLog" in chief_callbacks(30.0)
    assert "ProgressLog" not in chief_callbacks(0.0)
