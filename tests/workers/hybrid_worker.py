"""The two-column AlexNet on two logical CPU devices per worker; records what ran where.

usage: hybrid_worker.py placement OUT_DIR   one process (no horovodrun): the model split
                                            over two devices against the same weights on one
       hybrid_worker.py train OUT_DIR       under horovodrun: synchronous and local-SGD
                                            training in a plain model.fit, each rank's weights

Device names are saved as recorded by TensorFlow; the tests decide what they must be.
"""

import json
import os
import sys

import numpy as np
import keras
import tensorflow as tf

import hvdtrain.keras as hk
from hvdtrain import comm
from hvdtrain.machine.devices import configure_devices
from hvdtrain.models.alexnet_2col import alexnet_2col

SHAPE, CLASSES, BATCH = (32, 32, 3), 10, 8
STEP_OPS = ("Conv2D", "Conv2DBackpropFilter", "Conv2DBackpropInput", "MatMul")


def flat_weights(model):
    return np.concatenate([w.ravel() for w in model.get_weights()])


def variable_devices(variables):
    # Keras 3: `path` is the unique name ("conv1_col0/kernel"; `name` is just "kernel"),
    # and the device is that of the tf.Variable underneath. Models pass their `weights`:
    # their `variables` also hold the Dropout layers' seed generators.
    return np.array([(v.path, v.value.device) for v in variables], dtype=str)


def _placer_device(graph, op):
    """The op's own device or, for a gradient op, that of the op it must be colocated with."""
    if op.device:
        return op.device
    for group in op.colocation_groups():
        other = graph.get_operation_by_name(group.decode()[len("loc:@"):])
        if other.name != op.name and other.device:
            return other.device
    return ""


def training_step_devices(model, x, y):
    """(op name, op type, device) of every convolution and matmul of one traced training step."""
    graph = tf.function(model.train_step).get_concrete_function(
        (tf.constant(x[:BATCH]), tf.constant(y[:BATCH]))).graph
    return np.array([(op.name, op.type, _placer_device(graph, op))
                     for op in graph.get_operations() if op.type in STEP_OPS], dtype=str)


def random_data(seed, n):
    # Pixel-scale values: with unit-scale inputs a freshly initialised AlexNet's logits are
    # about 1e-3, too small for a 1e-5 comparison to mean anything.
    rng = np.random.default_rng(seed)
    return (rng.uniform(0, 255, size=(n, *SHAPE)).astype("float32"),
            rng.integers(0, CLASSES, size=n).astype("int32"))


def compile_sgd(model, optimizer=None):
    # jit_compile explicit, not Keras's "auto" (which depends on whether there is a GPU).
    model.compile(optimizer or keras.optimizers.SGD(0.01, momentum=0.9), jit_compile=False,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def placement(out_dir):
    hk.init()
    devices = configure_devices(2, comm.local_rank())
    devices_again = configure_devices(2, comm.local_rank())  # a second identical call is harmless
    keras.utils.set_random_seed(0)
    x, y = random_data(0, 2 * BATCH)

    split = alexnet_2col(SHAPE, CLASSES, devices=devices, lrn=True)
    single = alexnet_2col(SHAPE, CLASSES, lrn=True)
    single.set_weights(split.get_weights())
    weights_file = os.path.join(out_dir, "split.weights.h5")
    split.save_weights(weights_file)
    moved = alexnet_2col(SHAPE, CLASSES, devices=[devices[1]], lrn=True)
    moved.load_weights(weights_file)

    # Eager calls: each output tensor says where the op that made it really ran.
    probe = keras.Model(split.input, [split.get_layer(f"conv5_col{c}").output
                                         for c in range(2)] + [split.output])
    ran_on = [t.device for t in probe(x[:2], training=False)]
    outputs = {name: model.predict(x, verbose=0)
               for name, model in (("split", split), ("single", single), ("moved", moved))}

    compile_sgd(split)
    split.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)  # builds the optimizer's slots
    saved = os.path.join(out_dir, "split.keras")  # the whole model, loaded by the test
    split.save(saved)
    np.savez(os.path.join(out_dir, "placement.npz"),
             devices=np.array(devices), devices_again=np.array(devices_again),
             logical_cpus=np.array([d.name for d in tf.config.list_logical_devices("CPU")]),
             **{f"out_{name}": out for name, out in outputs.items()},
             ran_on=np.array(ran_on),
             variables=variable_devices(split.weights),
             optimizer_variables=variable_devices(split.optimizer.variables),
             step_ops=training_step_devices(split, x, y),
             saved=saved, saved_input=x, saved_output=split.predict(x, verbose=0))


def train(out_dir):
    hk.init()
    devices = configure_devices(2, comm.local_rank())
    rank = hk.rank()
    x, y = random_data(rank, 4 * BATCH)  # each worker its own data
    runs = {
        "sync": lambda: (hk.with_gradient_averaging(keras.optimizers.SGD(0.01, momentum=0.9)),
                         [hk.BroadcastInitialState()], 3),
        "local": lambda: (keras.optimizers.SGD(0.01, momentum=0.9), [hk.LocalSGD(n_sync=2)], 4),
    }
    for name, make in runs.items():
        # Different initial weights on each rank: the initial broadcast must fix them.
        keras.utils.set_random_seed(100 + rank)
        model = alexnet_2col(SHAPE, CLASSES, devices=devices)
        initial = flat_weights(model)
        optimizer, callbacks, steps = make()
        compile_sgd(model, optimizer)
        history = model.fit(x[:steps * BATCH], y[:steps * BATCH], batch_size=BATCH, epochs=1,
                            shuffle=False, verbose=0, callbacks=callbacks)
        np.savez(os.path.join(out_dir, f"{name}-rank{rank}.npz"),
                 initial=initial, weights=flat_weights(model), devices=np.array(devices),
                 logical_cpus=np.array([d.name for d in tf.config.list_logical_devices("CPU")]),
                 variables=variable_devices(model.weights),
                 step_ops=training_step_devices(model, x, y),
                 history=json.dumps(history.history))


if __name__ == "__main__":
    {"placement": placement, "train": train}[sys.argv[1]](*sys.argv[2:])
