"""When a run saves or commits its model, so its workers must agree then.

One plan, asked by both sides: the callbacks that save (`Checkpointer`, `ElasticCommit`
in `hvdtrain.training.callbacks`) ask when to save, and `LocalSGD` asks where the
workers must hold one model: a blocking round there (`hvdtrain.rounds.policy`), or the
period's next round whole and blocking (`hvdtrain.rounds.triggers.ConsensusWanted`).
Both sides keep what waits in a `PendingSave`, so they agree on when a save is pending.

Pure Python: no TensorFlow, no Keras.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence


@dataclass(frozen=True)
class SavePlan:
    """A checkpoint every `checkpoint_every` steps or epochs (`checkpoint_unit`; 0: none),
    and with `commit_every` (an elastic job) a commit every that many steps and at every
    epoch end."""

    checkpoint_unit: str = "epochs"
    checkpoint_every: int = 0
    commit_every: int | None = None

    @property
    def checkpoint_steps(self) -> int:
        """Steps between two step checkpoints; 0: checkpoints, if any, come at epoch ends."""
        return self.checkpoint_every if self.checkpoint_unit == "steps" else 0

    def checkpoints_at_epoch_end(self, epochs_done: int) -> bool:
        """Whether the end of the `epochs_done`-th epoch (1-based) is checkpointed."""
        every = self.checkpoint_every if self.checkpoint_unit == "epochs" else 0
        return bool(every) and epochs_done % every == 0

    def saves_at_epoch_end(self, epochs_done: int) -> bool:
        """Whether anything saves or commits the model at that epoch's end."""
        return self.commit_every is not None or self.checkpoints_at_epoch_end(epochs_done)

    @property
    def step_intervals(self) -> tuple[int, ...]:
        """Every how many steps something saves: step checkpoints, elastic commits."""
        return tuple(k for k in (self.checkpoint_steps, self.commit_every or 0) if k)

    def commits_within(self, done: range) -> bool:
        """Whether an elastic commit falls due after one of the steps `done`."""
        return bool(self.commit_every) and any(step % self.commit_every == 0 for step in done)

    def pending_checkpoint(self) -> "PendingSave":
        """What the checkpoints wait for: every `checkpoint_steps`, or at epoch ends."""
        return PendingSave((self.checkpoint_steps,), self.checkpoints_at_epoch_end)

    def pending_commit(self) -> "PendingSave":
        """What the elastic commits wait for between epoch ends (those hold a round)."""
        return PendingSave((self.commit_every or 0,))

    def pending_any(self) -> "PendingSave":
        """What any save waits for: where the workers must come to agree."""
        return PendingSave(self.step_intervals, self.saves_at_epoch_end)


def _never(epochs_done: int) -> bool:
    return False


class PendingSave:
    """A save that fell due and waits for the workers to agree: after a multiple of one of
    the step `intervals`, or at an epoch end that `at_epoch_end` names (1-based).

    A save that waits asks for a whole round, and only an elastic reset cancels it. It
    outlives the `fit` it fell due in: without epoch rounds a fit ends without a round
    (the trainer starts one per run of equal-length epochs), and the save is written in
    the next. A new set of workers (`begin_fit` with another `comm.world_id()`) voids it:
    the survivors rolled back past its step to the last commit, which was a consensus and
    so wrote everything due before it, and a worker that joined never saw it fall due.
    Every worker's LocalSGD and the callbacks that save each keep one, fed alike.
    """

    def __init__(self, intervals: Sequence[int] = (),
                 at_epoch_end: Callable[[int], bool] = _never):
        self.intervals = tuple(k for k in intervals if k)
        self.at_epoch_end = at_epoch_end
        self.due = False
        self._world: int | None = None

    def after_steps(self, done: range) -> None:
        """Take in the steps a batch completed."""
        self.due = self.due or any(step % k == 0 for step in done for k in self.intervals)

    def after_epoch(self, epochs_done: int) -> None:
        """Take in the end of the `epochs_done`-th epoch."""
        self.due = self.due or self.at_epoch_end(epochs_done)

    def written(self) -> None:
        """Everything due is saved (or, for LocalSGD's, the workers agree where it is)."""
        self.due = False

    def begin_fit(self, world: int) -> None:
        """A fit starts among the set of workers `world` (`comm.world_id()`)."""
        if world != self._world:
            self.due = False
        self._world = world
