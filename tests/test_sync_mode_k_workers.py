"""Synchronous data parallelism at K = 2 to 4 workers, in one process (tests/fake_comm.py):
gradient averaging (over all workers or one host's), metric averaging and the test-split
evaluation. The horovodrun suites run them over real collectives."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from fake_comm import FakeComm, sent_by
from hvdtrain.keras.callbacks import MetricAverage
from hvdtrain.keras.gradient_averaging import with_gradient_averaging
from hvdtrain.training import evaluation  # not its TestEvaluation: pytest would collect it


def dense_model() -> keras.Model:
    keras.utils.set_random_seed(0)  # every worker starts from the same weights
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])


def gradients(workers: int) -> list[list[np.ndarray]]:
    """Each worker's own gradients for dense_model's kernel and bias."""
    rng = np.random.default_rng(workers)
    return [[rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=3).astype(np.float32)]
            for _ in range(workers)]


def sgd_step(workers: int, rank: int, hosts=None, **options):
    """Rank `rank`'s SGD step (rate 1) with gradient averaging (`options`); every worker
    steps from the same weights with its own gradients, the workers on `hosts` (ranks
    each). Returns this worker's weights before and after, and its optimizer."""
    grads = gradients(workers)
    models = [dense_model() for _ in range(workers)]
    # A 1-byte cap: each gradient travels in a group of its own, last layer first.
    optimizers = [with_gradient_averaging(keras.optimizers.SGD(1.0), bucket_mb=1e-6, **options)
                  for _ in range(workers)]
    for model, optimizer in zip(models, optimizers):
        optimizer.build(model.trainable_variables)
    before = [w.numpy() for w in models[rank].trainable_variables]
    # Within a host, only its workers take part: the others' gradients are not held at all.
    group = next(h for h in hosts if rank in h) if options.get("within_host") else range(workers)
    sent = {k: sent_by(k, workers, lambda k=k: optimizers[k].apply(
        grads[k], models[k].trainable_variables), hosts=hosts)
            for k in group if k != rank}
    with FakeComm(workers, rank, hosts=hosts) as world:
        world.hold_sent(sent)
        optimizers[rank].apply(grads[rank], models[rank].trainable_variables)
    return before, [w.numpy() for w in models[rank].trainable_variables], optimizers[rank]


@pytest.mark.parametrize("workers, rank", [(2, 0), (3, 2)])
def test_gradient_averaging_steps_every_worker_with_the_mean_of_k_workers_gradients(
        workers, rank):
    before, after, optimizer = sgd_step(workers, rank)
    means = [np.mean(g, axis=0) for g in zip(*gradients(workers))]
    for b, a, mean in zip(before, after, means):
        np.testing.assert_allclose(a, b - mean, rtol=0, atol=1e-6)
    assert int(optimizer.averaged_steps.numpy()) == 1


def test_averaging_within_a_host_takes_the_mean_of_that_hosts_workers_only():
    hosts = [(0, 1), (2, 3)]
    before, after, _ = sgd_step(4, 2, within_host=True, hosts=hosts)
    grads = gradients(4)
    for i, (b, a) in enumerate(zip(before, after)):
        np.testing.assert_allclose(a, b - (grads[2][i] + grads[3][i]) / 2, rtol=0, atol=1e-6)


def test_with_averaging_switched_off_a_worker_steps_with_its_own_gradients_and_sends_nothing():
    model = dense_model()
    optimizer = with_gradient_averaging(keras.optimizers.SGD(1.0), averaging=False)
    optimizer.build(model.trainable_variables)
    before = [w.numpy() for w in model.trainable_variables]
    grads = gradients(3)[1]
    with FakeComm(3, 1) as world:  # holds nothing: any collective would fail
        optimizer.apply(grads, model.trainable_variables)
    assert world.calls == []
    for b, w, g in zip(before, model.trainable_variables, grads):
        np.testing.assert_allclose(w.numpy(), b - g, rtol=0, atol=1e-6)
    assert int(optimizer.averaged_steps.numpy()) == 0


def epoch_logs(rank: int) -> dict:
    return {"loss": 1.0 + rank, "accuracy": tf.constant(0.5 + 0.1 * rank),
            "learning_rate": np.float32(0.1), "phase": "local"}


@pytest.mark.parametrize("workers, rank", [(2, 1), (4, 0)])
def test_metric_average_gives_every_numeric_epoch_log_its_mean_over_k_workers(workers, rank):
    sent = {k: sent_by(k, workers, lambda k=k: MetricAverage().on_epoch_end(3, epoch_logs(k)))
            for k in range(workers) if k != rank}
    logs = epoch_logs(rank)
    with FakeComm(workers, rank) as world:
        world.hold_sent(sent)
        MetricAverage().on_epoch_end(3, logs)
    assert logs["loss"] == pytest.approx(1.0 + (workers - 1) / 2)
    assert logs["accuracy"] == pytest.approx(0.5 + 0.1 * (workers - 1) / 2)
    assert logs["learning_rate"] == pytest.approx(0.1)
    assert logs["phase"] == "local"  # not a number: left as it is


def test_evaluation_over_k_workers_shards_of_different_sizes_is_that_of_all_their_data():
    rng = np.random.default_rng(5)
    shards = [(rng.normal(size=(n, 4)).astype(np.float32), rng.integers(0, 3, n))
              for n in (7, 12, 5)]
    model = dense_model()

    def evaluate(k):
        return evaluation.TestEvaluation(model)(tf.data.Dataset.from_tensor_slices(shards[k]).batch(4))

    sent = {k: sent_by(k, 3, lambda k=k: evaluate(k)) for k in (0, 2)}
    with FakeComm(3, 1) as world:
        world.hold_sent(sent)
        loss, accuracy = evaluate(1)
    x, y = (np.concatenate(parts) for parts in zip(*shards))
    logits = model(x).numpy()
    expected_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, logits)
    assert loss == pytest.approx(float(expected_loss), rel=1e-5)
    assert accuracy == pytest.approx(np.mean(logits.argmax(-1) == y))
