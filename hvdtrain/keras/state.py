"""Model state across workers: broadcast it from rank 0, or average it in one allreduce."""

from __future__ import annotations

import math
from dataclasses import dataclass

import keras
import tensorflow as tf

from hvdtrain import comm
from hvdtrain.rounds.averaging import outer_step, payload_bytes, pooled_variance, second_moment
from hvdtrain.errors import ArgumentError
from hvdtrain.keras.compressed_rounds import CompressedExchange
from hvdtrain.keras.host_shards import HostShards
from hvdtrain.rounds.payload import WHOLE_STATISTICS


def _dtype(variable) -> tf.DType:
    # Keras 3 variables name their dtype as a string, tf.Variables as a tf.DType.
    return tf.as_dtype(variable.dtype)


def _floating(variables):
    return [v for v in variables if _dtype(v).is_floating]


def _copies(variables) -> list[tf.Variable]:
    # Plain tf.Variables: hvdtrain's own state, not layers' weights that Keras should save.
    return [tf.Variable(tf.convert_to_tensor(v), trainable=False) for v in variables]


def _layers_within(layer):
    """The layer and every layer of the models nested in it, through the public `layers`."""
    yield layer
    for inner in getattr(layer, "layers", ()):
        yield from _layers_within(inner)


def batch_norm_statistics(model: keras.Model) -> list[tuple]:
    """(moving_mean, moving_variance) of each BatchNormalization layer, nested models included.

    One held by a custom layer that is not a Model is missed (Keras 3 lists a plain layer's
    sublayers only privately); its variance is then averaged like any other statistic.
    """
    seen, pairs = set(), []
    for layer in _layers_within(model):
        if isinstance(layer, keras.layers.BatchNormalization) and id(layer) not in seen:
            seen.add(id(layer))
            pairs.append((layer.moving_mean, layer.moving_variance))
    return pairs


# Keras 3 names an optimizer's slot after the weight it belongs to and its kind. These
# kinds hold running squares or norms, of which the optimizer takes roots or divides by:
# Adam's, Nadam's and RMSprop's velocity (AMSGrad's velocity_hat), Adagrad's and Ftrl's
# accumulator, Adadelta's accumulated squares, Adamax's norm.
NON_NEGATIVE_SLOTS = ("velocity", "velocity_hat", "accumulator", "accumulated_grad",
                      "accumulated_delta_var", "norm")


def _is_running_square(variable) -> bool:
    name = str(getattr(variable, "path", None) or getattr(variable, "name", ""))
    return name.rsplit("/", 1)[-1].split(":")[0].endswith(NON_NEGATIVE_SLOTS)


def read(variables) -> list[tf.Tensor]:
    """The current values of Keras (or TensorFlow) variables, as tensors for `comm`."""
    return [tf.convert_to_tensor(v) for v in variables]


