"""LeNet-5 on Fashion-MNIST with tf.distribute.MultiWorkerMirroredStrategy on tf_keras.

The peer hvdtrain is measured against (BENCHMARKS.md, "Against other ways to train").
On Keras 3 MultiWorkerMirroredStrategy fails inside model.fit (keras-team/keras#20585),
so the peer runs on tf_keras, Keras 2 as a separate package, which needs

    pip install --no-deps tf_keras==2.21.0     # the release that matches TensorFlow 2.21

(--no-deps: tf_keras asks for the `tensorflow` wheel, and tensorflow-cpu is the same code).

    python -m hvdtrain.benchmarks.peers.mwms_tf_keras --workers 2 --batch-size 64 --epochs 1

starts WORKERS processes on this machine, each with its TF_CONFIG (cluster of free
localhost ports, its own index), trains with a global batch of WORKERS x batch size,
and prints worker 0's result as one JSON line: images/sec over every step after the
first (the first holds tracing and the collectives' set-up), the same window as
hvdtrain's summary.json `images_per_sec` (every step after each epoch's first).
The matching hvdtrain job is `horovodrun -np 2 -H localhost:2 --gloo hvdtrain train
--model lenet --dataset fashion-mnist --batch-size 64 --epochs 1 --no-validate`.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("localhost", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def launch(args: argparse.Namespace) -> int:
    """Start the workers, each with its TF_CONFIG; print worker 0's JSON line."""
    cluster = {"worker": [f"localhost:{port}" for port in free_ports(args.workers)]}
    procs = []
    for index in range(args.workers):
        env = dict(os.environ, TF_USE_LEGACY_KERAS="1",
                   TF_CONFIG=json.dumps({"cluster": cluster,
                                         "task": {"type": "worker", "index": index}}))
        command = [sys.executable, "-m", __spec__.name, "--worker",
                   "--batch-size", str(args.batch_size), "--epochs", str(args.epochs),
                   *(["--data-dir", args.data_dir] if args.data_dir else [])]
        procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True))
    outputs = [proc.communicate()[0] for proc in procs]
    failed = [index for index, proc in enumerate(procs) if proc.returncode != 0]
    if failed:
        print(f"mwms_tf_keras: error: worker(s) {failed} failed", file=sys.stderr)
        return 1
    print(outputs[0].strip().splitlines()[-1])
    return 0


def lenet5(keras):
    """hvdtrain.models.lenet's LeNet-5, layer for layer, in tf_keras."""
    layers = keras.layers
    return keras.Sequential([
        layers.Input((28, 28, 1)),
        layers.Conv2D(6, 5, padding="same", activation="relu"), layers.MaxPooling2D(2),
        layers.Conv2D(16, 5, activation="relu"), layers.MaxPooling2D(2),
        layers.Flatten(), layers.Dense(120, activation="relu"),
        layers.Dense(84, activation="relu"), layers.Dense(10)])


def timed_steps(step_ends: list[float], steps_per_epoch: int) -> list[float]:
    """Each step's seconds (end to end) but every epoch's first, which holds tracing
    and the collectives' set-up: the window hvdtrain's throughput meter times."""
    return [later - earlier for step, (earlier, later) in
            enumerate(zip(step_ends, step_ends[1:]), start=1) if step % steps_per_epoch != 0]


def train(args: argparse.Namespace) -> int:
    """One worker: its part of MultiWorkerMirroredStrategy's model.fit, timed per step."""
    from hvdtrain import quiet

    quiet.quiet_startup()  # TensorFlow's start-up notices off, as in hvdtrain's workers
    import tensorflow as tf
    import tf_keras as keras

    from hvdtrain.data import fashion_mnist  # imports TensorFlow: after the quiet hook

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    workers = strategy.num_replicas_in_sync
    # hvdtrain's own reader and pixel statistics: the same examples, normalised alike.
    data = fashion_mnist.load(args.data_dir)
    images = (data.train_images.astype("float32") / 255.0 - data.mean[0]) / data.std[0]
    labels = data.train_labels
    global_batch = args.batch_size * workers
    steps = len(images) // global_batch
    # Every worker reads its own shard, as hvdtrain's workers do (every K-th example).
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = (tf.data.Dataset.from_tensor_slices((images, labels))
               .shuffle(10_000, seed=42).batch(global_batch, drop_remainder=True)
               .repeat().prefetch(tf.data.AUTOTUNE).with_options(options))
    with strategy.scope():
        model = lenet5(keras)
        # hvdtrain's sync defaults: SGD, momentum 0.9, base rate 0.1 scaled to the batch.
        model.compile(keras.optimizers.SGD(0.1 * global_batch / 256, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])

    class StepClock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.ends = []

        def on_train_batch_end(self, batch, logs=None):
            self.ends.append(time.perf_counter())

    clock = StepClock()
    history = model.fit(dataset, epochs=args.epochs, steps_per_epoch=steps,
                        callbacks=[clock], verbose=0)
    timed = timed_steps(clock.ends, steps)
    print(json.dumps({
        "peer": "MultiWorkerMirroredStrategy, tf_keras " + keras.__version__,
        "tensorflow": tf.__version__, "workers": workers, "batch_size": args.batch_size,
        "steps": len(clock.ends), "images_per_sec": global_batch * len(timed) / sum(timed),
        "loss": float(history.history["loss"][-1]),
        "accuracy": float(history.history["accuracy"][-1])}))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64, help="per worker (default: 64)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--data-dir", default=None,
                        help="Fashion-MNIST's IDX files (default: hvdtrain's, Debian's "
                             "dataset-fashion-mnist)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    return train(args) if args.worker else launch(args)


if __name__ == "__main__":
    sys.exit(main())
