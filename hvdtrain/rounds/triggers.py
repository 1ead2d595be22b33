"""When local SGD holds a round: one small object per policy, asked after every batch.

`hvdtrain.keras.local_sgd.LocalSGD` hands each trigger the steps the last batch
completed and asks whether a round is due. Every answer depends only on what all
workers share (their step counts, equal while rounds come every n steps; what the
rounds' summed reports told every worker alike) or on this worker's own clock (rounds
every T seconds, where the k-th round of each worker meets the k-th of the others), so
all workers hold the same rounds in the same order. No period is derived by each worker
from its own floats: nearly equal values can land on either side of a rule's rounding.

Pure Python: no TensorFlow, no Keras, so each policy is tested on its own.
"""

from __future__ import annotations

import math
from typing import Sequence

from hvdtrain.rounds.averaging import (adacomm_period, is_local_sync_step, is_warm_start_end,
                                       link_period, quadratic_period)
from hvdtrain.progress import TrainingProgress
from hvdtrain.rounds.save_plan import SavePlan
from hvdtrain.rounds.timed import RoundTimer


class WarmStartEnd:
    """The step after which the warm start hands over to local steps (none without one)."""

    def __init__(self, steps: int):
        self.steps = steps

    def due(self, done: range) -> bool:
        return any(is_warm_start_end(step, self.steps) for step in done)

    def warming(self, step: int) -> bool:
        """Whether completed step `step` still lies within the warm start."""
        return step < self.steps


class EveryNSteps:
    """A round every `n_sync` local steps after the warm start (Paine's n_sync)."""

    def __init__(self, n_sync: int, warm_start_steps: int = 0):
        self.n_sync = n_sync
        self.warm_start_steps = warm_start_steps

    def due(self, done: range) -> bool:
        return any(is_local_sync_step(step, self.n_sync, self.warm_start_steps) for step in done)

    def restart(self) -> None:
        """Nothing to restart: the step count is the clock."""

    def held(self, step: int) -> None:
        """Nothing to note: rounds fall on multiples of the period."""


class EveryTSeconds:
    """A round once T seconds of this worker's clock have passed since its last one, while
    the workers are out of step (in step, within the warm start, steps decide)."""

    def __init__(self, timer: RoundTimer, progress: TrainingProgress):
        self.timer = timer
        self.progress = progress

    def due(self, done: range) -> bool:
        return not self.progress.workers_in_step and self.timer.due()

    def restart(self) -> None:
        self.timer.restart()

    def held(self, step: int) -> None:
        """A round started: the next falls due T seconds from now."""
        self.timer.restart()


class ConsensusWanted:
    """Whether the period's next round must leave every worker with the same state: a save
    of the run's `SavePlan` (a step or epoch checkpoint, an elastic commit) fell due where
    they did not agree, and waits for them to (`PendingSave`, as the callbacks that save
    keep it).

    A save that waits asks for a whole round: a fragment's round (`round_fragments`)
    leaves the other fragments apart and an overlapped round never gives consensus, so
    the round must average every fragment and block, or the save would wait for the run's
    end. Every worker feeds its own alike, from the steps and epochs all share, so all make
    the same round whole. The wait outlives a `fit`; only a new set of workers cancels it.
    """

    def __init__(self, saves: SavePlan | None = None):
        self._waiting = (saves or SavePlan()).pending_any()

    @property
    def pending(self) -> bool:
        return self._waiting.due

    def note(self, done: range) -> None:
        """Take in the steps a batch completed, before the batch's round."""
        self._waiting.after_steps(done)

    def note_agreement(self, agree: bool) -> None:
        """After a batch's rounds: where the workers agree, the savers write what was due
        (an epoch's last step at the epoch's end, where they still agree)."""
        if agree:
            self._waiting.written()

    def note_epoch_end(self, epochs_done: int, agree: bool) -> None:
        """At the end of the `epochs_done`-th epoch, after its round if it held one: an
        epoch save where the workers still differ waits for them."""
        self.note_agreement(agree)
        if not agree:
            self._waiting.after_epoch(epochs_done)

    def take(self) -> bool:
        """Whether the round being held now must be whole; it answers for the wait it ends."""
        wanted = self._waiting.due
        self._waiting.written()
        return wanted

    def begin_fit(self, world: int) -> None:
        """A fit starts among the set of workers `world` (`comm.world_id()`)."""
        self._waiting.begin_fit(world)


class PeriodSetAtRounds:
    """A round every `n_sync` local steps, counted from the last of its rounds: the base
    of the periods a rule sets anew at each round."""

    def __init__(self, n_sync: int, warm_start_steps: int = 0):
        self.n_sync = n_sync
        self.next_round = warm_start_steps + n_sync

    def due(self, done: range) -> bool:
        return done.stop - 1 >= self.next_round

    def held(self, step: int) -> None:
        """A round of this trigger ran after completed step `step`: count the next period
        from there."""
        self.next_round = step + self.n_sync

    def restart(self) -> None:
        """Nothing to restart: the step count is the clock."""


