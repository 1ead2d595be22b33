"""Real two-process Horovod jobs (horovodrun -np 2 --gloo) and what they must guarantee."""

from __future__ import annotations

import glob
import json
import os

import numpy as np
import pytest
import yaml

from conftest import horovodrun, load_rank_files
from helpers import runs_on_learnable_data, write_learnable_idx_dataset
from hvdtrain.rounds import quantize
from hvdtrain.config import load_config
from hvdtrain.rounds.averaging import expected_bytes_allreduced, sync_points
from hvdtrain.stats import per_batch_values

pytestmark = pytest.mark.multiprocess

LENET_TINY = dict(model="lenet", batch_size=16, epochs=1, steps_per_epoch=8, validate=False)
PLAIN_SGD = dict(LENET_TINY, momentum=0.0, warmup_epochs=0.0, lr_decay="constant")
RESNET_TINY = dict(model="resnet20", batch_size=8, epochs=1, steps_per_epoch=5, validate=False)
# Rounds in float32: local SGD with n_sync 1 and plain SGD is then large-batch SGD exactly
# (local mode's default, int8 rounds, only up to its encoding).
PLAIN_LOCAL = dict(PLAIN_SGD, mode="local", round_compression="none")
FLOAT32 = dict(round_compression="none")

RUNS = {
    "sync": dict(model="lenet", batch_size=16, epochs=2, steps_per_epoch=8),
    "plain_sync": dict(PLAIN_SGD),
    # 0.01 MB: every LeNet gradient but the smallest travels in a group of its own.
    "plain_sync_buckets": dict(PLAIN_SGD, bucket_mb=0.01),
    "plain_local1": dict(PLAIN_LOCAL, n_sync=1),
    "plain_local3": dict(PLAIN_LOCAL, n_sync=3),
    "plain_local_per_worker": dict(PLAIN_LOCAL, n_sync="6/workers"),  # 3 at 2
    # The quadratic synchronization rule: at a constant rate its base period; under a
    # cosine decay fewer rounds as the rate falls.
    "plain_local_qsr_constant": dict(PLAIN_LOCAL, n_sync="qsr:1"),
    "local_qsr_cosine": dict(PLAIN_LOCAL, n_sync="qsr:1", lr_decay="cosine"),
    # The period that follows the link: each rank times its own steps and rounds.
    "plain_local_link": dict(PLAIN_LOCAL, n_sync="link"),
    "slowmo_identity": dict(PLAIN_LOCAL, n_sync=3, outer_optimizer="slowmo",
                            outer_lr=1.0, outer_momentum=0.0),
    "slowmo_momentum": dict(PLAIN_LOCAL, n_sync=3, outer_optimizer="slowmo",
                            outer_momentum=0.5),
    # Two epochs of 7 and 6 steps of 32 (200 examples each): two fit calls; 4 warm steps.
    "mixed_local_warm": dict(LENET_TINY, steps_per_epoch=None, train_examples=200, epochs=2,
                             mode="local", n_sync=2, warm_start_steps=4, mixed_precision=True),
    # As above, with no warm start: rank 1's gradients overflow on steps of its own
    # (OVERFLOW), which its LossScaleOptimizer skips and does not count.
    "mixed_local_overflow": dict(LENET_TINY, steps_per_epoch=None, train_examples=200, epochs=2,
                                 mode="local", n_sync=2, mixed_precision=True),
    "resnet_sync": dict(RESNET_TINY),
    "resnet_local_warm": dict(RESNET_TINY, **FLOAT32, mode="local", n_sync=2, warm_start_steps=2),
    "resnet_local_single": dict(RESNET_TINY, **FLOAT32, mode="local", n_sync=2,
                                warm_start_steps=2, warm_start="single"),
    # Local mode's default rounds, int8, with BatchNorm and a warm start.
    "resnet_local_warm_int8": dict(RESNET_TINY, mode="local", n_sync=2, warm_start_steps=2),
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Every run in RUNS, trained once in a single two-worker job."""
    root = tmp_path_factory.mktemp("runs")
    runs = runs_on_learnable_data(root, RUNS)
    for run in runs:
        if run["name"] == "mixed_local_overflow":
            run["overflow"] = OVERFLOW
    data_dir = runs[0]["config"]["data_dir"]
    # Paine's warm start: local SGD from the weights the "sync" run (earlier in this job) saved.
    runs.append({"name": "warm_from_sync", "config": dict(
        PLAIN_SGD, steps_per_epoch=1, base_lr=1e-9, mode="local", n_sync=5, data_dir=data_dir,
        init_weights=str(root / "run-sync" / "model.weights.h5"), out=str(root / "run-warm"))})
    output = horovodrun("train_worker.py", str(root), json.dumps(runs), timeout=600)
    results = {}
    for name in [*RUNS, "warm_from_sync"]:
        ranks = load_rank_files(str(root), name)
        for r in ranks:
            r["summary"] = json.loads(str(r["summary"]))
            r["history"] = json.loads(str(r["history"]))
        results[name] = ranks
    return root, results, output


def _assert_same_on_both_ranks(ranks, key, atol=1e-6):
    np.testing.assert_allclose(ranks[0][key], ranks[1][key], rtol=0, atol=atol)


@pytest.mark.ci
@pytest.mark.long  # one job of 20 runs (or a failing one): about 2 minutes here, make test keeps the probe job
def test_a_one_worker_warm_start_logs_rank_0s_steps_then_the_mean(trained):
    root, results, _ = trained
    ranks = results["resnet_local_single"]  # 2 warm-start steps, then 3 local ones
    own = [per_batch_values(r["step_losses"].tolist()) for r in ranks]
    logged = [json.loads(line)["loss"]
              for line in (root / "run-resnet_local_single" / "steps.jsonl").read_text().splitlines()]
    assert len(logged) == 5
    # The other worker's warm-start steps are discarded, so the curve is rank 0's alone...
    assert logged[:2] == pytest.approx(own[0][:2], rel=1e-6)
    assert own[1][:2] != pytest.approx(own[0][:2], rel=1e-3)
    # ...and the mean of both once every worker's steps count.
    assert logged[2:] == pytest.approx([(a + b) / 2 for a, b in zip(own[0][2:], own[1][2:])],
                                       rel=1e-6)


# --- synchronous data parallelism (foundation) ---

@pytest.mark.ci
@pytest.mark.long  # one job of 20 runs (or a failing one): about 2 minutes here, make test keeps the probe job
def test_sync_training_leaves_identical_weights_on_all_ranks(trained):
    _, results, _ = trained
    _assert_same_on_both_ranks(results["sync"], "trainable", atol=0)


@pytest.mark.ci
@pytest.mark.long  # one job of 20 runs (or a failing one): about 2 minutes here, make test keeps the probe job
def test_each_rank_trains_on_its_own_disjoint_shard(trained):
    _, results, _ = trained
    shard0, shard1 = results["sync"][0]["shard"], results["sync"][1]["shard"]
    assert not set(shard0.tolist()) & set(shard1.tolist())
    assert sorted(np.concatenate([shard0, shard1]).tolist()) == list(range(512))


@pytest.mark.ci
@pytest.mark.long  # one job of 20 runs (or a failing one): about 2 minutes here, make test keeps the probe job
def test_epoch_metrics_are_averaged_so_all_ranks_agree(trained):
    _, results, _ = trained
    h0, h1 = results["sync"][0]["history"], results["sync"][1]["history"]
    assert set(h0) >= {"loss", "accuracy", "val_loss", "val_accuracy", "images_per_sec"}
    for key in h0:
        assert h0[key] == pytest.approx(h1[key], rel=1e-9), key


@pytest.mark.ci
@pytest.mark.long  # one job of 20 runs (or a failing one): about 2 minutes here, make test keeps the probe job
def test_only_rank_0_writes_the_run_folder_and_progress(trained):
    root, results, output = trained
    run = root / "run-sync"
    assert sorted(os.listdir(run)) == ["checkpoints", "config.yaml", "metrics.jsonl",
                                       "model.weights.h5", "plan.json", "steps.jsonl",
                                       "summary.json", "tensorboard"]
    # One writer: one line per epoch, one event file, no temporary files left behind.
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2] and [r["step"] for r in records] == [8, 16]
    for key in ("loss", "accuracy", "lr", "images_per_sec", "wall_seconds", "val_accuracy"):
        assert all(np.isfinite(r[key]) for r in records), key
    assert len(glob.glob(str(run / "tensorboard" / "train" / "events.*"))) == 1
    # One checkpoint per epoch (the default), each whole: no temporary folders left.
    assert sorted(os.listdir(run / "checkpoints")) == ["step-000000008", "step-000000016"]
    assert not glob.glob(str(run / "**" / ".tmp-*"), recursive=True)
    assert yaml.safe_load((run / "config.yaml").read_text())["out"] == str(run)
    assert "[0]<stdout>:Epoch 1/2" in output.stdout and "[1]<stdout>:Epoch" not in output.stdout
    # The plan the run trained by is the one `hvdtrain plan` gives for its options.
    from hvdtrain.config import load_saved_config
    from hvdtrain.plan import Job, settle

    saved = json.loads((run / "plan.json").read_text())
    expected = settle(load_saved_config(str(run / "config.yaml")), Job(2, 1)).to_dict()
    assert {k: v for k, v in saved.items() if k != "optimizer_reason"} == \
        {k: v for k, v in expected.items() if k != "optimizer_reason"}
    assert "[0]<stdout>:hvdtrain: plan: sync mode, 2 workers" in output.stdout


@pytest.mark.ci
@pytest.mark.long  # one job of 20 runs (or a failing one): about 2 minutes here, make test keeps the probe job
@pytest.mark.parametrize("name", ["sync", "plain_local3"])
def test_step_log_holds_every_step_averaged_over_workers(trained, name):
    root, results, _ = trained
    steps = [json.loads(line) for line in (root / f"run-{name}" / "steps.jsonl").read_text().splitlines()]
    epochs = [json.loads(line) for line in (root / f"run-{name}" / "metrics.jsonl").read_text().splitlines()]
    per_epoch = len(steps) // len(epochs)
    assert [s["step"] for s in steps] == list(range(1, len(steps) + 1)) and per_epoch == 8
    assert all(0.0 <= s["error"] <= 1.0 and np.isfinite(s["loss"]) for s in steps)
    walls = [s["wall_seconds"] for s in steps]
    assert walls == sorted(walls) and walls[0] > 0
    # Each epoch's steps average to the epoch's (worker-averaged) loss and accuracy.
    for i, epoch in enumerate(epochs):
        chunk = steps[i * per_epoch:(i + 1) * per_epoch]
        assert np.mean([s["loss"] for s in chunk]) == pytest.approx(epoch["loss"], rel=1e-4)
        assert 1 - np.mean([s["error"] for s in chunk]) == pytest.approx(epoch["accuracy"], abs=1e-4)


@pytest.mark.ci
@pytest.mark.long  # one job of 20 runs (or a failing one): about 2 minutes here, make test keeps the probe job
def test_summary_reports_the_run(trained):
    root, results, _ = trained
    summary = json.loads((root / "run-sync" / "summary.json").read_text())
    # Lists aside (approx takes flat dicts): in step, every worker took the run's steps.
    assert summary.pop("steps_per_worker") == [16, 16]
    expected = dict(results["sync"][0]["summary"])
    expected.pop("steps_per_worker")
    assert summary == pytest.approx(expected)
    assert summary["workers"] == 2 and summary["global_batch"] == 32 and summary["mode"] == "sync"
    assert summary["epochs"] == 2 and summary["total_steps"] == 16
    assert 0.0 <= summary["test_accuracy"] <= 1.0 and summary["images_per_sec"] > 0
    # Every step averaged every gradient: 61,706 float32 parameters.
    assert summary["gradient_steps_averaged"] == 16 and summary["averaging_rounds"] == 0
    assert summary["bytes_allreduced"] == 16 * 61_706 * 4
    assert summary["round_seconds"] == 0.0  # no state-averaging rounds in sync mode


@pytest.mark.ci
@pytest.mark.long  # one job of 20 runs (or a failing one): about 2 minutes here, make test keeps the probe job
def test_mixed_precision_local_sgd_averages_gradients_in_the_warm_start_only(trained):
    _, results, _ = trained
    ranks = results["mixed_local_warm"]
    _assert_same_on_both_ranks(ranks, "trainable", atol=0)
    summary = ranks[0]["summary"]
    assert summary["total_steps"] == 13
    assert summary["gradient_steps_averaged"] == 4  # the warm start's, not all 13


OVERFLOW = {"rank": 1, "steps": [1, 2, 5]}   # all in the first fit's 7 steps


@pytest.mark.ci
@pytest.mark.long  # one job of 20 runs (or a failing one): about 2 minutes here, make test keeps the probe job
def test_steps_skipped_for_overflow_on_one_rank_move_no_rounds(trained):
    """The two epochs of 7 and 6 steps take two fits. Rank 1's optimizer skips three
    updates of the first; the second fit still starts both ranks at step 7, so their
    rounds fall at the same steps and the run ends in consensus."""
    _, results, _ = trained
    ranks = results["mixed_local_overflow"]
    assert [int(r["overflow_skipped"]) for r in ranks] == [0, 3]
    summaries = [r["summary"] for r in ranks]
    assert [s["total_steps"] for s in summaries] == [13, 13]
    # A round after every 2nd step (6), and one at each epoch's end (after steps 7 and 13).
    assert [s["averaging_rounds"] for s in summaries] == [8, 8]
    assert [int(r["optimizer_step"]) for r in ranks] == [13, 13]
    _assert_same_on_both_ranks(ranks, "trainable", atol=0)


@pytest.mark.ci
@pytest.mark.long  # one job of 20 runs (or a failing one): about 2 minutes here, make test keeps the probe job
def test_rank_0s_state_is_broadcast_once_per_run_not_once_per_fit(trained):
    _, results, _ = trained
    # Weights and momentum of 61,706 float32 parameters, plus a few optimizer scalars:
    # once, though the two epochs of 7 and 6 steps took two fit calls.
    state = 2 * 61_706 * 4
    for name in ("sync", "mixed_local_warm"):
        sent = results[name][0]["summary"]["bytes_broadcast"]
        assert state <= sent < state + 1024, name


@pytest.mark.ci
@pytest.mark.long  # one job of 20 runs (or a failing one): about 2 minutes here, make test keeps the probe job
def test_gradient_groups_change_how_gradients_travel_not_what_is_learned(trained):
    _, results, _ = trained
    _assert_same_on_both_ranks(results["plain_sync_buckets"], "trainable", atol=0)
    np.testing.assert_allclose(results["plain_sync_buckets"][0]["trainable"],
                               results["plain_sync"][0]["trainable"], rtol=1e-5, atol=1e-7)
    assert results["plain_sync_buckets"][0]["summary"]["bytes_allreduced"] == \
        results["plain_sync"][0]["summary"]["bytes_allreduced"]


@pytest.mark.ci
@pytest.mark.long  # one job of 20 runs (or a failing one): about 2 minutes here, make test keeps the probe job
def test_sync_mode_averages_batchnorm_statistics_at_epoch_end(trained):
    _, results, _ = trained
    _assert_same_on_both_ranks(results["resnet_sync"], "trainable", atol=0)
    _assert_same_on_both_ranks(results["resnet_sync"], "non_trainable")
    assert results["resnet_sync"][0]["non_trainable"].size > 0


# --- local SGD ---

@pytest.mark.ci
@pytest.mark.long  # one job of 20 runs (or a failing one): about 2 minutes here, make test keeps the probe job
def test_local_sgd_with_n_sync_1_matches_synchronous_sgd(trained):
    _, results, _ = trained
    sync, local = results["plain_sync"][0]["trainable"], results["plain_local1"][0]["trainable"]
    np.testing.assert_allclose(local, sync, rtol=1e-4, atol=1e-6)
    _assert_same_on_both_ranks(results["plain_local1"], "trainable")
    # ...and local SGD with n_sync 3 really is a different algorithm.
    assert np.abs(results["plain_local3"][0]["trainable"] - sync).max() > 1e-5


@pytest.mark.ci
@pytest.mark.long  # one job of 20 runs (or a failing one): about 2 minutes here, make test keeps the probe job
def test_a_period_per_worker_trains_as_the_number_it_comes_to(trained):
    _, results, _ = trained
    ranks = results["plain_local_per_worker"]
    np.testing.assert_array_equal(ranks[0]["trainable"], results["plain_local3"][0]["trainable"])
    _assert_same_on_both_ranks(ranks, "trainable", atol=0)
    assert (ranks[0]["summary"]["n_sync"], ranks[0]["summary"]["n_sync_rule"]) == (3, "6/workers")
    assert ranks[0]["summary"]["averaging_rounds"] == 3


@pytest.mark.ci
@pytest.mark.long  # one job of 20 runs (or a failing one): about 2 minutes here, make test keeps the probe job
def test_a_rate_following_period_rounds_at_its_base_while_the_rate_holds_and_less_as_it_falls(
        trained):
    _, results, _ = trained
    constant = results["plain_local_qsr_constant"]
    np.testing.assert_array_equal(constant[0]["trainable"], results["plain_local1"][0]["trainable"])
    assert constant[0]["summary"]["averaging_rounds"] == 8
    decaying = results["local_qsr_cosine"]
    _assert_same_on_both_ranks(decaying, "trainable", atol=0)
    # 8 steps from the peak: rounds after steps 1 to 4, then 6, then the epoch's end at 8.
    assert decaying[0]["summary"]["averaging_rounds"] == 6


@pytest.mark.ci
@pytest.mark.long  # one job of 20 runs (or a failing one): about 2 minutes here, make test keeps the probe job
def test_a_period_that_follows_the_link_leaves_both_ranks_alike_on_real_collectives(trained):
    root, results, _ = trained
    ranks = results["plain_local_link"]
    _assert_same_on_both_ranks(ranks, "trainable", atol=0)
    assert ranks[0]["summary"]["n_sync"] == "link"
    assert 2 <= ranks[0]["summary"]["averaging_rounds"] <= 8   # a round after step 2 and 8
    epoch = json.loads((root / "run-plain_local_link" / "metrics.jsonl").read_text()
                       .splitlines()[-1])
    assert 1 <= epoch["n_sync"] <= 8                             # the period in force


@pytest.mark.ci
@pytest.mark.long  # one job of 20 runs (or a failing one): about 2 minutes here, make test keeps the probe job
def test_slowmo_with_alpha_1_beta_0_matches_plain_local_sgd(trained):
    _, results, _ = trained
    np.testing.assert_allclose(results["slowmo_identity"][0]["trainable"],
                               results["plain_local3"][0]["trainable"], rtol=1e-4, atol=1e-6)
    momentum = results["slowmo_momentum"]
    _assert_same_on_both_ranks(momentum, "trainable")
    assert np.abs(momentum[0]["trainable"] - results["plain_local3"][0]["trainable"]).max() > 1e-5


@pytest.mark.ci
@pytest.mark.long  # one job of 20 runs (or a failing one): about 2 minutes here, make test keeps the probe job
def test_local_sgd_counts_rounds_and_bytes(trained):
    _, results, _ = trained
    gradient_bytes = 61_706 * 4
    summary = results["plain_local3"][0]["summary"]
    assert summary["averaging_rounds"] == len(sync_points(8, 8, 3)) == 3
    assert summary["round_seconds"] > 0.0  # the rounds' time is counted
    assert summary["bytes_allreduced"] == expected_bytes_allreduced(
        "local", 8, 8, 3, 0, gradient_bytes, gradient_bytes, 0)
    assert results["plain_sync"][0]["summary"]["bytes_allreduced"] == 8 * gradient_bytes


@pytest.mark.ci
@pytest.mark.long  # one job of 20 runs (or a failing one): about 2 minutes here, make test keeps the probe job
@pytest.mark.parametrize("name, warm_start, gradient_steps, compression", [
    ("resnet_local_warm", "sync", 2, "none"),      # post-local SGD
    ("resnet_local_single", "single", 0, "none"),  # Paine's one-worker warm start
    ("resnet_local_warm_int8", "sync", 2, "int8"),  # local mode's default rounds
])
def test_local_sgd_with_batchnorm_and_a_warm_start_ends_in_consensus(trained, name, warm_start,
                                                                     gradient_steps, compression):
    _, results, _ = trained
    ranks = results[name]
    _assert_same_on_both_ranks(ranks, "trainable")
    _assert_same_on_both_ranks(ranks, "non_trainable")
    summary = ranks[0]["summary"]
    # 5 steps: warm for 2, then rounds at 4 (n_sync 2) and 5 (epoch end), plus the hand-over at 2.
    assert summary["averaging_rounds"] == len(sync_points(5, 5, 2, 2)) == 3
    assert summary["gradient_steps_averaged"] == gradient_steps
    # Rounds move weights and BatchNorm statistics (each worker keeps its momentum by
    # default), in float32 or as int8 codes and scales; a sync warm start adds gradients.
    gradient_bytes = ranks[0]["trainable"].size * 4
    values = ranks[0]["trainable"].size + ranks[0]["non_trainable"].size
    state_bytes = 4 * values if compression == "none" else \
        quantize.payload_bytes(values, 2, compression)
    assert summary["bytes_allreduced"] == expected_bytes_allreduced(
        "local", 5, 5, 2, 2, gradient_bytes, state_bytes, 0, warm_start=warm_start)


@pytest.mark.ci
@pytest.mark.long  # one job of 20 runs (or a failing one): about 2 minutes here, make test keeps the probe job
def test_init_weights_start_every_rank_from_a_saved_model(trained):
    _, results, _ = trained
    for rank in results["warm_from_sync"]:
        # One step at a negligible rate: the weights are still the loaded ones.
        np.testing.assert_allclose(rank["trainable"], results["sync"][0]["trainable"], atol=1e-6)


# --- the Keras callback in a user's own model.fit ---

@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    root = tmp_path_factory.mktemp("probe")
    horovodrun("local_sgd_probe.py", str(root))
    return load_rank_files(str(root), "probe")


@pytest.mark.parametrize("warm_start", ["sync", "single"])
def test_all_ranks_identical_right_after_every_sync_and_different_between(probe, warm_start):
    w0, w1 = probe[0][f"{warm_start}_after"], probe[1][f"{warm_start}_after"]
    points = set(probe[0]["sync_points"].tolist())
    warm = 2
    for step in range(1, len(w0) + 1):
        gap = np.abs(w0[step - 1] - w1[step - 1]).max()
        if step in points:
            assert gap <= 1e-6, f"step {step} is a sync point but ranks differ by {gap}"
        elif step > warm or warm_start == "single":
            assert gap > 1e-4, f"step {step} is local but ranks agree"
    assert int(probe[0][f"{warm_start}_rounds"]) == len(points)
    # Gradients are averaged only during a synchronous warm start.
    assert int(probe[0][f"{warm_start}_averaged_steps"]) == (warm if warm_start == "sync" else 0)


def test_one_worker_warm_start_hands_rank_0s_own_weights_to_everyone(probe):
    warm = 2
    rank0_before = probe[0]["single_before"][warm - 1]
    for rank in probe:
        # A sum with the others' zeros: rank 0's weights arrive bit for bit.
        np.testing.assert_array_equal(rank["single_after"][warm - 1], rank0_before)
    assert np.abs(probe[1]["single_before"][warm - 1] - rank0_before).max() > 1e-4


def test_metric_average_gives_every_rank_the_mean(probe):
    for rank in probe:
        assert json.loads(str(rank["averaged_logs"])) == {"loss": 1.5, "accuracy": 0.25}
    for warm_start in ("sync", "single"):
        assert json.loads(str(probe[0][f"{warm_start}_history"])) == \
            json.loads(str(probe[1][f"{warm_start}_history"]))


def test_without_epoch_rounds_evaluations_see_the_average_and_training_never_notices(probe):
    """epoch_rounds=False: epochs of 3 steps, evaluated at each end, with rounds every 5
    steps train to the same weights, bit for bit, as one epoch of 12 steps; each
    evaluation saw the workers' average, and with epoch rounds the weights differ."""
    own = [rank["view_own"] for rank in probe]
    for rank in probe:
        assert len(rank["view_shown"]) == 4  # one evaluation per epoch
        np.testing.assert_allclose(rank["view_shown"], np.mean(own, axis=0), atol=1e-6)
    assert np.abs(own[0] - own[1]).max() > 1e-4  # the workers did differ there
    for rank in probe:
        np.testing.assert_array_equal(rank["view_cut"], rank["view_whole"])
        np.testing.assert_array_equal(rank["view_cut"], probe[0]["view_cut"])  # consensus
        assert np.abs(rank["view_with_rounds"] - rank["view_whole"]).max() > 1e-4
    # After steps 5 and 10, and the end's (12); with epoch rounds also after 3, 6 and 9.
    assert int(probe[0]["view_cut_rounds"]) == int(probe[0]["view_whole_rounds"]) == 3
    assert int(probe[0]["view_with_rounds_rounds"]) == 6


# --- failures and the command line ---

@pytest.mark.long  # 14 s, most of it the late worker's deliberate wait
def test_throughput_is_the_jobs_examples_over_the_jobs_span_when_a_worker_starts_late(tmp_path):
    late = 3.0
    horovodrun("throughput_worker.py", str(tmp_path), str(late))
    ranks = [json.loads((tmp_path / f"throughput-rank{r}.json").read_text()) for r in (0, 1)]
    # Every worker's images after its first batch, over the job's span: from the first
    # first-batch end to the last epoch end, which the meter reads after the epoch-end
    # round, so after the last batch's end, and before the workers' callbacks that follow
    # it (the metrics' and the step log's exchanges come between).
    images = sum((len(r["ends"]) - 1) * r["batch"] for r in ranks)
    first = min(r["ends"][0] for r in ranks)
    to_last_batch = max(r["ends"][-1] for r in ranks) - first
    to_epoch_end = max(r["epoch_ends"][-1] for r in ranks) - first
    assert to_last_batch > late  # rank 0 was done before rank 1 began
    # Each worker's own span claimed for the job's images: what was reported before.
    inflated = sum(images / (r["ends"][-1] - r["ends"][0]) for r in ranks) / 2
    for rank in ranks:
        assert images / to_epoch_end * 0.99 <= rank["logged"][0] <= images / to_last_batch * 1.01
        assert rank["summary"]["images_per_sec"] == pytest.approx(rank["logged"][0])
        assert rank["summary"]["images_per_sec"] < inflated / 2


@pytest.mark.long  # one job of 20 runs (or a failing one): about 2 minutes here, make test keeps the probe job
def test_a_failing_worker_ends_the_whole_job(tmp_path):
    result = horovodrun("crash_worker.py", timeout=180, check=False)
    assert result.returncode != 0
    assert "allreduce completed" not in result.stdout


@pytest.mark.ci
@pytest.mark.long  # a two-worker CLI job of 30 seconds here
def test_cli_two_workers_learn_fashion_mnist_subset(tmp_path):
    data_dir = "/usr/share/datasets/fashion-mnist"
    if not os.path.isdir(data_dir):  # the install step puts it there; fall back to our own files
        data_dir = write_learnable_idx_dataset(str(tmp_path / "data"), train=8000, test=1000)
    out = tmp_path / "run"
    horovodrun("hvdtrain", "train", "--data-dir", data_dir, "--train-examples", "8000",
               "--epochs", "1", "--out", str(out), "--pin-cores", timeout=300)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["workers"] == 2
    assert summary["test_accuracy"] > 0.6  # chance is 0.1
    # Each of the two workers on this machine kept to its own half of the cores.
    assert summary["cores_per_worker"] == len(os.sched_getaffinity(0)) // 2


@pytest.mark.long  # two jobs of 512 a worker: about 25 seconds here
def test_the_default_optimizer_takes_lamb_at_a_global_batch_of_1024_and_the_run_records_it(
        tmp_path):
    data_dir = write_learnable_idx_dataset(str(tmp_path / "data"), train=2048, test=64)
    out = tmp_path / "run"
    result = horovodrun("hvdtrain", "train", "--data-dir", data_dir, "--batch-size", "512",
                        "--epochs", "1", "--steps-per-epoch", "2", "--no-validate",
                        "--out", str(out), timeout=300)
    notices = [line for line in result.stdout.splitlines() if "--optimizer auto took" in line]
    assert len(notices) == 1 and "took lamb" in notices[0]  # rank 0 alone says it
    assert sum("hvdtrain: plan: optimizer lamb: --optimizer auto takes LAMB" in line
               for line in result.stdout.splitlines()) == 1
    saved = load_config(str(out / "config.yaml"))
    assert (saved.optimizer, saved.max_lr) == ("lamb", 0.03)
    # Flat local mode takes LAMB there too, with rescaled rounds every step at sync's cap.
    local = tmp_path / "local"
    horovodrun("hvdtrain", "train", "--data-dir", data_dir, "--batch-size", "512", "--mode",
               "local", "--epochs", "1", "--steps-per-epoch", "2", "--no-validate",
               "--out", str(local), timeout=300)
    saved = load_config(str(local / "config.yaml"))
    assert (saved.optimizer, saved.max_lr, saved.n_sync, saved.rescale_rounds) == (
        "lamb", 0.03, 1, True)
    summary = json.loads((local / "summary.json").read_text())
    assert (summary["averaging_rounds"], summary["n_sync"]) == (2, 1)


# --- ImageNet-scale models on ImageNet-format data (small images) ---

@pytest.fixture(scope="module")
def imagenet_trained(tmp_path_factory):
    from hvdtrain.data.to_tfrecords import convert
    from helpers import write_image_folder

    root = tmp_path_factory.mktemp("imagenet")
    convert(write_image_folder(str(root / "folder")), str(root / "records"), train_shards=4)
    common = dict(dataset="imagenet", data_dir=str(root / "records"), image_size=32,
                  batch_size=4, epochs=1, validate=False)
    runs = [
        {"name": "alexnet", "config": dict(common, model="alexnet", steps_per_epoch=2,
                                           fp16_allreduce=True, out=str(root / "run-alexnet"))},
        {"name": "resnet50", "config": dict(common, model="resnet50", steps_per_epoch=3, mode="local",
                                            n_sync=2, out=str(root / "run-resnet50"))},
    ]
    horovodrun("train_worker.py", str(root), json.dumps(runs), timeout=600)
    results = {}
    for run in runs:
        ranks = load_rank_files(str(root), run["name"])
        for r in ranks:
            r["summary"] = json.loads(str(r["summary"]))
        results[run["name"]] = ranks
    return results


@pytest.mark.long  # their one job (AlexNet, then ResNet-50) takes a minute: kept out of make test
def test_alexnet_trains_on_two_workers_with_fp16_allreduce(imagenet_trained):
    ranks = imagenet_trained["alexnet"]
    _assert_same_on_both_ranks(ranks, "trainable", atol=0)
    summary = ranks[0]["summary"]
    assert summary["parameters"] == ranks[0]["trainable"].size
    # float16 on the wire: 2 bytes per parameter per step.
    assert summary["bytes_allreduced"] == 2 * 2 * summary["parameters"]
    # Two workers, file-sharded: each trained on 2 of the 4 train files.
    assert not set(ranks[0]["shard"].tolist()) & set(ranks[1]["shard"].tolist())


@pytest.mark.long
def test_resnet50_local_sgd_on_two_workers_ends_in_consensus(imagenet_trained):
    ranks = imagenet_trained["resnet50"]
    _assert_same_on_both_ranks(ranks, "trainable")
    _assert_same_on_both_ranks(ranks, "non_trainable")
    assert ranks[0]["summary"]["averaging_rounds"] == len(sync_points(3, 3, 2)) == 2
    assert np.isfinite(ranks[0]["summary"]["test_loss"])
