"""hvdtrain's Keras layer: callbacks and an optimizer wrapper for any `model.fit`.

Callback order matters; use this one:
  1. `BroadcastInitialState` (sync mode) or `LocalSGD` (local mode; it broadcasts too),
     and `AverageModelStatistics` in sync mode with BatchNorm;
  2. `MetricAverage`;
  3. on rank 0 only: loggers, TensorBoard, checkpoints (they read averaged metrics
     and the consensus weights).

Workers that built the model from one seed draw the same dropout masks; call
`reseed_dropout(model, seed + rank())` before `fit` to give each its own.
"""

from hvdtrain.comm import rank, size
from hvdtrain.keras.callbacks import AverageModelStatistics, BroadcastInitialState, MetricAverage
from hvdtrain.keras.gradient_averaging import with_gradient_averaging
from hvdtrain.keras.local_sgd import LocalSGD
from hvdtrain.keras.schedule import WarmupDecaySchedule
from hvdtrain.keras.start import init
from hvdtrain.keras.state import reseed_dropout

__all__ = [
    "init", "rank", "size", "AverageModelStatistics", "BroadcastInitialState", "MetricAverage",
    "with_gradient_averaging", "LocalSGD", "WarmupDecaySchedule", "reseed_dropout",
]
