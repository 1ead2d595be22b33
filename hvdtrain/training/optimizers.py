"""The inner optimizer of a run, built from the configuration."""

from __future__ import annotations

import tensorflow as tf

from hvdtrain.config import TrainConfig
from hvdtrain.keras.gradient_averaging import gradient_averaging_class

# Decay weights, not biases or BatchNorm scales and offsets (Goyal et al. 2017, section 5.1).
NO_DECAY_NAMES = ["bias", "gamma", "beta"]


def make_optimizer(cfg: TrainConfig, learning_rate, averaging: bool):
    """SGD or Adam that averages gradients across workers while `averaging` is on.

    Returns (optimizer to compile with, the averaging optimizer inside it): with mixed
    precision the first is a LossScaleOptimizer around the second. It calls our
    `aggregate_gradients` before its finiteness check, so in sync mode every worker
    sees the same averaged gradients and all skip a non-finite step together.
    """
    kwargs = {}
    if cfg.optimizer == "sgd":
        base = tf.keras.optimizers.SGD
        kwargs.update(momentum=cfg.momentum, nesterov=cfg.nesterov)
    else:
        base = tf.keras.optimizers.Adam
    if cfg.weight_decay:
        kwargs["weight_decay"] = cfg.weight_decay
    optimizer = gradient_averaging_class(base)(learning_rate=learning_rate, averaging=averaging,
                                               fp16_allreduce=cfg.fp16_allreduce,
                                               bucket_mb=cfg.bucket_mb, **kwargs)
    if cfg.weight_decay:
        optimizer.exclude_from_weight_decay(var_names=NO_DECAY_NAMES)
    if cfg.mixed_precision:
        return tf.keras.mixed_precision.LossScaleOptimizer(optimizer), optimizer
    return optimizer, optimizer
