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


class StepWatchdog(keras.callbacks.Callback):
    """Ends this worker's process when no step finishes for `timeout` seconds.

    A peer that dies or hangs leaves the others blocked inside an allreduce, where no
    Python code runs; a watcher thread notices, names the step that stalled and calls
    `on_timeout` (by default `end_job`). It arms only when the first training step of
    each `fit` has ended: tracing and compiling that step can legitimately take long,
    and a new fit (an elastic restart) may trace it again.

    What counts as progress once armed:
    - a training step ending, and the epoch boundaries, so each part of the time
      between two steps (validation, the epoch-end logs, allreduces and checkpoint
      save) gets a whole `timeout` of its own rather than sharing one. A save itself
      must fit in the timeout: the peers wait for it in their next allreduce, where no
      watchdog could tell it from a hang.
    - each validation batch ending. Watching pauses from the start of a validation pass
      until its first batch ends, since the test step may be compiling; evaluation
      needs no collective, so a peer hung meanwhile is caught at the next allreduce.

    One watcher thread serves every fit: `on_train_end` stops it and the next
    `on_train_begin` starts it again; a fit ended by an exception gets no
    `on_train_end`, so its thread stays, disarmed by the next fit's `on_train_begin`
    and reused. Call `close()` (or use the watchdog as a context manager) to stop it
    explicitly, e.g. after a fit that raised. `check()` runs one check synchronously.
    """

    EXIT_CODE = EXIT_CODE

    def __init__(self, timeout: float, poll: float | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 on_timeout: Callable[[str], None] = end_job):
        super().__init__()
        self.timeout = timeout
        self.poll = poll or min(5.0, timeout / 4)
        self.clock = clock
        self.on_timeout = on_timeout
        self._lock = threading.Lock()   # the watcher thread reads what the callbacks write
        self._armed = False             # this fit's first step has ended
        self._last: float | None = None  # when progress was last seen; None: not watching
        self._step = 0                  # steps finished in this fit
        self._first_batch = 0           # of the batches the running train call covers
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None

    # --- the callbacks: what counts as progress

    def on_train_begin(self, logs=None):
        self._disarm()  # also what an earlier fit that raised left armed
        self._start()

    def on_train_batch_begin(self, batch, logs=None):
        self._first_batch = batch

    def on_train_batch_end(self, batch, logs=None):
        with self._lock:
            # Several steps when the model runs `steps_per_execution` > 1 per call.
            self._step += batch - self._first_batch + 1
            self._armed = True
            self._last = self.clock()

    def _beat(self, *args, **kwargs):
        with self._lock:
            if self._armed:
                self._last = self.clock()

    on_epoch_begin = on_epoch_end = on_test_batch_end = on_test_end = _beat

    def on_test_begin(self, logs=None):
        with self._lock:
            self._last = None  # until the first validation batch ends: see the class comment

    def on_train_end(self, logs=None):
        self.close()

    # --- the watcher

    def check(self) -> bool:
        """Call `on_timeout` if armed and nothing progressed for `timeout`; whether it did."""
        with self._lock:
            if self._last is None or self.clock() - self._last <= self.timeout:
                return False
            self._last = None  # one report per stall, should `on_timeout` return
            step = self._step
        self.on_timeout(f"hvdtrain: error: no training step finished for {self.timeout:.0f} s "
                        f"after step {step} of this fit; a peer may have died or hung. "
                        f"Ending the job.")
        return True

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
            self._armed, self._last, self._step = False, None, 0

    def _start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return  # left running by a fit that raised: reuse it
        self._closing.clear()
        self._thread = threading.Thread(target=self._watch, name="hvdtrain-watchdog", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._closing.wait(self.poll):
            self.check()
