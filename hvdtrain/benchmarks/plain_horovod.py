"""The reference hvdtrain's overhead is measured against: bare Horovod and `model.fit`.

This is the plainest data-parallel script a Keras 3 user can write with Horovod's
TensorFlow ops, and nothing else: a `train_step` that averages every gradient with
`hvd.allreduce` before the optimizer applies it, rank 0's initial weights and
optimizer state broadcast to all workers before `fit`, and the epoch's metrics
averaged over workers at its end. Horovod's own Keras layer would be plainer still,
but it does not work with Keras 3: `hvd.DistributedOptimizer` trains without ever
averaging, and `BroadcastGlobalVariablesCallback` fails on Keras 3 variables. So
every Horovod call here takes a tensor, and values are assigned back to variables.

It is the one place outside `hvdtrain.comm` that imports Horovod, on purpose: it must
be bare Horovod, with none of hvdtrain's machinery. It trains on the same synthetic
input as `hvdtrain bench` (a batch kept on the device, or the in-memory pipeline), so
the ratio of the two rates measures the training machinery alone (gradient averaging,
callbacks, logs), not the input. The one addition is the benchmark's own stopwatch
(an `ExchangeClock` on the model): it reads timestamps around the allreduces, so that
`--slow-rank` slows this step's compute as it does hvdtrain's, and not its allreduces.
"""

from __future__ import annotations

import horovod.tensorflow as hvd
import keras
import tensorflow as tf

from hvdtrain.data import device_synthetic, synthetic
from hvdtrain.keras.exchange_clock import ExchangeClock
from hvdtrain.models import build_model


class GradientAveragingModel(keras.Model):
    """A functional model whose training step averages each gradient over the workers."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.exchange_clock = ExchangeClock()

    def train_step(self, data):
        images, labels = data
        with tf.GradientTape() as tape:
            logits = self(images, training=True)
            loss = self.compute_loss(y=labels, y_pred=logits)
        gradients = tape.gradient(loss, self.trainable_variables)
        # One allreduce per tensor: Horovod's tensor fusion packs them into few messages.
        gradients = self.exchange_clock.timed(
            gradients, lambda: [hvd.allreduce(g, op=hvd.Average) for g in gradients])
        self.optimizer.apply(gradients, self.trainable_variables)
        for metric in self.metrics:  # the loss tracker, then the compiled metrics
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(labels, logits)
        return self.get_metrics_result()


class AverageEpochMetrics(keras.callbacks.Callback):
    """Each worker's epoch logs become their mean over the workers. Put it first, so
    that the callbacks after it (History among them) see the mean."""

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        names = sorted(logs)  # every worker must send its numbers in the same order
        local = tf.constant([float(logs[name]) for name in names], tf.float64)
        mean = hvd.allreduce(local, op=hvd.Average, name="epoch_metrics")
        logs.update(zip(names, mean.numpy().tolist()))


def broadcast_initial_state(model: keras.Model) -> None:
    """Every worker takes rank 0's weights and optimizer state."""
    # Keras creates the optimizer's slots at the first step; create them now so that
    # they are broadcast too.
    model.optimizer.build(model.trainable_variables)
    for i, variable in enumerate([*model.weights, *model.optimizer.variables]):
        value = hvd.broadcast(tf.convert_to_tensor(variable), root_rank=0,
                              name=f"initial_state_{i}")
        variable.assign(value)


def train(model_name: str, shape: tuple[int, int, int], batch_size: int, steps: int, seed: int,
          callbacks: list[keras.callbacks.Callback] = (), on_device: bool = True) -> keras.Model:
    """`steps` steps of SGD with momentum on every worker; returns the trained model."""
    hvd.init()
    data = (device_synthetic if on_device else synthetic).load(shape, seed=seed)
    keras.utils.set_random_seed(seed)
    built = build_model(model_name, data.input_shape, data.num_classes)
    # The same layers and weights, with the averaging training step.
    model = GradientAveragingModel(built.inputs, built.outputs, name=built.name)
    # Linear scaling of the rate, as Horovod's examples do; small, since the labels are random.
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.001 * hvd.size(), momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=False)  # "auto" means XLA on a GPU
    broadcast_initial_state(model)
    if on_device:
        gpus = tf.config.list_logical_devices("GPU")
        data.feed_from_device(model, batch_size, gpus[0].name if gpus else "/device:CPU:0",
                              hvd.rank())
    model.fit(data.train(hvd.rank(), hvd.size(), batch_size, seed), epochs=1, steps_per_epoch=steps,
              callbacks=[AverageEpochMetrics(), *callbacks], verbose=0)
    return model
