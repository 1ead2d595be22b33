"""The reference hvdtrain's overhead is measured against: bare Horovod and `model.fit`.

This is the minimal data-parallel Keras script from Horovod's own examples: the
optimizer wrapped in `hvd.DistributedOptimizer`, variables broadcast by
`BroadcastGlobalVariablesCallback`, metrics averaged by `MetricAverageCallback`,
nothing else. It is the one place outside `hvdtrain.comm` that imports Horovod,
on purpose: it must be bare Horovod. It trains on the same in-memory synthetic
input pipeline as `hvdtrain bench`, so the ratio of the two rates measures the
training machinery alone (gradient averaging, callbacks, logs), not the input.
"""

from __future__ import annotations

import horovod.tensorflow.keras as hvd
import tensorflow as tf

from hvdtrain.data import synthetic
from hvdtrain.models import build_model


def train(model_name: str, shape: tuple[int, int, int], batch_size: int, steps: int, seed: int,
          callbacks: list[tf.keras.callbacks.Callback] = ()) -> tf.keras.Model:
    """`steps` steps of SGD with momentum on every worker; returns the trained model."""
    hvd.init()
    data = synthetic.load(shape, seed=seed)
    tf.keras.utils.set_random_seed(seed)
    model = build_model(model_name, data.input_shape, data.num_classes)
    # Linear scaling of the rate, as Horovod's examples do; small, since the labels are random.
    optimizer = hvd.DistributedOptimizer(
        tf.keras.optimizers.SGD(learning_rate=0.001 * hvd.size(), momentum=0.9))
    model.compile(optimizer=optimizer,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    model.fit(data.train(hvd.rank(), hvd.size(), batch_size, seed), epochs=1, steps_per_epoch=steps,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                         hvd.callbacks.MetricAverageCallback(), *callbacks],
              verbose=0)
    return model
