"""Synchronous data parallelism: an optimizer that averages gradients across workers.

Keras 3 optimizers have one narrow, public entry point for an update:
`apply(grads, trainable_variables)` (`apply_gradients` and every backend's train
step go through it). We override it to average the gradients first, in grouped
Horovod allreduces (`bucket_mb`: "auto", "auto:K" or MB; `hvdtrain.buckets`), then let
the optimizer update as usual.
That keeps the model's own `train_step` untouched, so it works for any model,
including ones with their own step (the two-column AlexNet). Wrapping the
outermost optimizer matters with mixed precision: a `LossScaleOptimizer` checks the
gradients for overflow in its `apply`, so averaging there first gives every worker
the same gradients and all skip an overflowing step together.

Unlike `hvd.DistributedOptimizer` (which on Keras 3 silently does not average at
all), the averaging can be switched off and on during a run through a variable read
inside the compiled step, which is what post-local SGD needs (synchronous for K
steps, then local) without recompiling the model. A counter variable records how
many steps averaged, so communication is accounted for exactly, and an
`ExchangeClock` how long the steps waited for the averages (benchmarks read it).
"""

from __future__ import annotations

import tensorflow as tf

from hvdtrain import comm
from hvdtrain.buckets import gradient_buckets, parse_bucket_spec
from hvdtrain.buckets import DEFAULT_BUCKET_MB
from hvdtrain.keras.exchange_clock import ExchangeClock

_CLASS_CACHE: dict[type, type] = {}


class GradientAveragingMixin:
    """Put before a Keras optimizer class; adds `averaging_enabled` and `averaged_steps`."""

    def __init__(self, *args, averaging: bool = True, fp16_allreduce: bool = False,
                 bucket_mb: float | str = DEFAULT_BUCKET_MB, within_host: bool = False,
                 **kwargs):
        super().__init__(*args, **kwargs)
        self.fp16_allreduce = fp16_allreduce
        # Hierarchical local SGD: among this host's workers only (hvdtrain.comm.host_group),
        # over the fast links inside it; the hosts' models meet at LocalSGD's rounds.
        self.within_host = within_host
        self.bucket_mb = bucket_mb
        self.buckets = parse_bucket_spec(bucket_mb)  # raises on a bad spec, before training
        # Plain tf.Variables, not Keras optimizer variables: they are not in
        # `optimizer.variables`, so broadcasting or averaging the optimizer state leaves
        # them alone, but tf.train.Checkpoint still saves them with the optimizer.
        self.averaging_enabled = tf.Variable(averaging, trainable=False, dtype=tf.bool,
                                             name="gradient_averaging_enabled")
        self.averaged_steps = tf.Variable(0, trainable=False, dtype=tf.int64,
                                          name="gradient_averaged_steps")
        self.exchange_clock = ExchangeClock()

    def apply(self, grads, trainable_variables=None):
        if self.averaging_group().size > 1:
            grads = self.average_gradients(list(grads))
        return super().apply(grads, trainable_variables)

    def averaging_group(self) -> comm.WorkerGroup:
        """The workers whose gradients are averaged: this host's, or all of them."""
        return comm.host_group() if self.within_host else comm.WorkerGroup(
            tuple(range(comm.size())), 1)

    def average_gradients(self, grads: list) -> list:
        """The workers' mean of `grads` (None entries kept) while averaging is enabled,
        else `grads` as they are; for a compiled step (the switch is read inside it)."""
        present = [i for i, g in enumerate(grads) if g is not None]
        tensors = [tf.convert_to_tensor(grads[i]) for i in present]
        sizes = [t.shape.num_elements() * t.dtype.size for t in tensors]
        buckets = gradient_buckets(sizes, self.buckets.cap_bytes(sizes))
        group = comm.host_group() if self.within_host else None

        def exchange():
            result = [None] * len(tensors)
            for k, bucket in enumerate(buckets):
                means = comm.average([tensors[i] for i in bucket], name=f"gradients_{k}",
                                     fp16=self.fp16_allreduce, group=group)
                for i, mean in zip(bucket, means):
                    result[i] = mean
            return result

        def averaged():
            self.averaged_steps.assign_add(1)
            return tuple(self.exchange_clock.timed(tensors, exchange))

        chosen = tf.cond(self.averaging_enabled, averaged, lambda: tuple(tensors))
        result = list(grads)
        for i, grad in zip(present, chosen):
            result[i] = grad
        return result


def gradient_averaging_class(optimizer_class: type) -> type:
    """The subclass of `optimizer_class` that averages gradients across workers.

    It keeps the base class's name so a saved model loads without hvdtrain.
    """
    if optimizer_class not in _CLASS_CACHE:
        _CLASS_CACHE[optimizer_class] = type(
            optimizer_class.__name__, (GradientAveragingMixin, optimizer_class), {})
    return _CLASS_CACHE[optimizer_class]


def with_gradient_averaging(optimizer, averaging: bool = True, fp16_allreduce: bool = False,
                            bucket_mb: float | str = DEFAULT_BUCKET_MB,
                            within_host: bool = False):
    """A new optimizer like `optimizer` (same class and config) that averages gradients.

    Works for any Keras 3 optimizer, and for a `keras.optimizers.LossScaleOptimizer`
    (wrap that one, not its inner optimizer). Call before `model.compile`; the
    original optimizer must not have been used yet. `within_host`: average among this
    host's workers only (hierarchical local SGD; needs `hvdtrain.keras.init(host_groups=True)`).
    """
    cls = gradient_averaging_class(type(optimizer))
    return cls.from_config({**optimizer.get_config(), "averaging": averaging,
                            "fp16_allreduce": fp16_allreduce, "bucket_mb": bucket_mb,
                            "within_host": within_host})


def has_gradient_averaging(optimizer) -> bool:
    return isinstance(optimizer, GradientAveragingMixin)


def averaging_optimizer(optimizer):
    """The optimizer that carries the gradient averaging, wherever it sits in the wrapping
    (a LossScaleOptimizer is wrapped whole, its inner optimizer is not), or None.

    Looking only at the outermost or only at the innermost optimizer misses it in one of
    the two layouts a user may build, and local SGD would then leave the averaging on.
    """
    while optimizer is not None:
        if has_gradient_averaging(optimizer):
            return optimizer
        optimizer = getattr(optimizer, "inner_optimizer", None)
    return None
