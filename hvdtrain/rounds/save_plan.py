"""When a run saves or commits its model, so its workers must agree then.

One plan, asked by both sides: the callbacks that save (`Checkpointer`, `ElasticCommit`
in `hvdtrain.training.callbacks`) ask when to save, and `LocalSGD` asks where the
workers must hold one model: a blocking round there (`hvdtrain.rounds.policy`), or in
async mode the next round blocking (`hvdtrain.rounds.triggers.ConsensusWanted`).

Pure Python: no TensorFlow, no Keras.
"""

from __future__ import annotations

from dataclasses import dataclass


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

    def saves_within(self, done: range) -> bool:
        """Whether a save every k steps falls due after one of the steps `done`."""
        return any(step % k == 0 for step in done for k in self.step_intervals)

    def commits_within(self, done: range) -> bool:
        """Whether an elastic commit falls due after one of the steps `done`."""
        return bool(self.commit_every) and any(step % self.commit_every == 0 for step in done)
