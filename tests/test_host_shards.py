"""Rounds across hosts cut in host shards (hvdtrain.keras.host_shards), at 4 workers on 2
hosts of 2 and 6 on 3 hosts of 2, in one process (tests/fake_comm.py): every worker's
round is run, with the others' sends coming from the same code run as them. The
horovodrun suite (test_hierarchical.py) runs the real collectives."""

import numpy as np
import pytest
import tensorflow as tf

from fake_comm import FakeComm, settled_sends
from hvdtrain.rounds import quantize
from hvdtrain.keras.compressed_rounds import CompressedExchange
from hvdtrain.keras.host_shards import HostShards

SHAPES = [(3, 700), (51,), (2, 2)]  # 2,155 values: an odd count, so the last shard is padded
LENGTH = 2155
NAME = "x"


def hosts_of_two(hosts: int) -> list[tuple[int, int]]:
    return [(2 * h, 2 * h + 1) for h in range(hosts)]


def host_values(hosts: int, seed: int) -> list[list[np.ndarray]]:
    """One state per host: its workers hold the same (they average every step)."""
    rng = np.random.default_rng(seed)
    return [[rng.normal(size=s).astype(np.float32) * (1 + h) for s in SHAPES]
            for h in range(hosts)]


def flat(arrays) -> np.ndarray:
    return np.concatenate([np.ravel(a) for a in arrays]).astype(np.float64)


def every_workers_round(hosts: int, run, passes: int = 3):
    """`run(k)` for every worker k of `hosts` hosts of 2, each in a world whose peers
    send what the same code sends as them; returns each worker's result and its world.
    `passes`: one more than the longest chain of collectives that feed each other."""
    workers, layout = 2 * hosts, hosts_of_two(hosts)
    sent = settled_sends(workers, lambda k: lambda: run(k, False), passes=passes, hosts=layout)
    results, worlds = [], []
    for k in range(workers):
        with FakeComm(workers, k, hosts=layout) as world:
            world.hold_sent({r: by_name for r, by_name in sent.items() if r != k})
            results.append([np.asarray(t) for t in run(k, True)])
        worlds.append(world)
    return results, worlds


def test_peers_are_the_workers_at_one_place_in_every_host_of_one_size():
    with FakeComm(6, 3, hosts=hosts_of_two(3)):
        shards = HostShards.current()
        assert shards.peers.ranks == (1, 3, 5) and shards.peers.index == 1
        assert shards.host.ranks == (2, 3) and shards.host.index == 1
        assert shards.width(LENGTH) == 1078 and shards.bounds(LENGTH) == (1078, 2156)
    for hosts in ([(0, 1), (2,)], [(0, 1, 2, 3)], [(0,), (1,)]):  # unequal, one, of one
        with FakeComm(sum(map(len, hosts)), 0, hosts=hosts):
            assert HostShards.current() is None


