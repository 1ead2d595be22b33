"""How `LocalSGD` holds a round that falls due, one class per kind, chosen once.

- `Blocking`: every worker waits for the round's mean (every `n_sync` steps, or
  at the adaptive period's rounds); with fragments, of one fragment, except the first
  round after a save fell due where the workers did not agree (a checkpoint of steps or
  of an epoch, an elastic commit: `ConsensusWanted`), which averages them all.
- `Overlapped`: a round's allreduce runs behind the next period's steps
  (CoCoD-SGD); the first round after a save fell due blocks instead.
- `Timed`: a round every T seconds of this worker's clock; overlapped when the mode
  is, except where the epoch may end at it, since only a blocking round's count can end it.

Each kind runs its rounds through the worker's `RoundRunner`. What a round carries
besides the state is the report's business (`hvdtrain.keras.round_reports`), not the kind's.
"""

from __future__ import annotations

from typing import Callable

from hvdtrain.keras.round_runner import RoundRunner
from hvdtrain.keras.timed_epochs import TimedEpochs
from hvdtrain.rounds.triggers import ConsensusWanted


class Blocking:
    def __init__(self, runner: RoundRunner, consensus: ConsensusWanted):
        self.runner = runner
        self.consensus = consensus

    def hold(self) -> None:
        # With fragments, the round a save waits for averages every fragment: a fragment's
        # round would leave the workers apart, and a whole round after it repeat its bytes.
        self.runner.blocking_round(by_trigger=True, whole=self.consensus.take())
        self.runner.round_held()


class Overlapped:
    def __init__(self, runner: RoundRunner, consensus: ConsensusWanted):
        self.runner = runner
        self.consensus = consensus

    def hold(self) -> None:
        self.runner.finish_in_flight()
        if self.consensus.take():
            self.runner.blocking_round(by_trigger=True)
        else:
            self.runner.start_overlapped()
        self.runner.round_held()


class Timed:
    """`stop_epoch` ends the fit's epoch on this worker, at the round that finds it done."""

    def __init__(self, runner: RoundRunner, timed: TimedEpochs, stop_epoch: Callable[[], None],
                 overlap: bool):
        self.runner = runner
        self.timed = timed
        self.stop_epoch = stop_epoch
        self.overlap = overlap

    def hold(self) -> None:
        runner = self.runner
        runner.finish_in_flight()
        if self.overlap and not self.timed.round_may_end_epoch():
            runner.start_overlapped()
        else:
            runner.blocking_round(by_trigger=True)
            if self.timed.count_reached_end():
                self.stop_epoch()
        runner.round_held()
