"""The inner optimizer of a run, built from the configuration."""

from __future__ import annotations

import keras

from hvdtrain.config import TrainConfig
from hvdtrain.keras.gradient_averaging import gradient_averaging_class
from hvdtrain.keras.state import base_optimizer

# Decay weights, not biases or BatchNorm scales and offsets (Goyal et al. 2017, section 5.1).
NO_DECAY_NAMES = ["bias", "gamma", "beta"]


def make_optimizer(cfg: TrainConfig, learning_rate, averaging: bool):
    """SGD or Adam that averages gradients across workers while `averaging` is on.

    With mixed precision it is a LossScaleOptimizer around SGD or Adam, and the
    averaging is added to the LossScaleOptimizer itself, ahead of its finiteness check,
    so in sync mode every worker sees the same averaged gradients and all skip a
    non-finite step together. `base_optimizer` reaches the SGD or Adam inside.
    """
    kwargs = {}
    if cfg.optimizer == "sgd":
        base = keras.optimizers.SGD
        kwargs.update(momentum=cfg.momentum, nesterov=cfg.nesterov)
    else:
        base = keras.optimizers.Adam
    if cfg.weight_decay:
        kwargs["weight_decay"] = cfg.weight_decay
    averaging_options = dict(averaging=averaging, fp16_allreduce=cfg.fp16_allreduce,
                             bucket_mb=cfg.bucket_mb, within_host=cfg.hierarchical_sgd)
    if not cfg.mixed_precision:
        optimizer = gradient_averaging_class(base)(learning_rate=learning_rate, **kwargs,
                                                   **averaging_options)
    else:
        inner = base(learning_rate=learning_rate, **kwargs)
        optimizer = gradient_averaging_class(keras.optimizers.LossScaleOptimizer)(
            inner, **averaging_options)
    if cfg.weight_decay:
        base_optimizer(optimizer).exclude_from_weight_decay(var_names=NO_DECAY_NAMES)
    return optimizer
