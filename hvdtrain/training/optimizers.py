"""The inner optimizer of a run, built from the configuration."""

from __future__ import annotations

import tensorflow as tf

from hvdtrain.config import TrainConfig
from hvdtrain.keras.gradient_averaging import gradient_averaging_class

# Decay weights, not biases or BatchNorm scales and offsets (Goyal et al. 2017, section 5.1).
NO_DECAY_NAMES = ["bias", "gamma", "beta"]


def make_optimizer(cfg: TrainConfig, learning_rate, averaging: bool):
    """SGD or Adam that averages gradients across workers while `averaging` is on."""
    kwargs = {}
    if cfg.optimizer == "sgd":
        base = tf.keras.optimizers.SGD
        kwargs.update(momentum=cfg.momentum, nesterov=cfg.nesterov)
    else:
        base = tf.keras.optimizers.Adam
    if cfg.weight_decay:
        kwargs["weight_decay"] = cfg.weight_decay
    optimizer = gradient_averaging_class(base)(learning_rate=learning_rate, averaging=averaging,
                                               **kwargs)
    if cfg.weight_decay:
        optimizer.exclude_from_weight_decay(var_names=NO_DECAY_NAMES)
    return optimizer
