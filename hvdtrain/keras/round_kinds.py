"""How `LocalSGD` holds a round that falls due, one class per kind, chosen once.

- `Blocking`: every worker waits for the round's mean (every `n_sync` steps, or
  at the adaptive period's rounds).
- `Overlapped`: a round's allreduce runs behind the next period's steps
  (CoCoD-SGD); the first round after a step that wants consensus (a step checkpoint,
  an elastic commit) blocks instead.
- `Timed`: a round every T seconds of this worker's clock; overlapped when the mode
  is, except where the epoch may end at it, since only a blocking round's count can end it.

What a round carries besides the state is the report's business
(`hvdtrain.keras.round_reports`), not the kind's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hvdtrain.keras.local_sgd import LocalSGD


class Blocking:
    def __init__(self, sgd: "LocalSGD"):
        self.sgd = sgd

    def hold(self) -> None:
        self.sgd.blocking_round(by_trigger=True)
        self.sgd.round_held()


class Overlapped:
    def __init__(self, sgd: "LocalSGD"):
        self.sgd = sgd

    def hold(self) -> None:
        self.sgd.finish_in_flight()
        if self.sgd.consensus.take():
            self.sgd.blocking_round(by_trigger=True)
        else:
            self.sgd.start_overlapped()
        self.sgd.round_held()


class Timed:
    def __init__(self, sgd: "LocalSGD", overlap: bool):
        self.sgd = sgd
        self.overlap = overlap

    def hold(self) -> None:
        sgd = self.sgd
        sgd.finish_in_flight()
        if self.overlap and not sgd.timed.round_may_end_epoch():
            sgd.start_overlapped()
        else:
            sgd.blocking_round(by_trigger=True)
            if sgd.timed.count_reached_end():
                sgd.stop_epoch()
        sgd.round_held()
