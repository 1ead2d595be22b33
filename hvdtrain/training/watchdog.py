"""Ends a worker whose training has stopped making progress (a dead or hung peer)."""

from __future__ import annotations

import os
import sys
import threading
import time

import keras


class StepWatchdog(keras.callbacks.Callback):
    """Ends this worker's process when no step finishes for `timeout` seconds.

    A peer that dies or hangs leaves the others blocked inside an allreduce, where no
    Python code runs; this thread notices, prints which step stalled and exits, and
    horovodrun then stops the whole job. Armed after the first step of each `fit`,
    since building and compiling the step can legitimately take long.
    """

    EXIT_CODE = 5

    def __init__(self, timeout: float, poll: float | None = None):
        super().__init__()
        self.timeout = timeout
        self.poll = poll or min(5.0, timeout / 4)
        self._last = None
        self._step = 0
        self._stop = threading.Event()
        self._thread = None

    def _beat(self, *args, **kwargs):
        self._last = time.monotonic()

    on_train_batch_begin = on_test_batch_end = on_epoch_begin = on_epoch_end = _beat

    def on_train_batch_end(self, batch, logs=None):
        self._step += 1
        self._beat()

    def on_train_begin(self, logs=None):
        self._last = None
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="hvdtrain-watchdog", daemon=True)
        self._thread.start()

    def on_train_end(self, logs=None):
        self._stop.set()

    def _watch(self):
        while not self._stop.wait(self.poll):
            if self._last is not None and time.monotonic() - self._last > self.timeout:
                print(f"hvdtrain: error: no training step finished for {self.timeout:.0f} s after "
                      f"step {self._step} of this fit; a peer may have died or hung. Ending the job.",
                      file=sys.stderr, flush=True)
                os._exit(self.EXIT_CODE)