@pytest.mark.parametrize("hosts", [2, 3])
def test_a_float_round_cut_in_host_shards_is_the_mean_on_every_worker_to_the_bit(hosts):
    values = host_values(hosts, seed=hosts)

    def run(k, _):
        return HostShards.current().average([tf.constant(v) for v in values[k // 2]], NAME)

    results, worlds = every_workers_round(hosts, run)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b)
    mean = np.mean([flat(v) for v in values], axis=0)
    np.testing.assert_allclose(flat(results[0]), mean, rtol=1e-6, atol=1e-6)
    # Across hosts a worker sends its half only; inside the host it gathers the other.
    (across,) = worlds[0].sent(f"{NAME}_shard")
    assert across.shape == (1078,)
    (gathered,) = worlds[0].sent(f"{NAME}_host_gather")
    assert gathered.shape == (1078,)


def exchanges(workers: int) -> list[CompressedExchange]:
    like = [tf.zeros(s) for s in SHAPES]
    return [CompressedExchange(like, "int8") for _ in range(workers)]


@pytest.mark.parametrize("hosts", [2, 3])
def test_an_int8_round_cut_in_host_shards_leaves_every_worker_on_the_same_bits(hosts):
    values, ex = host_values(hosts, seed=10 + hosts), exchanges(2 * hosts)

    def run(k, feedback):
        return ex[k].mean([tf.constant(v) for v in values[k // 2]], NAME, feedback=feedback,
                          shards=HostShards.current())

    results, worlds = every_workers_round(hosts, run)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b)
    mean = np.mean([flat(v) for v in values], axis=0)
    largest = max(np.abs(flat(v)).max() for v in values)
    assert 0 < np.abs(flat(results[0]) - mean).max() <= 2 * largest / 254
    # The alltoall among the peers carries a worker's half of the state, encoded.
    (rows,) = worlds[0].sent(f"{NAME}_scatter")
    assert rows.size == quantize.payload_bytes(1078, hosts, "int8")
    with FakeComm(2 * hosts, 0, hosts=hosts_of_two(hosts)):
        assert ex[0].payload_bytes(HostShards.current()) == rows.size
        assert rows.size < 0.55 * ex[0].payload_bytes()


def test_error_feedback_in_host_shards_keeps_each_workers_cut_of_its_own_shard_only():
    values, ex = host_values(2, seed=3), exchanges(4)

    def run(k, feedback):
        return ex[k].mean([tf.constant(v) for v in values[k // 2]], NAME, feedback=feedback,
                          shards=HostShards.current())

    results, _ = every_workers_round(2, run)
    for k in range(4):
        residual = ex[k].residual.numpy()
        start, stop = (0, 1078) if k % 2 == 0 else (1078, LENGTH)
        assert residual[start:stop].any()
        assert not residual[:start].any() and not residual[stop:].any()
    # What the round took is the hosts' mean but for the peers' mean cut, which each
    # value's peers alone hold (half of the 4 workers): nothing lost, only delayed.
    mean = np.mean([flat(v) for v in values], axis=0)
    owed = 2 * np.mean([ex[k].residual.numpy() for k in range(4)], axis=0)
    np.testing.assert_allclose(flat(results[0]), mean - owed, rtol=0, atol=1e-6)


@pytest.mark.parametrize("compression", ["none", "int8"])
def test_a_host_shard_round_gives_every_worker_the_mean_of_all_workers_statistics(compression):
    # A host's workers hold the same weights, but each updates its BatchNorm statistics
    # from its own batches: the round must average them over all W workers, not over one
    # worker a host.
    import keras

    from hvdtrain.keras.state import ModelStateAverager, read
    from workers.state_averaging_worker import batch_norm_model, set_statistics

    layout = hosts_of_two(2)
    models, averagers = [], []
    for rank in range(4):  # from one state, the last round's
        keras.utils.set_random_seed(0)
        models.append(batch_norm_model())
        with FakeComm(4, rank, hosts=layout):
            averagers.append(ModelStateAverager(models[rank], across_hosts=True,
                                                compression=compression))
    for rank, model in enumerate(models):
        for w in model.trainable_variables:  # one model a host
            w.assign(w + 0.01 * (rank // 2))
        set_statistics(model, np.full(3, 0.1 * (rank + 1)), np.full(3, 1.0 + 0.1 * rank))
    own = [read(a.variables) for a in averagers]
    # The statistics' mean in the host feeds an int8 round's alltoall, allgather and gather.
    results, _ = every_workers_round(2, lambda k, feedback: averagers[k].exchange(
        own[k], feedback=feedback), passes=4)
    mean_at = next(i for i, v in enumerate(averagers[0].variables) if "moving_mean" in v.path)
    var_at = next(i for i, v in enumerate(averagers[0].variables) if "moving_var" in v.path)
    means, variances = 0.1 * np.arange(1, 5), 1.0 + 0.1 * np.arange(4)
    pooled = np.mean(variances + means ** 2) - np.mean(means) ** 2
    # One worker a host would give 0.2 or 0.3; int8's two encodings are off by < 0.01 here.
    for result in results:
        np.testing.assert_allclose(result[mean_at], np.full(3, 0.25), atol=0.01)
        np.testing.assert_allclose(result[var_at], np.full(3, pooled), atol=0.01)
