"""Averaging rounds that run behind training (CoCoD-SGD, Shen et al. 2019).

A round snapshots the state and hands its allreduce to a background thread; training
goes on. At the next round the worker collects the mean and takes
`averaging.delayed_average_update`, then starts the next round from its new state.
It waits only when a round outlasts the steps between two rounds; a worker that is
slower every step still sets the pace, since a round completes only once every worker
has started it.

Horovod matches collectives across workers by tensor name. The round runs as a traced
function, because only a graph op keeps the name it is given (eagerly, Horovod's op is
named after its type and the tensor count, and could meet another eager collective of
the training thread under the same name). With one round in flight at most, one name
serves them all. TensorFlow releases the GIL while a graph runs, so the round and the
training step do not hold each other up.

Memory: a round in flight holds the snapshot and, at its end, the means: about two
more copies of the averaged state.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import numpy as np
import tensorflow as tf

from hvdtrain import comm
from hvdtrain.rounds.averaging import delayed_average_update
from hvdtrain.errors import ArgumentError
from hvdtrain.keras.state import ModelStateAverager, assign, read, weight_distance

ROUND_NAME = "model_state_overlapped"


@dataclass(frozen=True)
class FinishedRound:
    """What a round gave this worker besides its new state."""

    distance: float            # L2 distance of its snapshot weights from their mean
    report: np.ndarray | None  # the sum of the workers' reports, when rounds carry them


class OverlappedRounds:
    """At most one averaging round in flight for `averager`'s variables."""

    def __init__(self, averager: ModelStateAverager,
                 report_length: Callable[[], int] | None = None):
        """`report_length`: every round also sums a float64 report of this length from each
        worker (`hvdtrain.rounds.timed`' counts, or the adaptive period's training loss);
        asked when the round is traced, since it may depend on the number of workers."""
        if averager.outer is not None:
            raise ArgumentError("overlapped rounds take the plain average: an outer optimizer "
                             "(SlowMo, Nesterov) needs every worker at the round's result")
        self.averager = averager
        self.report_length = report_length
        self.reports = report_length is not None
        self.started_at: int | None = None  # the step the round in flight started after
        self._pool: ThreadPoolExecutor | None = None
        self._snapshot: list[tf.Tensor] | None = None
        self._future: Future | None = None
        self._round_fn = None
        self._traced_for: tuple[int, int, int] | None = None

    @property
    def in_flight(self) -> bool:
        return self._future is not None

    def trace(self) -> None:
        """Build the round's graph now, so the first round does not stall on tracing."""
        world = (comm.rank(), comm.size(), comm.world_id())
        if self._traced_for != world and comm.size() > 1 and self.averager.variables:
            # The workers' number shapes the reports; an elastic job that resized retraces.
            self._traced_for = world
            signature = [[tf.TensorSpec(v.shape, tf.as_dtype(v.dtype))
                          for v in self.averager.variables]]
            if self.reports:
                signature.append(tf.TensorSpec([self.report_length()], tf.float64))
            self._round_fn = tf.function(self._mean_and_distance, input_signature=signature)
            self._round_fn.get_concrete_function()

    def start(self, step: int, report=None) -> None:
        """Snapshot the state after `step` and start averaging it (and summing `report`,
        with `reports`) in the background."""
        if self.in_flight:
            raise RuntimeError("a round is already in flight: finish it first")
        if comm.size() == 1 or not self.averager.variables:
            return  # nothing to average; x <- s + (x - s) would only round x
        self.trace()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="hvdtrain-round")
        # Reads are values: the optimizer's next update writes a new buffer, not this one.
        self._snapshot = read(self.averager.variables)
        arguments = (self._snapshot, tf.constant(report, tf.float64)) if self.reports else (
            self._snapshot,)
        self._future = self._pool.submit(self._round_fn, *arguments)
        self.started_at = step

    def finish(self) -> FinishedRound | None:
        """Wait for the round in flight, if any, and apply it (None when nothing was in
        flight)."""
        if not self.in_flight:
            return None
        try:
            means, distance, summed = self._future.result()  # a failed allreduce raises here
        finally:
            snapshot, self._snapshot, self._future = self._snapshot, None, None
        variables = self.averager.variables
        updated = [delayed_average_update(x, s, m)
                   for x, s, m in zip(read(variables), snapshot, means)]
        # x - s can undo the floor the mean got: a variance stays a variance.
        assign(variables, self.averager.clamp_non_negative(updated))
        if self.averager.reference is not None:
            # Compressed rounds send the change from a state all workers hold: this mean is one.
            assign(self.averager.reference, means)
        return FinishedRound(float(distance), summed.numpy() if self.reports else None)

    def _mean_and_distance(self, snapshot, report=None):
        means = self.averager.exchange(snapshot, name=ROUND_NAME)
        n = len(self.averager.weights)
        summed = tf.zeros([0], tf.float64)
        if report is not None:
            (summed,) = comm.total([report], name=ROUND_NAME + "_reports")
        return means, weight_distance(snapshot[:n], means[:n]), summed

    def close(self) -> None:
        """Apply any round in flight and stop the thread."""
        try:
            self.finish()
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Stop without applying: after a failed fit, whose state is not kept anyway. A
        round already on the wire finishes (or fails) on its own."""
        self._snapshot = self._future = None
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None
