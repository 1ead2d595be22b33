"""Measuring inside a running job: step times, and the time of one allreduce round."""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
import keras
import tensorflow as tf

from hvdtrain import comm


class StepTimer(keras.callbacks.Callback):
    """Seconds of every training step after the first `warmup_steps` (tracing, pipeline
    start-up). Put it last: a step's time then includes every other callback's work."""

    def __init__(self, warmup_steps: int):
        super().__init__()
        if warmup_steps < 1:
            raise ValueError(f"warmup_steps must be at least 1, got {warmup_steps}")
        self.warmup_steps = warmup_steps
        self._stamps: list[float] = []
        self._steps = 0

    def on_train_begin(self, logs=None):
        self._stamps, self._steps = [], 0

    def on_train_batch_end(self, batch, logs=None):
        self._steps += 1
        if self._steps >= self.warmup_steps:  # the end of the last warm-up step starts the clock
            self._stamps.append(time.perf_counter())

    @property
    def step_seconds(self) -> list[float]:
        return np.diff(self._stamps).tolist()


def all_workers(values: list[float]) -> list[list[float]]:
    """Every worker's list (all of the same length), on every worker."""
    table = np.zeros((comm.size(), len(values)))
    table[comm.rank()] = values
    (summed,) = comm.total([tf.constant(table)], name="bench_gather")
    return summed.numpy().tolist()


def seconds_per_call(exchange: Callable[[], object], repeats: int = 10) -> float:
    """Mean wall time of `exchange()` (a collective call) once every worker is ready."""
    exchange()  # trace and warm up
    comm.total([tf.zeros(1)], name="bench_line_up")
    start = time.perf_counter()
    for _ in range(repeats):
        exchange()
    return (time.perf_counter() - start) / repeats
