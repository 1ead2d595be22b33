"""The rules of a local SGD round that the CLI's options and the Keras layer's arguments
share, written once and free of either: the choices each takes, and the defaults that
follow from other choices. `hvdtrain.config` names them as flags, `hvdtrain.keras.LocalSGD`
as arguments; neither restates them.

Pure Python.
"""

from __future__ import annotations

# What a round may apply to the averaged weights (SlowMo, or DiLoCo's Nesterov).
OUTER_OPTIMIZERS = ("none", "slowmo", "nesterov")
# How a round's state travels (`hvdtrain.rounds.quantize`).
ROUND_COMPRESSIONS = ("none", "fp16", "int8", "int4", "int2", "int1", "topk")
# How a warm start's steps train: gradients averaged, or one worker's (Paine et al.).
WARM_STARTS = ("sync", "single")
# Rescaled rounds (flat local mode's on LAMB, every step) travel in int4 by default: at
# 16 x 64, 32 x 64 and 32 x 32 (LeNet-5, 5 epochs, 3 seeds) they ended level with int8's
# for half the bytes (BENCHMARKS.md, compressed rounds).
RESCALED_ROUND_COMPRESSION = "int4"


def rescales_by_default(optimizer: str, hierarchical: bool, fragments: int,
                        optimizer_state: bool) -> bool:
    """Whether local mode's rounds are rescaled when not told: on LAMB, with whole flat
    rounds of each worker's own steps (a shared momentum keeps their length). The CLI's
    --rescale-rounds and the Keras layer's `LocalSGD(rescale_rounds=None)` both follow it."""
    return optimizer == "lamb" and not hierarchical and fragments == 1 and not optimizer_state


def rounds_compression(round_compression: str, fp16_allreduce: bool) -> str:
    """How local and async rounds travel: `round_compression`, or when that is "none" and
    `fp16_allreduce` asks for float16, "fp16" (the same compressed rounds as asking for it)."""
    return "fp16" if fp16_allreduce and round_compression == "none" else round_compression