class AdaptivePeriod(PeriodSetAtRounds):
    """A round every `n_sync` local steps, the period set anew at each round from the
    workers' averaged training loss by AdaComm's rule (`averaging.adacomm_period`).

    The first loss learnt (the mean over the first period) is F₀. Every worker learns
    the same mean at the same round, so all hold the same period and the same rounds.
    """

    def __init__(self, initial_period: int, minimum: int = 1, warm_start_steps: int = 0):
        super().__init__(initial_period, warm_start_steps)
        self.initial_period = initial_period
        self.minimum = minimum
        self.initial_loss: float | None = None

    def learn(self, mean_loss: float) -> None:
        """The workers' mean training loss over the last period: set the period from it."""
        if self.initial_loss is None:
            self.initial_loss = mean_loss
        self.n_sync = adacomm_period(mean_loss, self.initial_loss, self.initial_period,
                                     self.minimum)

    def saved(self) -> tuple[float, int, int]:
        """What every worker must share to hold the same rounds: (F₀, or NaN while unknown;
        the period in force; the step of the next round). A checkpoint and an elastic commit
        keep it, so a resumed run and a worker that joins go on with the job's schedule
        instead of starting again from τ₀."""
        loss = math.nan if self.initial_loss is None else self.initial_loss
        return loss, self.n_sync, self.next_round

    def restore(self, saved: Sequence[float]) -> None:
        loss, n_sync, next_round = saved
        self.initial_loss = None if math.isnan(loss) else float(loss)
        self.n_sync, self.next_round = int(n_sync), int(next_round)


class RateFollowingPeriod(PeriodSetAtRounds):
    """A round every `n_sync` local steps, the period set anew at each round from the
    job's learning rate by the quadratic synchronization rule
    (`averaging.quadratic_period`).

    The rate is learnt, never read here: workers may train at different rates (hosts of
    unequal size each scale their own), and floats that are only nearly equal can fall
    on either side of the rule's floor, so a period derived on each worker from its own
    rate could differ and the rounds part. The workers' rates travel with the rounds
    instead (`hvdtrain.keras.rate_rounds`), and every worker learns the same mean. The
    peak is the highest rate learnt so far, so a warmup's rising rate keeps the base
    period.
    """

    def __init__(self, base: int, growth: float, warm_start_steps: int = 0):
        super().__init__(base, warm_start_steps)
        self.base = base
        self.growth = growth
        self.peak = 0.0

    def learn(self, rate: float) -> None:
        """The job's learning rate at the last round (the workers' mean): set the period
        from it."""
        self.peak = max(self.peak, rate)
        self.n_sync = quadratic_period(rate, self.peak, self.base, self.growth)

    def saved(self) -> tuple[float, int, int]:
        """What every worker must share to hold the same rounds: (the peak so far, the
        period in force, the step of the next round), kept as the adaptive period's is."""
        return self.peak, self.n_sync, self.next_round

    def restore(self, saved: Sequence[float]) -> None:
        peak, n_sync, next_round = saved
        self.peak, self.n_sync, self.next_round = float(peak), int(n_sync), int(next_round)


class LinkFollowingPeriod(PeriodSetAtRounds):
    """A round every `n_sync` local steps, the period set anew at each round so that the
    rounds take at most `share` of a worker's time (`averaging.link_period`), from the
    workers' summed timings since the last round: as a link slows (or a host's traffic
    grows), rounds come less often, and more often as it frees up.

    Every worker learns the same sums at the same round, so all hold the same period and
    the same rounds, though each timed its own steps and rounds.
    """

    def __init__(self, share: float, maximum: int, initial_period: int,
                 warm_start_steps: int = 0):
        super().__init__(initial_period, warm_start_steps)
        self.share = share
        self.maximum = maximum

    def learn(self, round_seconds: float, rounds: float, step_seconds: float,
              steps: float) -> None:
        """The workers' summed seconds in rounds and in steps since the last report, and the
        rounds and steps those covered (summed too): set the period from their means. A
        report that covers no round (the first) or no step keeps the period."""
        if rounds > 0 and steps > 0:
            self.n_sync = link_period(round_seconds / rounds, step_seconds / steps,
                                      self.share, self.maximum)

    def saved(self) -> tuple[int, int]:
        """What every worker must share to hold the same rounds (the period in force, the
        step of the next round), kept as the adaptive period's is."""
        return self.n_sync, self.next_round

    def restore(self, saved: Sequence[float]) -> None:
        n_sync, next_round = saved
        self.n_sync, self.next_round = int(n_sync), int(next_round)


class LossSinceRound:
    """This worker's training loss summed over its steps since the last round, from the
    running means Keras logs (the mean over the epoch's steps so far, reset each epoch)."""

    def __init__(self):
        self.total = 0.0
        self.steps = 0
        self._epoch_total = 0.0  # the epoch's sum up to the last batch seen
        self._epoch_steps = 0

    def begin_epoch(self) -> None:
        self._epoch_total, self._epoch_steps = 0.0, 0

    def observe(self, last_batch: int, running_mean: float) -> None:
        """After the batch (or execution) ending at 0-based index `last_batch` of the epoch."""
        epoch_total = (last_batch + 1) * running_mean
        self.total += epoch_total - self._epoch_total
        self.steps += last_batch + 1 - self._epoch_steps
        self._epoch_total, self._epoch_steps = epoch_total, last_batch + 1

    def take(self) -> tuple[float, int]:
        """(sum, steps) since the last take, which starts the next count."""
        taken = (self.total, self.steps)
        self.total, self.steps = 0.0, 0
        return taken
