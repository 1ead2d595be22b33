"""The inner optimizer of a run, built from the configuration."""

from __future__ import annotations

import keras

from hvdtrain.config import TrainConfig
from hvdtrain.keras.gradient_averaging import gradient_averaging_class
from hvdtrain.keras.lars import EXCLUDED_NAMES, LARS
from hvdtrain.keras.state import base_optimizer

# Decay weights, not biases or BatchNorm scales and offsets (Goyal et al. 2017, section 5.1).
NO_DECAY_NAMES = list(EXCLUDED_NAMES)


def _base_and_options(cfg: TrainConfig) -> tuple[type, dict]:
    """The Keras optimizer class of --optimizer and its arguments but the rate."""
    if cfg.optimizer == "sgd":
        return keras.optimizers.SGD, dict(momentum=cfg.momentum, nesterov=cfg.nesterov)
    if cfg.optimizer == "lars":  # its weight decay is its own, inside the trust ratio
        return LARS, dict(momentum=cfg.momentum, eta=cfg.lars_eta,
                          weight_decay=cfg.weight_decay)
    base = keras.optimizers.Lamb if cfg.optimizer == "lamb" else keras.optimizers.Adam
    return base, {}


def make_optimizer(cfg: TrainConfig, learning_rate, averaging: bool):
    """SGD, Adam, LARS or Lamb that averages gradients across workers while `averaging` is on.

    With mixed precision it is a LossScaleOptimizer around SGD, Adam, LARS or Lamb, and
    the averaging is added to the LossScaleOptimizer itself, ahead of its finiteness check,
    so in sync mode every worker sees the same averaged gradients and all skip a
    non-finite step together. `base_optimizer` reaches the optimizer inside.
    """
    base, kwargs = _base_and_options(cfg)
    decoupled_decay = bool(cfg.weight_decay) and base is not LARS
    if decoupled_decay:
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
    if decoupled_decay:
        base_optimizer(optimizer).exclude_from_weight_decay(var_names=NO_DECAY_NAMES)
    return optimizer
