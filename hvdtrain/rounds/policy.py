"""What local SGD does at each event of a run besides its period's rounds: a blocking
round, a view of the workers' average, or nothing.

The period's own rounds (every n_sync steps, every T seconds, the warm start's end) are
`hvdtrain.rounds.triggers`' business. This policy answers the other events, alike on every
worker, from what they all share:

- an evaluation: it needs the workers' one model. A round (`epoch_rounds`, the default, and
  always within a warm start), or with `epoch_rounds=False` a view: every worker holds the
  average while the evaluation runs and its own state again after (no round: no outer step,
  no restart of anything), so training goes on as if the evaluation had not happened.
- a save: always at a consensus, so what is saved is the model training goes on from, and
  a resumed run, or the workers an elastic job rolls back, are the run that went on (less,
  for compressed rounds, what the last round's encoding still owed: error feedback is not
  saved). A checkpoint, of steps or of an epoch, waits for the next round (with
  `epoch_rounds` an epoch end's round bounds the wait; without, it waits up to a period,
  so that rounds stay every n_sync steps as asked). A save that waits asks for a whole
  round: the period's next round averages every fragment, and blocks in overlapped mode
  (`triggers.ConsensusWanted`). The wait outlives the end of a `fit`; only an elastic
  reset cancels it. An elastic commit holds a round at its step and at every epoch end:
  it is where the workers roll back to.
- an epoch's end: a round with `epoch_rounds`, or where an elastic job commits, or where
  the run ends.
- the end of a `fit`: a round where the run ends. A trainer that runs one `fit` per run of
  equal-length epochs gives the run's epochs (`run_epochs`); without them every `fit` ends
  the run, as a user's own single `fit` does.

Workers that already agree (right after a round) need nothing, whatever the event.
Pure Python: tested on its own.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from hvdtrain.rounds.save_plan import SavePlan


class Act(enum.Enum):
    NOTHING = "nothing"
    VIEW = "view"    # every worker holds the average for a while, then its own state
    ROUND = "round"  # a blocking round: every worker goes on from the consensus


@dataclass(frozen=True)
class RoundPolicy:
    epoch_rounds: bool = True
    saves: SavePlan = field(default_factory=SavePlan)
    run_epochs: int | None = None  # the run ends after this many epochs; None: each fit's end

    def at_evaluation(self, agree: bool, warming: bool) -> Act:
        if agree:
            return Act.NOTHING
        return Act.ROUND if self.epoch_rounds or warming else Act.VIEW

    def at_step_end(self, agree: bool, done: range) -> Act:
        """After the steps `done` (and the period's round, if one fell due)."""
        wanted = not self.epoch_rounds and self.saves.commits_within(done)
        return Act.ROUND if wanted and not agree else Act.NOTHING

    def at_epoch_end(self, agree: bool, epochs_done: int, fit_epochs: int | None) -> Act:
        """At the end of the `epochs_done`-th epoch (1-based) of a fit of `fit_epochs`."""
        wanted = (self.epoch_rounds or self.saves.commit_every is not None
                  or epochs_done == (self.run_epochs or fit_epochs))
        return Act.ROUND if wanted and not agree else Act.NOTHING

    def at_fit_end(self, agree: bool, epochs_done: int) -> Act:
        """At the end of a `fit` whose last completed epoch was `epochs_done`."""
        ends_run = self.run_epochs is None or epochs_done >= self.run_epochs
        return Act.ROUND if (self.epoch_rounds or ends_run) and not agree else Act.NOTHING
