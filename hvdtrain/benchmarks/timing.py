"""Measuring inside a running job: step times, and the time of one allreduce round."""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
import keras
import tensorflow as tf

from hvdtrain import comm
from hvdtrain.keras.exchange_clock import exchange_clock


class StepTimer(keras.callbacks.Callback):
    """Seconds of every training step after the first `warmup_steps` (tracing, pipeline
    start-up). Put it last: a step's time then includes every other callback's work.
    `round_share` is the part of the timed stretch spent in averaging rounds, from the
    `round_seconds` that LocalSGD adds to the batch logs (0 without it)."""

    def __init__(self, warmup_steps: int):
        super().__init__()
        if warmup_steps < 1:
            raise ValueError(f"warmup_steps must be at least 1, got {warmup_steps}")
        self.warmup_steps = warmup_steps
        self._stamps: list[float] = []
        self._steps = 0

    def on_train_begin(self, logs=None):
        self._stamps, self._steps, self._round_seconds = [], 0, []

    def on_train_batch_end(self, batch, logs=None):
        self._steps += 1
        if self._steps >= self.warmup_steps:  # the end of the last warm-up step starts the clock
            self._stamps.append(time.perf_counter())
            self._round_seconds.append(float((logs or {}).get("round_seconds", 0.0)))

    @property
    def round_share(self) -> float:
        if len(self._stamps) < 2:
            return 0.0
        elapsed = self._stamps[-1] - self._stamps[0]
        return (self._round_seconds[-1] - self._round_seconds[0]) / elapsed if elapsed else 0.0

    @property
    def step_seconds(self) -> list[float]:
        return np.diff(self._stamps).tolist()


def slowdown_seconds(factor: float, step_seconds: float, exchange_seconds: float) -> float:
    """How long to sleep after a step to make its compute `factor` times slower: the
    gradient exchange inside it (`exchange_seconds` of its `step_seconds`) is not
    compute, and a slower GPU would not make it slower."""
    return (factor - 1) * max(0.0, step_seconds - exchange_seconds)


class SlowerSteps(keras.callbacks.Callback):
    """Make worker `rank`'s computation `factor` times slower, as a slower GPU or a noisy
    neighbour would: after each step's compiled function it sleeps (factor − 1) times what
    that function computed. Rounds, other callbacks and the gradient exchange inside a
    sync step are not slowed, only the computation, and not a fit's first step, which
    mostly traces the function on the host. The exchange's share of the step comes from
    the model's `ExchangeClock` (`hvdtrain.keras.exchange_clock`).

    On a machine whose workers share the cores, the sleeping worker leaves its core to
    the others, which then run faster than they would beside a truly slower GPU. On a
    GPU the function returns once the step is queued; reading the clock waits for it.
    """

    def __init__(self, rank: int, factor: float, clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep):
        super().__init__()
        if factor < 1:
            raise ValueError(f"factor must be at least 1, got {factor}")
        self.rank, self.factor = rank, factor
        self._clock, self._sleep = clock, sleep
        self._keras_step = None

    def on_train_begin(self, logs=None):
        if comm.rank() != self.rank or self.factor == 1:
            return
        step, factor, clock, sleep = self.model.train_function, self.factor, self._clock, self._sleep
        exchange = exchange_clock(self.model)
        exchanged = exchange.read if exchange is not None else (lambda: 0.0)
        self._keras_step = step
        traced = False

        def slower_step(iterator):
            nonlocal traced
            start, exchanged_before = clock(), exchanged()
            logs = step(iterator)
            if traced:
                exchange_seconds = exchanged() - exchanged_before  # waits for the step
                sleep(slowdown_seconds(factor, clock() - start, exchange_seconds))
            traced = True
            return logs

        # Keras looks the function up at every step, and makes it again only when forced.
        self.model.train_function = slower_step

    def on_train_end(self, logs=None):
        # Keras keeps the function between fits: a later fit would wrap the wrapper.
        if self._keras_step is not None:
            self.model.train_function, self._keras_step = self._keras_step, None


def all_workers(values: list[float]) -> list[list[float]]:
    """Every worker's list (their lengths may differ), on every worker."""
    rows = comm.gather_rows(tf.constant(values, tf.float64, shape=[len(values)]),
                            name="bench_gather")
    return [row.numpy().tolist() for row in rows]


def seconds_per_call(exchange: Callable[[], object], repeats: int = 10) -> float:
    """Mean wall time of `exchange()` (a collective call) once every worker is ready."""
    exchange()  # trace and warm up
    comm.total([tf.zeros(1)], name="bench_line_up")
    start = time.perf_counter()
    for _ in range(repeats):
        exchange()
    return (time.perf_counter() - start) / repeats
