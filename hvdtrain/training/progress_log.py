"""A progress line every few seconds within an epoch, on rank 0.

Keras's one line per epoch (`verbose=2`, what a log file gets) leaves an ImageNet epoch
silent for hours. `ProgressLog` adds a line every `--log-every` seconds between them;
the epoch's own line stays as it is. A run whose epochs are shorter than the interval
prints none.
"""

from __future__ import annotations

import time
from typing import Callable

import keras

from hvdtrain.progress import TrainingProgress


def clock_time(seconds: float) -> str:
    """4321.6 -> '1:12:02'; past a day, '2d 3:04:05'."""
    days, rest = divmod(int(round(max(seconds, 0.0))), 86400)
    hours, rest = divmod(rest, 3600)
    text = f"{hours}:{rest // 60:02d}:{rest % 60:02d}"
    return f"{days}d {text}" if days else text


def progress_line(progress: TrainingProgress, epoch: int, epochs: int, loss: float,
                  images_per_sec: float) -> str:
    """What rank 0 prints during epoch `epoch` (from 0): step, epoch, loss, the job's rate
    and the time left, to the end of the epoch and of the run at the last interval's rate.
    """
    epoch_start = epoch * progress.epoch_examples
    to_epoch_end = max(epoch_start + progress.epoch_examples - progress.examples, 0)
    to_run_end = max(epochs * progress.epoch_examples - progress.examples, 0)
    if images_per_sec > 0:
        left = (f"epoch ends in {clock_time(to_epoch_end / images_per_sec)}, "
                f"run in {clock_time(to_run_end / images_per_sec)}")
    else:
        left = "time left unknown"
    return (f"hvdtrain: step {progress.steps} | epoch {epoch + 1}/{epochs} "
            f"({progress.examples - epoch_start}/{progress.epoch_examples} examples) | "
            f"loss {loss:.4f} | {images_per_sec:.0f} images/sec | {left}")


class ProgressLog(keras.callbacks.Callback):
    """Prints `progress_line` every `every` seconds of an epoch (rank 0 only).

    Only when Keras prints one line per epoch (`verbose=2`): its progress bar
    (`verbose=1`) shows the same as it goes, and `verbose=0` asks for silence. Each
    epoch's first interval starts at the end of its first batch, which leaves out
    tracing and pipeline start-up, as `ThroughputMeter` does.
    """

    def __init__(self, progress: TrainingProgress, epochs: int, every: float,
                 clock: Callable[[], float] = time.monotonic,
                 write: Callable[[str], None] = lambda line: print(line, flush=True)):
        super().__init__()
        self.progress = progress
        self.epochs = epochs
        self.every = every
        self._clock = clock
        self._write = write
        self._since = None  # (time, examples) where the current interval began
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch, self._since = epoch, None

    def on_train_batch_end(self, batch, logs=None):
        if self.params.get("verbose") != 2:
            return
        now, examples = self._clock(), self.progress.examples
        if self._since is None:
            self._since = (now, examples)
            return
        seconds = now - self._since[0]
        if seconds < self.every:
            return
        rate = (examples - self._since[1]) / seconds
        loss = float((logs or {}).get("loss", float("nan")))
        self._write(progress_line(self.progress, self._epoch, self.epochs, loss, rate))
        self._since = (now, examples)
