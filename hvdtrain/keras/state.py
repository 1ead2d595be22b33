"""Model state across workers: broadcast it from rank 0, or average it in one allreduce."""

from __future__ import annotations

from dataclasses import dataclass

import keras
import tensorflow as tf

from hvdtrain import comm
from hvdtrain.averaging import outer_step, payload_bytes


def _dtype(variable) -> tf.DType:
    # Keras 3 variables name their dtype as a string, tf.Variables as a tf.DType.
    return tf.as_dtype(variable.dtype)


def _floating(variables):
    return [v for v in variables if _dtype(v).is_floating]


def read(variables) -> list[tf.Tensor]:
    """The current values of Keras (or TensorFlow) variables, as tensors for `comm`."""
    return [tf.convert_to_tensor(v) for v in variables]


def assign(variables, values) -> None:
    for variable, value in zip(variables, values):
        variable.assign(value)


def optimizer_slots(optimizer) -> list:
    """The optimizer's per-weight state (momentum, Adam moments): not its step counter,
    and not its learning-rate variable (Keras 3 keeps a constant rate as a variable)."""
    inner = base_optimizer(optimizer)
    own = {id(inner.iterations), id(getattr(inner, "_learning_rate", None))}
    return [v for v in _floating(inner.variables) if id(v) not in own]


def variable_bytes(variables, fp16: bool = False) -> int:
    """Allreduce payload of these variables; fp16 compression halves float32 and float64 ones."""
    return payload_bytes((list(v.shape), 2 if fp16 and _dtype(v).is_floating else _dtype(v).size)
                         for v in variables)


def reseed_dropout(model: keras.Model, seed: int) -> None:
    """Give the model's random layers (Dropout, augmentation) a new stream from `seed`.

    Keras 3 layers draw their randomness from SeedGenerator variables set when the
    model is built, so workers that built it from one seed would draw identical dropout
    masks; each worker reseeds them with its own seed before training.
    """
    for variable in model.non_trainable_variables:
        if variable.path.endswith("seed_generator_state"):
            variable.assign(tf.constant([seed, 0], _dtype(variable)))


def build_optimizer(model: keras.Model) -> None:
    """Create the optimizer's slots now (Keras makes them lazily at the first step)."""
    if not model.built:
        raise ValueError("the model has no weights yet: give it an input shape (or call it "
                         "once) before training with hvdtrain callbacks")
    model.optimizer.build(model.trainable_variables)


def broadcast_variables(variables, root_rank: int = 0, name: str = "variables") -> None:
    """Every worker's `variables` take `root_rank`'s values."""
    variables = list(variables)
    assign(variables, comm.broadcast(read(variables), root_rank=root_rank, name=name))


def broadcast_model_state(model: keras.Model, root_rank: int = 0) -> None:
    """Make every worker start from rank 0's weights and optimizer state."""
    build_optimizer(model)
    # `weights`, not `variables`: Keras 3 counts the dropout seed generators among the
    # variables, and workers should keep drawing their own masks.
    broadcast_variables(list(model.weights) + list(model.optimizer.variables),
                        root_rank=root_rank, name="model_state")


def base_optimizer(optimizer):
    """The optimizer inside a LossScaleOptimizer (mixed precision), or the optimizer itself."""
    return getattr(optimizer, "inner_optimizer", optimizer)


def current_learning_rate(optimizer) -> tf.Tensor:
    optimizer = base_optimizer(optimizer)
    lr = optimizer._learning_rate  # the schedule itself, not the value cached at the last step
    if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
        # The rate that produced the latest update.
        return tf.cast(lr(tf.maximum(optimizer.iterations - 1, 0)), tf.float32)
    return tf.cast(tf.convert_to_tensor(lr), tf.float32)


@dataclass(frozen=True)
class OuterOptimizer:
    """Update applied to the averaged weights: SlowMo, or Nesterov as in DiLoCo."""

    lr: float = 1.0
    momentum: float = 0.0
    nesterov: bool = False


