"""Averaging rounds every T seconds of wall time (`--sync-seconds`): when, and what they tell.

With rounds every `n_sync` steps every worker takes the same steps, so each knows the
job's progress as it happens. With rounds every T seconds, each worker starts a round
once T seconds have passed on its own clock since it started the last one: a faster
worker takes more steps in between, like the clients of Paine et al. (2013), and a
slower one no longer holds it back. Since the workers start together after every
blocking round and then run on the same period, the k-th round of each meets the
k-th round of the others; nothing else keys them.

Out of step, a worker knows only its own examples. Every round therefore carries a
report (`report_vector`): the examples this worker trained since its last report, and
its steps so far. Their sum tells every worker the same job-wide counts, which it
keeps in its `TrainingProgress` (`ReportedCounts`).

An epoch is counted in examples of all workers together, and it ends at a round, so
that every worker ends it at the same one:
- a blocking round learns the count as of now: the epoch ends at the first round
  whose count reaches the epoch's end;
- an overlapped round learns the count as of its snapshot, one period late: the epoch
  ends at the first round at which that count plus what the last period added
  reaches the end (`epoch_end_due`). That round is made blocking, and its exact count
  decides: short of the end, the epoch goes on.
An epoch thus runs over by less than one period of the job's examples.

A round weights every worker's state the same, however many steps it took. A worker's
change since the last round is the sum of its steps' updates, so in the plain mean
every minibatch moves the model by the same amount, as in large-batch SGD and as in
Paine's parameter server, which applies every pushed update whole. Weighting by steps
would count a fast worker's minibatches more than a slow one's (each by its worker's
step count), pulling the model toward the shard of the faster hardware.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from hvdtrain.errors import ArgumentError
from hvdtrain.progress import TrainingProgress


@dataclass
class RoundTimer:
    """Says when T seconds have passed on this worker's clock since its last round."""

    seconds: float
    clock: Callable[[], float] = time.monotonic
    started: float | None = field(default=None)

    def __post_init__(self):
        if not self.seconds > 0:
            raise ArgumentError(f"sync_seconds must be positive, got {self.seconds!r}")

    def restart(self) -> None:
        self.started = self.clock()

    def due(self) -> bool:
        return self.started is not None and self.clock() - self.started >= self.seconds


def report_vector(examples: int, steps: int, rank: int, workers: int) -> np.ndarray:
    """What one worker adds to a round's sum: [its examples since its last report, then
    each worker's steps so far, its own at its rank and zeros elsewhere]."""
    vector = np.zeros(workers + 1, np.float64)  # exact for counts below 2**53
    vector[0] = examples
    vector[1 + rank] = steps
    return vector


def epoch_end_due(known: int, previous: int, epoch_end: int, overlapped: bool) -> bool:
    """Whether the epoch should end at this round.

    `known` is the job's examples as of the last round whose sum has arrived, and
    `previous` as of the one before. A blocking round's count is current; an overlapped
    round's is one period old, so what the last period added is added once more.
    """
    expected = known + (max(known - previous, 0) if overlapped else 0)
    return expected >= epoch_end


@dataclass
class ReportedCounts:
    """One worker's side of the reports: what it sent, and the job-wide counts they gave.

    `progress.examples` stays this worker's best count of the job's examples: the total
    the last round reported, plus its own examples since its report to that round.
    """

    progress: TrainingProgress
    rank: int
    workers: int
    sent_examples: int = 0   # own examples already in some report
    in_flight: int | None = None  # own examples in the report of a round not yet summed
    known: int = 0           # the job's examples as of the last summed round
    previous: int = 0        # the same, one summed round earlier

    def __post_init__(self):
        self.start_over()

    def start_over(self) -> None:
        """Take the progress as exact and known to all (after a blocking round, or while
        the workers are in step)."""
        self.sent_examples = self.progress.own_examples
        self.in_flight = None
        self.known = self.previous = self.progress.examples

    def report(self) -> np.ndarray:
        """This worker's report for the round it starts now."""
        if self.in_flight is not None:
            raise RuntimeError("the last round's report has not been summed yet")
        self.in_flight = self.progress.own_examples - self.sent_examples
        self.sent_examples = self.progress.own_examples
        return report_vector(self.in_flight, self.progress.own_steps, self.rank, self.workers)

    def learn(self, summed: np.ndarray) -> None:
        """Take in the sum of every worker's report to one round."""
        if self.in_flight is None:
            raise RuntimeError("no report of this worker is waiting for its sum")
        new_examples = int(round(float(summed[0])))
        self.progress.examples += new_examples - self.in_flight  # the others' share
        self.progress.worker_steps = tuple(int(round(float(s))) for s in summed[1:])
        self.previous, self.known = self.known, self.known + new_examples
        self.in_flight = None

    def epoch_end_due(self, epoch_end: int, overlapped: bool) -> bool:
        return epoch_end_due(self.known, self.previous, epoch_end, overlapped)