def weight_distance(weights, means) -> tf.Tensor:
    """L2 distance of one worker's weights (all tensors together) from their mean."""
    squared = [tf.reduce_sum(tf.square(w - m)) for w, m in zip(weights, means)]
    return tf.sqrt(tf.add_n(squared)) if squared else tf.constant(0.0)


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
    """Allreduce payload of these variables; `fp16` (Horovod's float16 compression, which
    gradients take with --fp16-allreduce) halves float32 and float64 ones."""
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
        raise ArgumentError("the model has no weights yet: give it an input shape (or call it "
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


def optimizer_step(optimizer) -> int:
    """The optimizer's own step count, which its learning-rate schedule reads."""
    return int(base_optimizer(optimizer).iterations.numpy())


def set_optimizer_step(optimizer, step: int) -> None:
    """Make the optimizer's step count `step`, so its schedule follows the run's count
    (`TrainingProgress.steps`) rather than the updates it applied: a LossScaleOptimizer
    skips the update of a step whose gradients overflowed and does not count it."""
    base_optimizer(optimizer).iterations.assign(step)


def current_learning_rate(optimizer) -> tf.Tensor:
    """The rate that produced the optimizer's latest update."""
    return learning_rate_at(optimizer, base_optimizer(optimizer).iterations)


def learning_rate_at(optimizer, steps) -> tf.Tensor:
    """The rate of the optimizer's schedule for the `steps`-th step (counted from 1)."""
    lr = base_optimizer(optimizer)._learning_rate  # the schedule, not the value cached
    if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
        return tf.cast(lr(tf.maximum(tf.cast(steps, tf.int64) - 1, 0)), tf.float32)
    return tf.cast(tf.convert_to_tensor(lr), tf.float32)


@dataclass(frozen=True)
class OuterOptimizer:
    """Update applied to the averaged weights: SlowMo, or Nesterov as in DiLoCo.

    A Keras optimizer may stand in its place (`ModelStateAverager(outer=...)`): it takes a
    step on the averaged pseudo-gradient x0 − x̄, as torchft's DiLoCo takes torch.optim.SGD's.
    `keras.optimizers.SGD(lr, momentum, nesterov)` is this update while the inner rate stays
    the same; when it changes, SlowMo scales its past momentum by the new rate over the old
    and Keras does not (tests/test_outer_step_as_keras_sgd.py).
    """

    lr: float = 1.0
    momentum: float = 0.0
    nesterov: bool = False


class ModelStateAverager:
    """Averages chosen groups of a model's state across workers in one grouped allreduce.

    Groups: trainable weights, non-trainable float variables (BatchNorm moving
    statistics), and optimizer slots. BatchNorm moving variances are pooled (they take in
    the spread of the workers' means) in the same allreduce. With an `OuterOptimizer`, the
    averaged weights go through `hvdtrain.rounds.averaging.outer_step` before every worker takes
    them. With `compression` "fp16", "int8" or "int4", only the change since the last round
    travels, compressed, with error feedback (`hvdtrain.keras.compressed_rounds`), instead
    of through allreduce.
    """

    def __init__(self, model: keras.Model, *, trainable: bool = True,
                 statistics: bool = True, optimizer_state: bool = False,
                 outer: OuterOptimizer | None = None, compression: str = "none", only=None,
                 across_hosts: bool = False, rescale: bool = False):
        """`only`: average just these of the chosen variables, or column slices of them
        (a round's fragment, `hvdtrain.keras.fragmented_rounds`), with a reference and
        residual of their own. `across_hosts`: a host's workers hold the same state
        (hierarchical local SGD), so a round is cut in host shards when the hosts are of
        one size (`hvdtrain.keras.host_shards`). `rescale`: a round stretches each weight's
        mean step to the workers' mean step length (`_stretch`)."""
        self.model = model
        self.across_hosts = across_hosts
        kept: dict[int, list] | None = None
        if only is not None:
            kept = {}
            for item in only:  # a ColumnSlice stands in for its variable
                kept.setdefault(id(getattr(item, "variable", item)), []).append(item)

        def chosen(variables) -> list:
            if kept is None:
                return list(variables)
            return [item for v in variables for item in kept.get(id(v), ())]

        self.weights = chosen(model.trainable_variables) if trainable else []
        self.statistics = chosen(_floating(model.non_trainable_variables)) if statistics else []
        self.slots = chosen(optimizer_slots(model.optimizer)) if optimizer_state else []
        self.outer = outer if trainable else None
        self.anchor = self.buffers = None
        if self.outer is not None:
            # x0 (the weights after the last round) and the outer momentum buffer u (a
            # Keras optimizer keeps its own).
            self.anchor = _copies(self.weights)
            if self.keras_outer:
                self.outer.build(self.anchor)
            else:
                self.buffers = [tf.Variable(tf.zeros(w.shape, _dtype(w)), trainable=False)
                                for w in self.weights]
        # Positions in `variables` of each BatchNorm layer's moving mean and variance: the
        # variance is pooled, not averaged (hvdtrain.rounds.averaging.pooled_variance).
        position = {id(v): i for i, v in enumerate(self.variables)}
        self._moments = [(position[id(mean)], position[id(var)])
                         for mean, var in batch_norm_statistics(model)
                         if id(mean) in position and id(var) in position]
        # A compressed round sends only each variable's change since the last round, from
        # the state every worker held then: float16 keeps 11 bits of a small change, where
        # it would round the value itself to 2^-11 of its size and lose a late, small
        # update. For the weights, SlowMo's x0 is exactly that state, so with an
        # outer optimizer the weights' reference is the anchor itself, updated by the outer
        # step; the statistics' and slots' reference is always a copy of their own.
        self.weights_reference = self.others_reference = None
        # Running squares (Adam's and LAMB's v) span orders of magnitude, and the optimizer
        # divides by their roots: int8 against a chunk's largest change gives the small ones
        # back coarse (LAMB's state averaged so ended 4.5 and 6.6 points down), and float16
        # flushes their small changes to 0; so in a compressed round they travel in float32
        # beside the coded rest. A sparse round (topk) could send a moving mean's change
        # without its variance's, and the pooled variance would then come out far from
        # either, often below 0 (clamped, BatchNorm divides by its root: a ResNet-20 so
        # evaluated at 10% with a loss of 1e35); int2's and int1's codes are as coarse. With
        # them the statistics travel in float32 too (ResNet-20's are 0.5% of its values).
        first_slot = len(self.weights) + len(self.statistics)
        statistics = (range(len(self.weights), first_slot) if compression in WHOLE_STATISTICS
                      else [])
        self.exact = sorted({*statistics, *(j for j in self.non_negative_positions
                                            if j >= first_slot)})
        self.coded = [j for j in range(len(self.variables)) if j not in self.exact]
        self.compressed = None if compression == "none" else CompressedExchange(
            [self.variables[j] for j in self.coded], compression)
        if self.compressed is not None:
            self.weights_reference = (self.anchor if self.anchor is not None
                                      else _copies(self.weights))
            self.others_reference = _copies(self.statistics + self.slots)
        # Where this round's steps start from, for `rescale`: the compressed rounds'
        # reference or SlowMo's x0 when there is one, else a copy kept for the purpose.
        self.origin, self._own_origin = None, False
        if rescale and self.weights:
            shared = self.weights_reference or self.anchor
            self._own_origin = shared is None
            self.origin = _copies(self.weights) if shared is None else shared
        self._average_fn = self._mean_fn = None
        self._traced_for: tuple[int, int, int] | None = None

    @property
    def variables(self) -> list[tf.Variable]:
        return self.weights + self.statistics + self.slots

    @property
    def keras_outer(self) -> bool:
        return isinstance(self.outer, keras.optimizers.Optimizer)

    @property
    def outer_state(self) -> list:
        """The outer step's own state, which checkpoints and elastic commits keep: SlowMo's
        momentum buffers, or the Keras outer optimizer's variables."""
        if self.outer is None:
            return []
        return list(self.outer.variables) if self.keras_outer else list(self.buffers)

    @property
    def reference(self) -> list[tf.Variable] | None:
        """Compressed rounds' reference, one per variable of `variables` (None uncompressed)."""
        if self.weights_reference is None:
            return None
        return self.weights_reference + self.others_reference

    @property
    def shards(self) -> HostShards | None:
        """How a round is cut between a host's workers now (None: it is not)."""
        return HostShards.current() if self.across_hosts else None

    @property
    def host_shards(self) -> int:
        """In how many shards a round is cut, one per worker of a host (1: uncut)."""
        return HostShards.count() if self.across_hosts else 1

    @property
    def payload_bytes(self) -> int:
        """Bytes one worker hands to allreduce per round (or, compressed, what it encodes,
        which crosses the wire in the same proportion: `hvdtrain.rounds.quantize.payload_bytes`,
        plus the running squares in float32).
        Cut in host shards, its shard's, which is what crosses hosts: the gather of the
        shards inside the host is not counted."""
        shards = self.shards
        lengths = 4 * len(self.weights) if self.origin is not None else 0  # `rescale`'s
        if self.compressed is None:
            return _float_bytes(self.variables, shards) + lengths
        exact = [self.variables[j] for j in self.exact]
        coded = self.compressed.payload_bytes(shards) if self.coded else 0
        return coded + (_float_bytes(exact, shards) if exact else 0) + lengths

    @property
    def bytes_per_round(self) -> int:
        """What a round hands to allreduce now: nothing with one worker, where it is skipped."""
        return self.payload_bytes if comm.size() > 1 else 0

    def _retrace_if_resized(self) -> None:
        """The traced round and mean for the current workers. The rank, the number of
        workers and the host groups are baked into the graphs, so an elastic job that
        changed its workers gets new ones."""
        world = (comm.rank(), comm.size(), comm.world_id())
        if self._traced_for != world:
            self._average_fn = tf.function(self._average)
            self._mean_fn = tf.function(
                lambda values: self.exchange(values, name="state_view", feedback=False))
            self._traced_for = world

    def _round_fn(self):
        self._retrace_if_resized()
        return self._average_fn

    def trace(self, apply_outer: bool = True, take_chief: bool = False) -> None:
        """Build the averaging graph now, without running it, so the first round does not
        stall training for the seconds that tracing a large model takes."""
        if self.variables:
            self._round_fn().get_concrete_function(
                tf.TensorSpec([], tf.float32), apply_outer and self.outer is not None, take_chief)

    def reset_anchor(self, new_world: bool = True) -> None:
        """Take the current state as SlowMo's x0 and as the reference compressed rounds send their
        change from. Call whenever every worker holds the same state, e.g. after a broadcast:
        workers whose references differ would end a round apart. A compressed round's
        residual, what the last round still owes, goes only in a `new_world`, whose state
        came from a broadcast: the workers of a finished round hold the same bits, yet their
        mean residual is exactly what that round's encoding has yet to deliver."""
        if self.compressed is not None and new_world:
            self.compressed.reset()
        if self.reference is not None:
            assign(self.reference, read(self.variables))  # SlowMo's x0 among them
        elif self.anchor is not None:
            assign(self.anchor, read(self.weights))
        if self._own_origin:
            assign(self.origin, read(self.weights))

    def average(self, apply_outer: bool = True, take_chief: bool = False) -> float:
        """One averaging round; returns the mean L2 distance of a worker's weights from the average.

        With `take_chief`, every worker takes rank 0's state instead of the mean (the end
        of a one-worker warm start). It travels as a sum in which the other workers put
        zeros: the same exchange, bytes and rounding as an averaging round.
        """
        if not self.variables:
            return 0.0
        # Floor the rate: SlowMo divides by it, and a cosine schedule reaches 0.
        inner_lr = tf.maximum(current_learning_rate(self.model.optimizer), 1e-12)
        distance = self._round_fn()(inner_lr, apply_outer and self.outer is not None, take_chief)
        return float(distance)

    def show_mean(self) -> list[tf.Tensor]:
        """Every worker takes the workers' mean state for a while, as it is, and gets back
        its own state to put back later (`assign`): for evaluating and saving the average
        model between rounds without a round. No outer step, and SlowMo's x0 and the
        compressed rounds' reference stay the last round's, so the next round is as if this
        never happened."""
        own = read(self.variables)
        if own and comm.size() > 1:
            self._retrace_if_resized()
            assign(self.variables, self._mean_fn(own))
        return own

    def _average(self, inner_lr, apply_outer: bool, take_chief: bool):
        values = read(self.variables)
        results = self.exchange(values, take_chief)
        n = len(self.weights)
        distance = tf.constant(0.0)
        if self.weights:
            distance, inner_lr = _job_means(weight_distance(values[:n], results[:n]), inner_lr)
        if self.origin is not None and not take_chief:
            results[:n] = self._stretched(values[:n], results[:n])
        if self.anchor is not None:
            results[:n] = self._outer_update(results[:n], inner_lr, apply_outer)
        assign(self.variables, results)
        if self._own_origin:
            assign(self.origin, results[:n])
        if self.reference is not None:  # what every worker now holds
            if self.anchor is None:  # else the outer update has set x0, the weights' reference
                assign(self.weights_reference, results[:n])
            assign(self.others_reference, results[n:])
        return distance

    @property
    def non_negative_positions(self) -> list[int]:
        """Positions in `variables` of values that must stay >= 0 whatever arithmetic a
        round does on them: BatchNorm moving variances, and the optimizer's running squares
        (`NON_NEGATIVE_SLOTS`). Only slots are matched by name: a weight may be called
        anything, and a negative one is no error."""
        first_slot = len(self.weights) + len(self.statistics)
        squares = [first_slot + i for i, v in enumerate(self.slots) if _is_running_square(v)]
        return sorted({j for _, j in self._moments} | set(squares))

    def clamp_non_negative(self, values) -> list[tf.Tensor]:
        """`values` (one per variable) with the non-negative ones floored at 0. A compressed
        round adds a rounded change to its reference, which can overshoot below 0: with
        reference 5.5e-8 and value 2e-8 it gives -4.6e-9, and Adam's sqrt(v) is then NaN."""
        values = list(values)
        for j in self.non_negative_positions:
            values[j] = tf.maximum(values[j], tf.zeros((), values[j].dtype))
        return values

    def exchange(self, values, take_chief: bool = False, name: str = "model_state",
                 feedback: bool = True) -> list[tf.Tensor]:
        """The workers' mean of each of `values` (one per variable; BatchNorm variances
        pooled), or with `take_chief` rank 0's value; before any outer step. Eager or
        traced; `name` keys the collectives across workers. `feedback`: a compressed
        round keeps what its encoding cut off for the next round (not for a view)."""
        if comm.size() == 1:
            # Nothing to exchange; skipping the encoding keeps a one-worker round a no-op
            # to the bit. Read when traced, like the rank below.
            return list(values)
        reference = read(self.reference) if self.reference is not None else None
        # Rank 0's variances travel as they are: there is nothing to pool.
        moments = [] if take_chief else self._moments
        sent = _encode(values, reference, moments)
        shards = None if take_chief else self.shards  # no hierarchy takes a chief's state
        if shards is not None:
            sent = self._statistics_meant_in_host(sent, shards, name)
        if self.compressed is None:
            received = _float_exchange(sent, take_chief, name, shards)
        else:
            received = self._compressed_exchange(sent, take_chief, name, feedback, shards)
        return self.clamp_non_negative(_decode(received, reference, moments))

    def _statistics_meant_in_host(self, sent, shards: HostShards, name: str) -> list:
        """`sent` with the BatchNorm statistics replaced by their host's mean. Host shards
        rest on a host's workers holding the same values: weights and slots do (gradients
        are averaged every step), but each worker updates its moving statistics from its
        own batches. Averaged first inside the host (sent pooled, so means of them are the
        pooled moments), the shard round then gives the mean over all the workers."""
        first = len(self.weights)
        positions = range(first, first + len(self.statistics))
        if not positions:
            return sent
        means = comm.average([sent[j] for j in positions], name=f"{name}_host_statistics",
                             group=shards.host)
        return [*sent[:first], *means, *sent[first + len(means):]]

    def _compressed_exchange(self, sent, take_chief: bool, name: str, feedback: bool, shards):
        """`sent`'s exchange in a compressed round: the running squares (and, in a topk,
        int2 or int1 round, BatchNorm's statistics: `exact`) in float32, the rest encoded."""
        received = list(sent)
        if self.exact:
            means = _float_exchange([sent[j] for j in self.exact], take_chief,
                                    f"{name}_squares", shards)
            for j, mean in zip(self.exact, means):
                received[j] = mean
        if self.coded:
            # Rank is read when this is traced, as for the allreduce's share in `exchange`.
            if take_chief:
                share, name = (1.0 if comm.is_chief() else 0.0), f"{name}_from_chief"
            else:
                share = None
            means = self.compressed.mean([sent[j] for j in self.coded], name=name,
                                         share=share, feedback=feedback, shards=shards)
            for j, mean in zip(self.coded, means):
                received[j] = mean
        return received

    def _stretched(self, own, means) -> list[tf.Tensor]:
        """`means` of the weights, each step from the origin stretched to the workers' mean
        length of their own steps of that variable (one small allreduce)."""
        origin = read(self.origin)
        lengths = tf.stack([tf.norm(tf.cast(o - x, tf.float32)) for o, x in zip(origin, own)])
        (mean_lengths,) = comm.average([lengths], name="step_lengths")
        # Read when traced, like the rank; a resized job retraces.
        longest = math.sqrt(comm.size())
        return [_stretch(o, m, length, longest)
                for o, m, length in zip(origin, means, tf.unstack(mean_lengths))]

    def _outer_update(self, means, inner_lr, apply_outer: bool) -> list:
        """The new x0, which every worker takes: the outer step from the mean, or the mean."""
        if not apply_outer:
            assign(self.anchor, means)
            return list(means)
        if self.keras_outer:  # its rate is its own: the inner rate plays no part
            pseudo_gradients = [a - m for a, m in zip(read(self.anchor), means)]
            self.outer.apply_gradients(list(zip(pseudo_gradients, self.anchor)))
            return read(self.anchor)
        targets = []
        for anchor, buf, mean in zip(self.anchor, self.buffers, means):
            new_anchor, new_buf = outer_step(anchor, mean, buf, inner_lr, self.outer.lr,
                                             self.outer.momentum, self.outer.nesterov)
            buf.assign(new_buf)
            anchor.assign(new_anchor)
            targets.append(new_anchor)
        return targets


def _stretch(origin, mean, length, longest: float) -> tf.Tensor:
    """x₀ − (x₀ − x̄) · r with r = min(longest, ℓ / |x₀ − x̄|), 1 where x̄ = x₀: the mean step
    x₀ − x̄ as long as the workers' own steps were on average (ℓ). A mean of W steps of
    one length but noisy directions is shorter than they are (by √W where they are
    unrelated, hence `longest`), and an optimizer that sets each layer's step length, as
    LAMB and LARS do, then moves the average less than sync mode's one step would."""
    step = origin - mean
    norm = tf.norm(tf.cast(step, tf.float32))
    ratio = tf.where(norm > 0.0, tf.minimum(longest, tf.math.divide_no_nan(length, norm)), 1.0)
    return origin - step * tf.cast(ratio, step.dtype)


def _float_bytes(variables, shards: HostShards | None) -> int:
    """What a worker hands to a float32 round of `variables` (cut in host shards: its shard)."""
    if shards is not None:
        return shards.shard_bytes(sum(int(v.shape.num_elements()) for v in variables))
    return variable_bytes(variables)


def _float_exchange(sent, take_chief: bool, name: str, shards: HostShards | None) -> list:
    """The workers' mean of `sent` through allreduce as it is (or rank 0's, or cut in host
    shards). Eager or traced."""
    if shards is not None:
        return shards.average(sent, name=name)
    if take_chief:
        # Rank is read when this is traced; `retrace` runs whenever the workers change.
        share = 1.0 if comm.is_chief() else 0.0
        return comm.total([t * tf.constant(share, t.dtype) for t in sent],
                          name=f"{name}_from_chief")
    return comm.average(sent, name=name)


def _job_means(distance, inner_lr) -> tuple[tf.Tensor, tf.Tensor]:
    """The workers' mean distance from the average, and their mean inner rate, in one small
    allreduce. The outer step must use one rate on every worker: with hierarchical local
    SGD each host scales its own for its own workers, and hosts of unequal size would
    otherwise compute different x0 and momentum. Averaged in float64, equal rates come back
    exactly as they went."""
    pair = tf.stack([tf.cast(distance, tf.float64), tf.cast(inner_lr, tf.float64)])
    (mean,) = comm.average([pair], name="weight_divergence")
    return tf.cast(mean[0], tf.float32), tf.cast(mean[1], inner_lr.dtype)


# Compressed rounds keep the reference of the raw statistics (mean a, variance r) and take the
# second moment about a: at the reference it is r itself, so the variance's reference serves
# the sent quantity too, and what travels is Δv + Δm², as small as the changes. A reference
# for v + m² would send Δv + 2mΔm instead, whose float16 rounding grows with the mean and can
# swamp Δv where the mean is large next to the spread.

def _encode(values, reference, moments) -> list[tf.Tensor]:
    """What a worker sends: its values, each BatchNorm variance replaced by the second
    moment (about 0, or with a reference about the reference mean); with a reference, minus it."""
    sent = list(values)
    for i, j in moments:
        sent[j] = second_moment(values[i], values[j], 0.0 if reference is None else reference[i])
    if reference is not None:
        sent = [s - r for s, r in zip(sent, reference)]
    return sent


def _decode(received, reference, moments) -> list[tf.Tensor]:
    """The new values from the exchanged ones: `_encode` undone on the means."""
    if reference is not None:
        received = [r + d for r, d in zip(reference, received)]
    received = list(received)
    for i, j in moments:
        received[j] = pooled_variance(received[i], received[j],
                                      0.0 if reference is None else reference[i])
    return received