class ModelStateAverager:
    """Averages chosen groups of a model's state across workers in one grouped allreduce.

    Groups: trainable weights, non-trainable float variables (BatchNorm moving
    statistics), and optimizer slots. With an `OuterOptimizer`, the averaged weights
    go through `hvdtrain.averaging.outer_step` before every worker takes them.
    """

    def __init__(self, model: keras.Model, *, trainable: bool = True,
                 statistics: bool = True, optimizer_state: bool = False,
                 outer: OuterOptimizer | None = None, fp16_allreduce: bool = False):
        self.model = model
        self.weights = list(model.trainable_variables) if trainable else []
        self.statistics = _floating(model.non_trainable_variables) if statistics else []
        self.slots = optimizer_slots(model.optimizer) if optimizer_state else []
        self.outer = outer if trainable else None
        self.fp16_allreduce = fp16_allreduce
        self.rounds = 0
        self.anchor = self.buffers = None
        if self.outer is not None:
            # x0 (the weights after the last round) and the outer momentum buffer u. Plain
            # tf.Variables: hvdtrain's own state, not layers' weights that Keras should save.
            self.anchor = [tf.Variable(tf.convert_to_tensor(w), trainable=False)
                           for w in self.weights]
            self.buffers = [tf.Variable(tf.zeros(w.shape, _dtype(w)), trainable=False)
                            for w in self.weights]
        self._average_fn = tf.function(self._average)

    @property
    def variables(self) -> list[tf.Variable]:
        return self.weights + self.statistics + self.slots

    @property
    def payload_bytes(self) -> int:
        """Bytes one worker hands to allreduce per round."""
        return variable_bytes(self.variables, self.fp16_allreduce)

    @property
    def bytes_allreduced(self) -> int:
        """Payload allreduced so far; nothing is sent with one worker."""
        return self.rounds * self.payload_bytes if comm.size() > 1 else 0

    def retrace(self) -> None:
        """Trace the averaging step again, e.g. after the number of workers changed."""
        self._average_fn = tf.function(self._average)

    def trace(self, apply_outer: bool = True, take_chief: bool = False) -> None:
        """Build the averaging graph now, without running it, so the first round does not
        stall training for the seconds that tracing a large model takes."""
        if self.variables:
            self._average_fn.get_concrete_function(
                tf.TensorSpec([], tf.float32), apply_outer and self.outer is not None, take_chief)

    def reset_anchor(self) -> None:
        """Take the current (consensus) weights as x0; call after a broadcast."""
        if self.anchor is not None:
            for anchor, weight in zip(self.anchor, self.weights):
                anchor.assign(weight)

    def average(self, apply_outer: bool = True, take_chief: bool = False) -> float:
        """One averaging round; returns the mean L2 distance of a worker's weights from the average.

        With `take_chief`, every worker takes rank 0's state instead of the mean (the end
        of a one-worker warm start). It travels as a sum in which the other workers put
        zeros: the same allreduce, bytes and fp16 rounding as an averaging round.
        """
        if not self.variables:
            return 0.0
        # Floor the rate: SlowMo divides by it, and a cosine schedule reaches 0.
        inner_lr = tf.maximum(current_learning_rate(self.model.optimizer), 1e-12)
        distance = self._average_fn(inner_lr, apply_outer and self.outer is not None, take_chief)
        self.rounds += 1
        return float(distance)

    def _average(self, inner_lr, apply_outer: bool, take_chief: bool):
        variables = self.variables
        if take_chief:
            # Rank is read when this is traced; `retrace` runs whenever the workers change.
            share = 1.0 if comm.is_chief() else 0.0
            means = comm.total([t * tf.constant(share, t.dtype) for t in read(variables)],
                               name="model_state_from_chief", fp16=self.fp16_allreduce)
        else:
            means = comm.average(read(variables), name="model_state", fp16=self.fp16_allreduce)
        n = len(self.weights)
        weight_means = means[:n]
        distance = tf.constant(0.0)
        if self.weights:
            squared = [tf.reduce_sum(tf.square(w - m))
                       for w, m in zip(read(self.weights), weight_means)]
            (distance,) = comm.average([tf.sqrt(tf.add_n(squared))], name="weight_divergence")

        if self.anchor is not None:
            if apply_outer:
                targets = []
                for anchor, buf, mean in zip(self.anchor, self.buffers, weight_means):
                    new_anchor, new_buf = outer_step(anchor, mean, buf, inner_lr, self.outer.lr,
                                                     self.outer.momentum, self.outer.nesterov)
                    buf.assign(new_buf)
                    anchor.assign(new_anchor)
                    targets.append(new_anchor)
                weight_means = targets
            else:
                for anchor, mean in zip(self.anchor, weight_means):
                    anchor.assign(mean)
        assign(variables, list(weight_means) + means[n:])
        return distance
