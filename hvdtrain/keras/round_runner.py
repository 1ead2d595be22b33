"""How a local SGD round runs on this worker, whoever decided it (the period's trigger,
the round policy): blocking, overlapped, or the average only shown; and the counts.

`LocalSGD` decides when; the round kinds (`hvdtrain.keras.round_kinds`) decide how a
round the period asks for is held; both run it through this one object, which alone
writes the rounds' counts into the run's progress.
"""

from __future__ import annotations

import contextlib
import time

import keras

from hvdtrain.keras.average_view import AverageView
from hvdtrain.keras.fragmented_rounds import FragmentedAverager
from hvdtrain.keras.overlap import OverlappedRounds
from hvdtrain.keras.round_reports import NoReport
from hvdtrain.keras.state import ModelStateAverager, set_optimizer_step
from hvdtrain.progress import TrainingProgress


class RoundRunner:
    """Runs rounds of `averager` (given by `attach`) and counts them in `progress`.

    `single_warm_start`: the warm start's hand-over gives every worker rank 0's state
    (Paine's one-worker warm start) instead of the mean."""

    def __init__(self, progress: TrainingProgress, report: NoReport, trigger,
                 single_warm_start: bool):
        self.progress = progress
        self.report = report
        self.trigger = trigger
        self.single_warm_start = single_warm_start
        self.model: keras.Model | None = None
        self.averager: ModelStateAverager | FragmentedAverager | None = None
        self.overlapped: OverlappedRounds | None = None
        self._distances: list[float] = []
        self.last_seconds = 0.0  # of the last span `timing` counted

    def attach(self, model: keras.Model, averager: ModelStateAverager | FragmentedAverager,
               overlapped: OverlappedRounds | None) -> None:
        self.model, self.averager, self.overlapped = model, averager, overlapped

    def trace(self, warming: bool) -> None:
        """Build the rounds' graphs now, so no round stalls training on tracing."""
        self.averager.trace(apply_outer=True)
        if self.overlapped is not None:
            self.overlapped.trace()
        if warming:
            self.averager.trace(apply_outer=False, take_chief=self.single_warm_start)

    @contextlib.contextmanager
    def timing(self):
        """Count the time inside in the run's seconds in rounds; `last_seconds` then holds it."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.last_seconds = time.perf_counter() - start
            self.progress.round_seconds += self.last_seconds

    @property
    def fragmented(self) -> bool:
        """Whether a period's round averages one fragment of the state only."""
        return isinstance(self.averager, FragmentedAverager)

    def next_fragment(self) -> int:
        """The fragment a period's round averages: the next in turn by the run's rounds,
        which every worker counts alike."""
        return self.progress.averaging_rounds % self.averager.count

    def blocking_round(self, by_trigger: bool = False, warm_start: bool = False,
                       whole: bool = True) -> None:
        """Every worker takes the mean now (after a one-worker warm start, rank 0's
        state); `by_trigger`: a round the trigger held, which its report goes with.
        `whole=False`: a period's round, of one fragment when the state is fragmented."""
        self.progress.state_bytes += self.report.before_state()
        set_optimizer_step(self.model.optimizer, self.progress.steps)  # the outer step's rate
        if whole or not self.fragmented:
            self._whole_round(warm_start)
        else:
            part = self.averager.parts[self.next_fragment()]
            part.average()  # its distance covers one fragment: not the divergence's
            self._count_round(part.bytes_per_round)
        if by_trigger:
            self.progress.state_bytes += self.report.after_state()

    def _whole_round(self, warm_start: bool) -> None:
        # After a synchronous warm start only the BatchNorm statistics differ; after a
        # one-worker warm start everything but rank 0's state is thrown away.
        distance = self.averager.average(apply_outer=not warm_start,
                                         take_chief=warm_start and self.single_warm_start)
        if not warm_start:
            self._distances.append(distance)
        self._count_round(self.averager.bytes_per_round)
        self.progress.consensus_step = self.progress.steps

    def start_overlapped(self) -> None:
        """Start a round from the state now (of the next fragment, when fragmented),
        behind the next steps; the workers are not in consensus until a blocking round."""
        report = self.report.carried()
        fragment = self.averager.parts[self.next_fragment()] if self.fragmented else None
        self.overlapped.start(self.progress.steps, report)
        self._count_round((fragment or self.averager).bytes_per_round)
        if report is not None and self.overlapped.in_flight:
            self.progress.state_bytes += report.nbytes

    def merge_due(self, after: int) -> bool:
        """Whether the overlapped round in flight started `after` steps ago or more."""
        if self.overlapped is None or not self.overlapped.in_flight:
            return False
        return self.progress.steps - self.overlapped.started_at >= after

    def finish_in_flight(self) -> None:
        """Wait for the overlapped round in flight, if any, and apply it."""
        if self.overlapped is None or not self.overlapped.in_flight:
            return
        started_at = self.overlapped.started_at
        finished = self.overlapped.finish()
        if not self.fragmented:  # one fragment's distance is not the divergence's
            self._distances.append(finished.distance)
        self.report.learn(finished.report)
        if started_at == self.progress.steps and not self.fragmented:
            # Nothing moved since its snapshot: every worker now holds its mean.
            self.progress.consensus_step = self.progress.steps

    def round_held(self) -> None:
        """The trigger's round is held (of either kind): count the next period from here."""
        self.trigger.held(self.progress.steps)
        self.report.round_held()

    def view(self) -> AverageView:
        """The workers' average for an evaluation, as a context manager (no round)."""
        return AverageView(self.averager, self.progress)

    def take_divergence(self) -> float:
        """Mean distance of a worker's weights from the average before each round since
        the last call."""
        distances, self._distances = self._distances, []
        return sum(distances) / len(distances) if distances else 0.0

    def abandon(self) -> None:
        """Stop the overlapped rounds' thread, dropping a round in flight."""
        if self.overlapped is not None:
            self.overlapped.abandon()

    def _count_round(self, nbytes: int) -> None:
        self.progress.averaging_rounds += 1
        self.progress.state_bytes += nbytes
