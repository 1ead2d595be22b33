"""Ends a worker whose training has stopped making progress (a dead or hung peer)."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable

import keras

EXIT_CODE = 5


def end_job(message: str) -> None:
    """Print `message` on stderr and end this process now; horovodrun then stops the job."""
    print(message, file=sys.stderr, flush=True)
    # Not sys.exit: it would only end the watcher thread, and the main thread is blocked
    # inside an allreduce, where it would never see an exception either.
    os._exit(EXIT_CODE)


# The first step of a fit gets this many step timeouts, and at least FIRST_STEP_FLOOR
# seconds: before it ends come the callbacks' broadcasts, the input pipeline's start (a
# shuffle buffer filling), tracing the step and, with --xla, compiling it; minutes for a
# large model on a slow host. A hang is then caught late rather than never, and a slow
# start is not taken for one.
FIRST_STEP_FACTOR = 5
FIRST_STEP_FLOOR = 600.0

FIRST_STEP = "the first training step of this fit"
STEPS = "training steps"


def first_step_allowance(timeout: float) -> float:
    """Seconds the first step of a fit (or the first progress of a watched task) may take."""
    return max(FIRST_STEP_FACTOR * timeout, FIRST_STEP_FLOOR)


class StepWatchdog(keras.callbacks.Callback):
    """Ends this worker's process when training stops making progress for too long.

    A peer that dies or hangs leaves the others blocked inside a collective call, where
    no Python code runs; a watcher thread notices, names what stalled and calls
    `on_timeout` (by default `end_job`).

    What it watches:
    - a fit, from `expect_first_step()` (the runner calls it before `fit`, so the other
      callbacks' broadcasts at train begin are watched too; `on_train_begin` calls it
      as well) until its first step ends: `first_step_timeout` seconds
      (`first_step_allowance`), since tracing and compiling that step can take long,
      and a new fit (an elastic restart) may trace it again.
    - then each training step ending, and the epoch boundaries, so each part of the
      time between two steps (validation, the epoch-end logs, allreduces and checkpoint
      save) gets a whole `timeout` of its own rather than sharing one. A save itself
      must fit in the timeout: the peers wait for it in their next allreduce, where no
      watchdog could tell it from a hang.
    - each validation batch ending. Watching pauses from the start of a validation pass
      until its first batch ends, since the test step may be compiling; evaluation
      needs no collective, so a peer hung meanwhile is caught at the next allreduce.
    - work outside a fit that ends in a collective call (the final evaluation):
      `watch(what)`, then `beat()` at each piece of progress; the first is due within
      the first step's allowance (it may trace), each later one within `timeout`.

    One watcher thread serves every fit: `on_train_end` stops it and the next
    `on_train_begin` (or `expect_first_step`) starts it again; a fit ended by an
    exception gets no `on_train_end`, so its thread stays, re-armed by the next fit and
    reused. Call `close()` (or use the watchdog as a context manager) to stop it
    explicitly, e.g. after a fit that raised. `check()` runs one check synchronously.
    """

    EXIT_CODE = EXIT_CODE

    def __init__(self, timeout: float, first_step_timeout: float | None = None,
                 poll: float | None = None, clock: Callable[[], float] = time.monotonic,
                 on_timeout: Callable[[str], None] = end_job):
        super().__init__()
        self.timeout = timeout
        self.first_step_timeout = first_step_timeout or first_step_allowance(timeout)
        self.poll = poll or min(5.0, timeout / 4)
        self.clock = clock
        self.on_timeout = on_timeout
        self._lock = threading.Lock()   # the watcher thread reads what the callbacks write
        self._what: str | None = None   # what is awaited (FIRST_STEP, STEPS, a task); None: nothing
        self._allowance = timeout       # seconds it may take
        self._last: float | None = None  # when progress was last seen; None: not watching (or paused)
        self._step = 0                  # steps finished in this fit
        self._first_batch = 0           # of the batches the running train call covers
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None

    # --- what to watch

    def expect_first_step(self) -> None:
        """Watch a fit from now until its first step ends, with the first step's allowance."""
        self._arm(FIRST_STEP)

    def watch(self, what: str) -> None:
        """Watch `what` (a task outside a fit, named in the message) until `close()`."""
        self._arm(what)

    def beat(self) -> None:
        """Progress in the watched task: the next is due within `timeout`."""
        with self._lock:
            if self._what is not None:
                self._last, self._allowance = self.clock(), self.timeout

    def _arm(self, what: str) -> None:
        with self._lock:
            self._what, self._allowance = what, self.first_step_timeout
            self._last, self._step = self.clock(), 0
        self._start()

    # --- the callbacks: what counts as progress

    def on_train_begin(self, logs=None):
        self.expect_first_step()  # also re-arms what an earlier fit that raised left armed

    def on_train_batch_begin(self, batch, logs=None):
        self._first_batch = batch

    def on_train_batch_end(self, batch, logs=None):
        with self._lock:
            # Several steps when the model runs `steps_per_execution` > 1 per call.
            self._step += batch - self._first_batch + 1
            self._what, self._allowance, self._last = STEPS, self.timeout, self.clock()

    def _beat(self, *args, **kwargs):
        with self._lock:
            if self._what is not None:
                self._last = self.clock()

    on_epoch_begin = on_epoch_end = on_test_batch_end = on_test_end = _beat

    def on_test_begin(self, logs=None):
        with self._lock:
            self._last = None  # until the first validation batch ends: see the class comment

    def on_train_end(self, logs=None):
        self.close()

    # --- the watcher

    def check(self) -> bool:
        """Call `on_timeout` if what is watched made no progress in its allowance; whether it did."""
        with self._lock:
            if self._last is None or self.clock() - self._last <= self._allowance:
                return False
            self._last = None  # one report per stall, should `on_timeout` return
            stalled = self._stalled()
        self.on_timeout(f"hvdtrain: error: {stalled}; a peer may have died or hung. "
                        f"Ending the job.")
        return True

    def _stalled(self) -> str:
        if self._what == STEPS:
            return (f"no training step finished for {self.timeout:.0f} s after step "
                    f"{self._step} of this fit")
        if self._what == FIRST_STEP:
            return (f"{FIRST_STEP} did not finish within {self._allowance:.0f} s of its start "
                    f"(the first step's allowance, tracing included)")
        return f"{self._what} made no progress for {self._allowance:.0f} s"

    def close(self) -> None:
        """Disarm and stop the watcher thread; the next fit starts it again."""
        self._disarm()
        self._closing.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def __enter__(self) -> StepWatchdog:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _disarm(self) -> None:
        with self._lock:
            self._what, self._last, self._step = None, None, 0

    def _start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return  # left running by a fit that raised: reuse it
        self._closing.clear()
        self._thread = threading.Thread(target=self._watch, name="hvdtrain-watchdog", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._closing.wait(self.poll):
            self.check()
