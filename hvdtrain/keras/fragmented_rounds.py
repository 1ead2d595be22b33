"""Rounds that average one fragment of the state in turn (`LocalSGD(round_fragments=F)`).

The averaged variables are cut into F fragments of about equal bytes, whole layers or a
layer's columns (`hvdtrain.rounds.fragments`; a cut variable's part is a `ColumnSlice`); each
fragment is a `ModelStateAverager` of its own, so its
reference and its compressed residual are its own. A round the period holds averages
fragment k mod F, k the run's round count (`TrainingProgress.averaging_rounds`, which every
worker holds alike); a round that must leave the workers agreeing (a save, an elastic
commit, an evaluation, an epoch's or the run's end, the warm start's hand-over) averages
every fragment, one after another: the same bytes as one unfragmented round.
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf

from hvdtrain.rounds.fragments import fragments_of
from hvdtrain.keras.overlap import FinishedRound, OverlappedRounds
from hvdtrain.keras.state import ModelStateAverager, variable_bytes


def layer_key(variable, weight_layers: dict[str, str]) -> str:
    """The layer a variable belongs to: a weight's or statistic's own (its path less its
    name); an optimizer slot's is its weight's, which Keras 3 names it after
    ("sgd/dense_kernel_momentum" for "dense/kernel"), the longest such name that fits."""
    path = str(variable.path)
    layer = path.rsplit("/", 1)[0]
    if path in weight_layers:
        return weight_layers[path]
    slot = path.split("/", 1)[-1]
    owners = [w for w in weight_layers if slot.startswith(w.replace("/", "_") + "_")]
    return weight_layers[max(owners, key=len)] if owners else layer


class ColumnSlice:
    """Columns [start, stop) of a variable's last axis, read (`tf.convert_to_tensor`) and
    assigned as a variable of their own: the part of a layer one fragment averages."""

    def __init__(self, variable, start: int, stop: int):
        self.variable, self.start, self.stop = variable, start, stop
        self.shape = tf.TensorShape([*variable.shape[:-1], stop - start])
        self.dtype = variable.dtype
        self.path = variable.path  # slots are known by their name's ending

    def __tf_tensor__(self, dtype=None, name=None):
        return tf.convert_to_tensor(self.variable, dtype=dtype)[..., self.start:self.stop]

    def assign(self, value) -> None:
        # Keras's variable holds a tf.Variable, which takes a strided slice's assignment.
        self.variable.value[..., self.start:self.stop].assign(value)


def _cuttable_columns(variable, statistics: set[int]) -> int:
    """The columns a fragment may cut `variable` at: its last axis, unless it is a
    statistic (BatchNorm's variance is pooled about its mean, whole) or has none."""
    if id(variable) in statistics or len(variable.shape) == 0:
        return 0
    return int(variable.shape[-1])


class FragmentedAverager:
    """The state of `ModelStateAverager(model, **options)` in `count` fragments."""

    def __init__(self, model: keras.Model, count: int, **options):
        # Only to list the averaged variables: uncompressed, so it allocates no residual
        # or reference of the whole model that the fragments then allocate again.
        averager = ModelStateAverager(model, **{**options, "compression": "none"})
        whole = averager.variables
        weight_layers = {str(w.path): str(w.path).rsplit("/", 1)[0] for w in model.weights}
        statistics = {id(v) for v in averager.statistics}
        groups = fragments_of([layer_key(v, weight_layers) for v in whole],
                              [variable_bytes([v]) for v in whole], count,
                              [_cuttable_columns(v, statistics) for v in whole])
        self.parts = [ModelStateAverager(model, only=[_piece(whole, p) for p in group], **options)
                      for group in groups]
        self.outer = None  # LocalSGD refuses an outer step with fragments

    @property
    def count(self) -> int:
        return len(self.parts)

    @property
    def variables(self) -> list:
        return [v for part in self.parts for v in part.variables]

    @property
    def outer_state(self) -> list:
        return []

    @property
    def host_shards(self) -> int:
        """In how many shards each fragment's round is cut between a host's workers."""
        return self.parts[0].host_shards

    @property
    def payload_bytes(self) -> int:
        """Bytes one worker hands to a round of every fragment."""
        return sum(part.payload_bytes for part in self.parts)

    @property
    def bytes_per_round(self) -> int:
        return sum(part.bytes_per_round for part in self.parts)

    @property
    def largest_part(self) -> ModelStateAverager:
        """The fragment whose round hands over the most bytes: a period's peak burst."""
        return max(self.parts, key=lambda part: part.payload_bytes)

    @property
    def largest_burst(self) -> int:
        """Bytes of the largest fragment's round: the peak a period's round hands over."""
        return self.largest_part.payload_bytes

    def trace(self, apply_outer: bool = True, take_chief: bool = False) -> None:
        for part in self.parts:
            part.trace(apply_outer, take_chief)

    def reset_anchor(self, new_world: bool = True) -> None:
        for part in self.parts:
            part.reset_anchor(new_world)

    def average(self, apply_outer: bool = True, take_chief: bool = False) -> float:
        """Every fragment's round, in order; the L2 distance of this worker's weights from
        the average, over the fragments together."""
        distances = [part.average(apply_outer, take_chief) for part in self.parts]
        return math.sqrt(sum(d * d for d in distances))

    def show_mean(self) -> list:
        return [value for part in self.parts for value in part.show_mean()]


def _piece(variables: list, piece: tuple):
    """A fragment's piece (`hvdtrain.rounds.fragments.Piece`) as a variable or a ColumnSlice."""
    variable = variables[piece[0]]
    return variable if len(piece) == 1 else ColumnSlice(variable, piece[1], piece[2])


class FragmentedOverlap:
    """One overlapped round in flight at most, of the fragment `fragment()` names when it
    starts (`OverlappedRounds` of each fragment's averager)."""

    def __init__(self, averager: FragmentedAverager, fragment, report_length=None):
        self.rounds = [OverlappedRounds(part, report_length) for part in averager.parts]
        self.fragment = fragment
        self.current: OverlappedRounds | None = None

    @property
    def in_flight(self) -> bool:
        return self.current is not None and self.current.in_flight

    @property
    def started_at(self) -> int | None:
        return self.current.started_at if self.current is not None else None

    def trace(self) -> None:
        for rounds in self.rounds:
            rounds.trace()

    def start(self, step: int, report=None) -> None:
        self.current = self.rounds[self.fragment()]
        self.current.start(step, report)

    def finish(self) -> FinishedRound | None:
        return self.current.finish() if self.current is not None else None

    def abandon(self) -> None:
        for rounds in self.rounds:
            rounds.abandon()
