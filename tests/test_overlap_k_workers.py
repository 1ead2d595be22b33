"""Overlapped rounds (OverlappedRounds, CoCoD-SGD) at K = 2 and 3 workers, in one process
(tests/fake_comm.py): x <- avg(s_k) + (x - s), checked against numpy. The horovodrun suite
(test_overlap.py) runs them, and LocalSGD's use of them, over real collectives."""

import numpy as np
import pytest

from fake_comm import FakeComm, settled_sends
from hvdtrain.keras.overlap import OverlappedRounds
from hvdtrain.keras.state import ModelStateAverager
from workers.overlap_worker import batch_norm_model, move, set_statistics

REPORT = 2  # each round also sums a report of two numbers from every worker


def worker(rank: int, fp16: bool) -> OverlappedRounds:
    """A worker's rounds over its own model, as in the horovodrun suite's worker. Without
    fp16 the workers start apart, with their own BatchNorm statistics; with it (a compressed
    round) they start from one state (the reference its changes are sent from), then move a
    little apart."""
    model = batch_norm_model(seed=1 if fp16 else 10 + rank)
    averager = ModelStateAverager(model, compression="fp16" if fp16 else "none")
    set_statistics(model, rank, fp16)
    if fp16:
        averager.reset_anchor()
        move(model, rank, 0.003)
    return OverlappedRounds(averager, report_length=lambda: REPORT)


def values(rounds: OverlappedRounds) -> list[np.ndarray]:
    return [v.numpy().astype(np.float64) for v in rounds.averager.variables]


def report(rank: int) -> list[float]:
    return [1.0 + rank, 10.0 * rank]


def round_means(rounds: OverlappedRounds, snapshots) -> list[np.ndarray]:
    """What a round gives for each variable: the mean, the BatchNorm variance pooled."""
    means = [np.mean(s, axis=0) for s in zip(*snapshots)]
    i = variance_position(rounds)
    mu, var = [s[i - 1] for s in snapshots], [s[i] for s in snapshots]
    means[i] = np.mean([v + m ** 2 for v, m in zip(var, mu)], axis=0) - np.mean(mu, axis=0) ** 2
    return means


def variance_position(rounds: OverlappedRounds) -> int:
    """Where the BatchNorm moving variance is among the averaged variables (its mean is
    just before it)."""
    bn = rounds.averager.model.layers[1]
    variables = rounds.averager.variables
    i = next(i for i, v in enumerate(variables) if v is bn.moving_variance)
    assert variables[i - 1] is bn.moving_mean
    return i


def assert_delayed_update(after, before, snapshot, means, atol: float) -> None:
    """x <- avg(s_k) + (x - s) for every variable."""
    for i, mean in enumerate(means):
        np.testing.assert_allclose(after[i], mean + (before[i] - snapshot[i]), rtol=0,
                                   atol=atol, err_msg=f"variable {i}")


def one_round(workers: int, rank: int, fp16: bool):
    """Rank `rank`'s overlapped round among `workers` that each snapshot their own state;
    returns its workers, every snapshot, its state before and after, and what it finished."""
    everyone = [worker(k, fp16) for k in range(workers)]
    snapshots = [values(rounds) for rounds in everyone]

    def start_and_finish(k):
        rounds = worker(k, fp16)  # afresh at every pass: finishing moves its state
        rounds.start(step=4, report=report(k))
        rounds.finish()
        rounds.close()

    sent = settled_sends(workers, lambda k: lambda: start_and_finish(k))
    sent = {k: by_name for k, by_name in sent.items() if k != rank}
    rounds = everyone[rank]
    with FakeComm(workers, rank) as world:
        world.hold_sent(sent)
        rounds.start(step=4, report=report(rank))
        move(rounds.averager.model, rank, 0.01)  # training goes on while the round is in flight
        before = values(rounds)
        finished = rounds.finish()
    rounds.close()
    return rounds, snapshots, before, values(rounds), finished


@pytest.mark.parametrize("workers, rank", [(2, 1), (3, 2)])
def test_an_overlapped_round_gives_the_mean_of_k_snapshots_plus_the_workers_own_progress(
        workers, rank):
    rounds, snapshots, before, after, finished = one_round(workers, rank, fp16=False)
    means = round_means(rounds, snapshots)
    assert_delayed_update(after, before, snapshots[rank], means, atol=1e-6)
    # The workers' BatchNorm means differ: pooling their variances is not averaging them.
    i = variance_position(rounds)
    assert np.abs(means[i] - np.mean([s[i] for s in snapshots], axis=0)).max() > 0.1
    # Each worker's reports summed; the distance of this worker's snapshot from the mean.
    np.testing.assert_array_equal(finished.report, np.sum([report(k) for k in range(workers)], 0))
    n = len(rounds.averager.weights)
    expected = np.sqrt(sum(np.sum((s - m) ** 2) for s, m in zip(snapshots[rank][:n], means)))
    assert finished.distance == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("workers, rank", [(3, 1)])
def test_fp16_overlapped_round_at_k_workers_leaves_the_mean_as_every_workers_reference(
        workers, rank):
    rounds, snapshots, before, after, _ = one_round(workers, rank, fp16=True)
    means = round_means(rounds, snapshots)
    # float16 precision of the changes since the common state (at most 0.03 here).
    assert_delayed_update(after, before, snapshots[rank], means, atol=3e-5)
    # The next round sends its change from this mean, which every worker received.
    for reference, mean in zip(rounds.averager.reference, means):
        np.testing.assert_allclose(reference.numpy(), mean, rtol=0, atol=3e-5)
