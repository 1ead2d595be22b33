"""Synchronous data parallelism: an optimizer that averages gradients across workers.

Keras 2.15 optimizers call `aggregate_gradients` before every update and document
it as the place for custom aggregation; we override it with one grouped Horovod
allreduce. Unlike `hvd.DistributedOptimizer`, the averaging can be switched off
and on during a run through a variable read inside the compiled step, which is
what post-local SGD needs (synchronous for K steps, then local) without
recompiling the model. A counter variable records how many steps averaged, so
communication is accounted for exactly.
"""

from __future__ import annotations

import tensorflow as tf

from hvdtrain import comm
from hvdtrain.averaging import gradient_buckets

# Like PyTorch DDP's default bucket: large enough to amortise a round trip, small enough
# that the last layers' gradients go out while the first layers are still computing.
DEFAULT_BUCKET_MB = 25.0

_CLASS_CACHE: dict[type, type] = {}


class GradientAveragingMixin:
    """Put before a Keras optimizer class; adds `averaging_enabled` and `averaged_steps`."""

    def __init__(self, *args, averaging: bool = True, fp16_allreduce: bool = False,
                 bucket_mb: float = DEFAULT_BUCKET_MB, **kwargs):
        super().__init__(*args, **kwargs)
        self.fp16_allreduce = fp16_allreduce
        self.bucket_mb = bucket_mb
        # Plain tf.Variables, not optimizer slots: they are not in `optimizer.variables`,
        # so broadcasting or averaging the optimizer state leaves them alone.
        self.averaging_enabled = tf.Variable(averaging, trainable=False, dtype=tf.bool,
                                             name="gradient_averaging_enabled")
        self.averaged_steps = tf.Variable(0, trainable=False, dtype=tf.int64,
                                          name="gradient_averaged_steps")

    def aggregate_gradients(self, grads_and_vars):
        grads_and_vars = list(grads_and_vars)
        if comm.size() == 1:
            return grads_and_vars
        present = [i for i, (g, _) in enumerate(grads_and_vars) if g is not None]
        grads = [tf.convert_to_tensor(grads_and_vars[i][0]) for i in present]

        sizes = [g.shape.num_elements() * g.dtype.size for g in grads]
        buckets = gradient_buckets(sizes, self.bucket_mb * 1e6)

        def averaged():
            self.averaged_steps.assign_add(1)
            result = [None] * len(grads)
            for k, bucket in enumerate(buckets):
                means = comm.average([grads[i] for i in bucket], name=f"gradients_{k}",
                                     fp16=self.fp16_allreduce)
                for i, mean in zip(bucket, means):
                    result[i] = mean
            return tuple(result)

        averaged_grads = tf.cond(self.averaging_enabled, averaged, lambda: tuple(grads))
        result = list(grads_and_vars)
        for i, grad in zip(present, averaged_grads):
            result[i] = (grad, grads_and_vars[i][1])
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
                            bucket_mb: float = DEFAULT_BUCKET_MB):
    """A new optimizer like `optimizer` (same class and config) that averages gradients.

    Call before `model.compile`; the original optimizer must not have been used yet.
    """
    cls = gradient_averaging_class(type(optimizer))
    config = dict(optimizer.get_config())
    config.pop("is_legacy_optimizer", None)
    if isinstance(config.get("learning_rate"), dict):
        config["learning_rate"] = tf.keras.optimizers.schedules.deserialize(
            config["learning_rate"])
    return cls(averaging=averaging, fp16_allreduce=fp16_allreduce, bucket_mb=bucket_mb, **config)


def has_gradient_averaging(optimizer) -> bool:
    return isinstance(optimizer, GradientAveragingMixin)
