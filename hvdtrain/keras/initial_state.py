"""Rank 0's state handed to every worker: once per set of workers, not once per `fit`.

A trainer may call `fit` many times in one run (hvdtrain makes one call per epoch
phase, and one per epoch with timed rounds). A broadcast at every call would replace
the other workers' own optimizer state (momentum, which local SGD does not average)
with rank 0's in the middle of training, and send the whole model each time. The
workers need rank 0's state only when they start together: at the first `fit` of a
run, and after an elastic reset brought in another set of workers.
"""

from __future__ import annotations

import keras

from hvdtrain import comm
from hvdtrain.keras.state import broadcast_model_state, broadcast_variables, variable_bytes


class InitialState:
    """Broadcasts a model's state from `root_rank` unless this set of workers already has it."""

    def __init__(self, root_rank: int = 0):
        self.root_rank = root_rank
        self._given: tuple[int, int] | None = None  # (model, world) it was last given to

    def due(self, model: keras.Model) -> bool:
        return self._given != (id(model), comm.world_id())

    def give(self, model: keras.Model, extra=(), name: str = "extra_state") -> int:
        """Broadcast the model's weights and optimizer state (and the `extra` variables)
        if due; returns the bytes one worker handed to the broadcast (0 when not due, or
        alone)."""
        if not self.due(model):
            return 0
        extra = list(extra)
        broadcast_model_state(model, self.root_rank)
        if extra:
            broadcast_variables(extra, root_rank=self.root_rank, name=name)
        self._given = (id(model), comm.world_id())
        if comm.size() == 1:
            return 0
        return variable_bytes(list(model.weights) + list(model.optimizer.variables) + extra)
