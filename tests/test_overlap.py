"""Overlapped averaging rounds (`--mode async`, `LocalSGD(overlap=True)`) on two real ranks."""

import numpy as np
import pytest

from conftest import horovodrun, load_rank_files
from hvdtrain.rounds.averaging import delayed_average_update
from hvdtrain.config import load_config
from hvdtrain.errors import ConfigError


def test_the_update_is_the_stale_mean_plus_the_progress_since_the_snapshot():
    current, snapshot, mean = np.array([3.0, 1.0]), np.array([2.0, 2.0]), np.array([1.5, 0.0])
    np.testing.assert_array_equal(delayed_average_update(current, snapshot, mean), [2.5, -1.0])
    # No progress since the snapshot: the plain average.
    np.testing.assert_array_equal(delayed_average_update(snapshot, snapshot, mean), mean)


@pytest.mark.parametrize("overrides, message", [
    (dict(outer_optimizer="slowmo"), "--mode async takes the plain average: --outer-optimizer slowmo"),
])
def test_what_async_cannot_do_is_refused_in_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, dict(mode="async", **overrides))


def test_async_checkpoints_every_n_steps_and_commits_elastically_at_blocking_rounds():
    from hvdtrain.training.build import save_plan
    cfg = load_config(None, dict(mode="async", checkpoint_every="500", elastic=True,
                                 elastic_commit_every=30, out="runs/x"))
    assert save_plan(cfg).step_intervals == (500, 30)
    cfg = load_config(None, dict(mode="async", checkpoint_every="2epochs"))
    assert save_plan(cfg).step_intervals == ()


def test_local_mode_options_apply_to_async():
    cfg = load_config(None, dict(mode="async", n_sync=50, warm_start_steps=20))
    assert (cfg.n_sync, cfg.warm_start_steps) == (50, 20)
    with pytest.raises(ConfigError, match="--warm-start-steps needs --mode local or async"):
        load_config(None, dict(mode="sync", warm_start_steps=20))


# The worker's model: Dense (kernel, bias), BatchNorm (gamma, beta), Dense (kernel, bias)
# are the trainable weights; the moving mean and variance follow.
TRAINABLE, MOVING_MEAN, MOVING_VARIANCE = 6, 6, 7


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("overlap")
    horovodrun("overlap_worker.py", str(root))
    return {stem: load_rank_files(str(root), stem) for stem in ("rule", "rule_fp16", "fit")}


def _means(snapshots):
    """What a round gives for each variable: the mean, and the pooled BatchNorm variance."""
    means = [(snapshots[0][i] + snapshots[1][i]) * np.float32(0.5)
             for i in range(len(snapshots[0]))]
    mu = [s[MOVING_MEAN].astype(np.float64) for s in snapshots]
    means[MOVING_VARIANCE] = np.mean([s[MOVING_VARIANCE] + m ** 2 for s, m in zip(snapshots, mu)],
                                     axis=0) - np.mean(mu, axis=0) ** 2
    return means


@pytest.mark.ci
@pytest.mark.long  # their job takes 30 seconds here
@pytest.mark.multiprocess
@pytest.mark.parametrize("stem, tolerance", [("rule", 2e-7), ("rule_fp16", 3e-5)])
def test_a_round_gives_each_rank_the_mean_of_the_snapshots_plus_its_own_progress(
        results, stem, tolerance):
    ranks = results[stem]
    means = _means([r["snapshot"] for r in ranks])
    if stem == "rule":  # pooling is not plain averaging here: the ranks' BatchNorm means differ
        plain = (ranks[0]["snapshot"][MOVING_VARIANCE] + ranks[1]["snapshot"][MOVING_VARIANCE]) / 2
        assert np.abs(means[MOVING_VARIANCE] - plain).max() > 0.1
    for i, mean in enumerate(means):
        for r in ranks:
            expected = mean + (r["before"][i] - r["snapshot"][i])
            np.testing.assert_allclose(r["after"][i], expected, rtol=0,
                                       atol=tolerance * (5 if i == MOVING_VARIANCE else 1),
                                       err_msg=f"{stem}, variable {i}")
    # The ranks stay apart by their own progress.
    assert not np.array_equal(ranks[0]["after"][0], ranks[1]["after"][0])


@pytest.mark.ci
@pytest.mark.long  # their job takes 30 seconds here
@pytest.mark.multiprocess
def test_with_fp16_the_reference_stays_common_so_a_blocking_round_agrees(results):
    ranks = results["rule_fp16"]
    for a, b in zip(ranks[0]["blocking_after"], ranks[1]["blocking_after"]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.ci
@pytest.mark.long  # their job takes 30 seconds here
@pytest.mark.multiprocess
def test_the_distance_is_each_ranks_snapshot_weights_from_their_mean(results):
    ranks = results["rule"]
    for r, other in ((ranks[0], ranks[1]), (ranks[1], ranks[0])):
        squared = sum(np.sum(((r["snapshot"][i] - other["snapshot"][i]) / 2.0) ** 2)
                      for i in range(TRAINABLE))
        assert float(r["distance"]) == pytest.approx(np.sqrt(squared), rel=1e-5)


@pytest.mark.ci
@pytest.mark.long  # their job takes 30 seconds here
@pytest.mark.multiprocess
def test_inside_fit_a_round_applied_later_adds_the_mean_minus_the_snapshot(results):
    ranks = results["fit"]
    # Step 3's round is taken at step 6: LocalSGD's hook moves each rank by mean(s) - s.
    snapshots = [[v for v in r["after"][2]] for r in ranks]   # the state after step 3
    means = _means(snapshots)
    for r, snapshot in zip(ranks, snapshots):
        for i in range(TRAINABLE):
            moved = r["after"][5][i].astype(np.float64) - r["before"][5][i]
            np.testing.assert_allclose(moved, means[i] - snapshot[i], rtol=0, atol=1e-6,
                                       err_msg=f"variable {i}")
    # Between rounds the ranks train apart.
    assert not np.array_equal(ranks[0]["after"][4][0], ranks[1]["after"][4][0])


@pytest.mark.ci
@pytest.mark.long  # their job takes 30 seconds here
@pytest.mark.multiprocess
@pytest.mark.parametrize("prefix", ["", "aligned_"])
def test_every_epoch_ends_in_consensus_after_metric_averaging_with_a_round_in_flight(
        results, prefix):
    # Reaching the epoch ends at all shows there was no deadlock with MetricAverage,
    # which ran first, while a round was in flight.
    ranks = results["fit"]
    for epoch in range(2):
        for a, b in zip(ranks[0][prefix + "epoch_states"][epoch],
                        ranks[1][prefix + "epoch_states"][epoch]):
            np.testing.assert_array_equal(a, b)


@pytest.mark.ci
@pytest.mark.long  # their job takes 30 seconds here
@pytest.mark.multiprocess
@pytest.mark.parametrize("prefix, rounds, log", [
    # n_sync 3: steps 3, 6, 9, 12, 15, 18 start rounds; the epoch ends 10 and 20 block.
    ("", 8, [4, 8]),
    # n_sync 5: rounds start at 5, 10, 15, 20; those at the epoch ends are applied there
    # at once and need no blocking round after them.
    ("aligned_", 4, [2, 4]),
])
def test_rounds_and_bytes_count_every_exchange(results, prefix, rounds, log):
    for r in results["fit"]:
        assert int(r[prefix + "rounds"]) == rounds
        assert int(r[prefix + "state_bytes"]) == rounds * int(r[prefix + "payload_bytes"])
        assert list(r[prefix + "averaging_rounds_log"]) == log
