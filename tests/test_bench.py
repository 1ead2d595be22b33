"""`hvdtrain bench`: the arithmetic (pure) and one real run of the command."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time

import pytest

from hvdtrain.benchmarks.scaling import (add_scaling, combine_repeats, communication_share,
                                         exchanges_in, overhead_against_reference,
                                         ratios_to_reference, rounded_steps,
                                         window_rates, worker_throughput)
from hvdtrain.cli import main


def test_window_rates_are_images_over_time_per_window():
    seconds = [0.1] * 10 + [0.2] * 10 + [0.5] * 3  # the short last window is dropped
    assert window_rates(seconds, 10, 32) == pytest.approx([320.0, 160.0])
    assert window_rates([0.5, 0.5], 10, 32) == pytest.approx([64.0])  # one short window stays
    with pytest.raises(ValueError):
        window_rates(seconds, 0, 32)


def test_worker_throughput_sums_workers_and_weighs_slow_steps_in_full():
    fast = [0.1] * 20
    # One slow step (an averaging round) in each window of ten.
    with_rounds = ([0.1] * 9 + [1.0]) * 2
    result = worker_throughput([fast, with_rounds], 10, 10)
    per_second = [200 / 2.0, 200 / 3.8]  # images over seconds, whole stretch
    assert result["total_images_per_sec"] == pytest.approx(sum(per_second))
    assert result["per_worker_images_per_sec"] == pytest.approx(sum(per_second) / 2)
    assert result["worker_images_per_sec"] == pytest.approx(per_second)
    # Identical windows: no spread, a zero-width interval.
    assert result["total_ci95"] == pytest.approx(0.0, abs=1e-9)
    assert result["step_seconds"] == pytest.approx(5.8 / 40)


def test_local_steps_round_up_to_whole_periods_and_count_their_exchanges():
    assert rounded_steps(50, 100) == 100 and rounded_steps(50, 10) == 50
    assert rounded_steps(50, None) == 50
    # Steps 11..110 hold the rounds at 20, 30, ..., 110.
    assert exchanges_in("local", 11, 100, 10, workers=2) == 10
    assert exchanges_in("local", 11, 100, 100, workers=2) == 1
    assert exchanges_in("sync", 11, 100, None, workers=2) == 100
    assert exchanges_in("horovod", 11, 100, None, workers=2) == 100
    assert exchanges_in("independent", 11, 100, None, workers=2) == 0
    assert exchanges_in("sync", 11, 100, None, workers=1) == 0


def test_communication_share_is_timed_exchanges_over_step_time():
    assert communication_share(0.002, 50, 50, 0.010) == pytest.approx(0.2)
    assert communication_share(0.002, 5, 50, 0.010) == pytest.approx(0.02)
    assert communication_share(0.5, 50, 50, 0.010) == 1.0  # never more than the whole step
    assert communication_share(0.002, 0, 50, 0.010) == 0.0


def test_repeats_combine_into_their_mean_with_an_interval_from_their_spread():
    base = dict(workers=2, step_seconds=0.1, seconds_per_exchange=0.01, communication_share=0.1,
                total_ci95=1.0, per_worker_ci95=0.5)
    rows = [dict(base, total_images_per_sec=r, per_worker_images_per_sec=r / 2,
                 worker_images_per_sec=[r * 0.6, r * 0.4], worker_timed_steps=[s, s // 2])
            for r, s in ((100.0, 40), (110.0, 44), (120.0, 48))]
    combined = combine_repeats(rows)
    assert combined["total_images_per_sec"] == pytest.approx(110.0)
    assert combined["per_worker_images_per_sec"] == pytest.approx(55.0)
    assert combined["worker_images_per_sec"] == pytest.approx([66.0, 44.0])  # rank by rank
    assert combined["worker_timed_steps"] == pytest.approx([44.0, 22.0])
    assert combined["total_ci95"] == pytest.approx(4.303 * 10 / 3 ** 0.5)  # t(2) · sd / √n
    assert combined["repeats"] == 3 and combined["repeat_images_per_sec"] == [100.0, 110.0, 120.0]
    assert combine_repeats(rows[:1]) == dict(rows[0], repeats=1)


def _row(mode, workers, rate, n_sync=None):
    return dict(model="lenet", batch_per_worker=64, mode=mode, n_sync=n_sync, workers=workers,
                total_images_per_sec=rate)


def test_scaling_compares_each_setup_with_its_own_fewest_workers():
    rows = add_scaling([_row("sync", 1, 100.0), _row("sync", 2, 150.0), _row("sync", 4, 360.0),
                        _row("local", 2, 180.0, n_sync=10), _row("local", 4, 300.0, n_sync=10)])
    assert [r["speedup"] for r in rows] == pytest.approx([1.0, 1.5, 3.6, 1.0, 300 / 180])
    assert [r["efficiency"] for r in rows] == pytest.approx([1.0, 0.75, 0.9, 1.0, 300 / 180 / 2])


def test_overhead_is_the_reference_rate_over_hvdtrains_minus_one():
    rows = [_row("sync", 1, 100.0), _row("horovod", 1, 102.0), _row("sync", 2, 180.0),
            _row("horovod", 2, 171.0), _row("local", 2, 190.0, n_sync=10), _row("sync", 4, 1.0)]
    overhead = overhead_against_reference(rows)
    assert list(overhead) == [1, 2]
    assert overhead[1] == pytest.approx((0.02, 0.0)) and overhead[2] == pytest.approx((-0.05, 0.0))


def test_each_sync_bucket_setup_is_paired_with_the_reference_repeat_by_repeat():
    rows = [dict(_row("sync", 2, 150.0), label="sync", repeat_images_per_sec=[200.0, 100.0]),
            dict(_row("sync", 2, 150.0), label="sync, buckets 25",
                 repeat_images_per_sec=[180.0, 95.0]),
            dict(_row("horovod", 2, 150.0), label="horovod", repeat_images_per_sec=[200.0, 100.0])]
    ratios = ratios_to_reference(rows)
    assert ratios[(2, "sync")] == pytest.approx((1.0, 0.0))
    assert ratios[(2, "sync, buckets 25")][0] == pytest.approx((0.9 + 0.95) / 2)
    # The overhead line compares the default's row, not the last sync row.
    assert overhead_against_reference(rows)[2] == pytest.approx((0.0, 0.0))


def test_overhead_pairs_the_repeats_taken_in_turn():
    # The machine slowed down for the second pair: paired ratios see through it.
    rows = [dict(_row("sync", 2, 150.0), repeat_images_per_sec=[200.0, 100.0]),
            dict(_row("horovod", 2, 153.0), repeat_images_per_sec=[204.0, 102.0])]
    assert overhead_against_reference(rows)[2] == pytest.approx((0.02, 0.0))


@pytest.mark.parametrize("argv, message", [
    (["--modes", "sync,asgd"], "--modes takes a comma-separated list of sync, local, async, "
                               "independent, horovod, hlocal, hasync; got 'asgd'"),
    (["--slow-rank", "1"], "--slow-rank must be RANK:FACTOR with a factor of at least 1"),
    (["--slow-rank", "1:0.5"], "--slow-rank must be RANK:FACTOR with a factor of at least 1"),
    (["--slow-rank", "2:2", "--workers", "1,2"], "--slow-rank 2:2 names a rank the 1-worker job "
                                                 "does not have"),
    (["--n-sync", "10,0"], "--n-sync takes steps, default or a rule (auto, qsr, link), "
                          "comma-separated; got '10,0'"),
    (["--sync-seconds", "2,-1"], "--sync-seconds must be positive numbers of seconds separated "
                                 "by commas, got '2,-1'"),
    (["--workers", "two"], "--workers must be positive integers"),
    (["--steps", "0"], "--steps, --warmup-steps, --window and --repeats must be positive"),
    (["--repeats", "0"], "--steps, --warmup-steps, --window and --repeats must be positive"),
    (["--synthetic-shape", "28x28"], "--synthetic-shape must look like 32x32x3"),
    (["--model", "vgg"], "--model must be one of"),
    (["--hostfile", "/nonexistent/hosts"], "--hostfile not found: /nonexistent/hosts"),
    (["--hosts", "2", "--workers", "1,4"], "--workers 4 needs as many hosts, one worker each; "
                                           "got --hosts 2"),
    (["--hosts", "0"], "--hosts must be between 1 and 250, got 0"),
    (["--hosts", "2", "--slots", "2", "--workers", "5"], "--workers 5 needs 3 hosts of --slots 2; "
                                                          "got --hosts 2"),
    (["--slots", "2"], "--slots 2 needs --hosts: it sets the workers per emulated host"),
    (["--hosts", "2", "--slots", "0"], "--slots must be at least 1, got 0"),
    (["--hosts", "2", "--link-rate", "fast"], "--link-rate must be a rate in tc's units"),
    (["--round-compression", "none,int3"], "--round-compression takes a comma-separated list "
                                           "of none, fp16, int8, int4, int2, int1, topk; got 'int3'"),
    (["--optimizer", "auto"], "--optimizer must be one of sgd, adam, lars, lamb (one optimizer "
                              "at every worker count, so not auto), got 'auto'"),
    (["--optimizer", "lamb", "--modes", "sync,horovod"],
     "--modes horovod times bare Horovod on sgd, got --optimizer lamb"),
])
def test_bad_bench_options_exit_non_zero_with_one_line(argv, message, capsys, tmp_path):
    assert main(["bench", "--out", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "bench.json")


def test_each_round_compression_is_a_local_setup_crossed_with_n_sync_and_fragments():
    from hvdtrain.benchmarks.bench import CSV_COLUMNS, _setups
    from hvdtrain.benchmarks.throughput import Setup, train_config
    from hvdtrain.cli import build_parser
    from hvdtrain.config import load_config

    args = build_parser().parse_args([
        "bench", "--modes", "sync,local,hasync,independent", "--n-sync", "10,20",
        "--round-fragments", "1,4", "--round-compression", "none,int8", "--sync-seconds", "2"])
    setups = [Setup(**s) for s in _setups(args, load_config(None, {"model": "lenet"}))]
    forms = [f"{n_sync}{form}" for n_sync in (10, 20)
             for form in ("", ", int8", ", 4 fragments", ", 4 fragments, int8")]
    assert [s.label for s in setups] == [
        "sync", *(f"local, n_sync {f}" for f in forms), "local, every 2 s",
        "local, every 2 s, int8", *(f"hierarchical async, n_sync {f}" for f in forms),
        "independent"]
    assert {s.round_compression for s in setups if s.mode in ("sync", "independent")} == {"none"}
    # Each setup trains as `hvdtrain train --round-compression` of its own value would.
    assert [train_config(s, 20, "out", False).round_compression for s in setups[1:5]] == [
        "none", "int8", "none", "int8"]
    assert "round_compression" in CSV_COLUMNS


def test_with_fp16_allreduce_uncompressed_bench_rounds_are_fp16_rounds_measured_once():
    from hvdtrain.benchmarks.bench import _setups
    from hvdtrain.cli import build_parser
    from hvdtrain.config import load_config

    args = build_parser().parse_args([
        "bench", "--modes", "sync,local", "--n-sync", "10", "--round-compression",
        "none,fp16,int8"])
    cfg = load_config(None, {"model": "lenet", "fp16_allreduce": True})
    # As `hvdtrain train --fp16-allreduce` sends them: its rounds are fp16 rounds, so a
    # row says so (and `hvdtrain predict` costs them as fp16 rows), and fp16 runs once.
    assert [(s["mode"], s["round_compression"]) for s in _setups(args, cfg)] == [
        ("sync", "none"), ("local", "fp16"), ("local", "int8")]


def _bench_setups(*argv: str, **config):
    from hvdtrain.benchmarks.bench import _setups
    from hvdtrain.benchmarks.throughput import Setup
    from hvdtrain.cli import build_parser
    from hvdtrain.config import load_config

    args = build_parser().parse_args(["bench", *argv])
    return [Setup(**s) for s in _setups(args, load_config(None, {"model": "lenet", **config}))]


def test_every_bench_setup_trains_one_optimizer_at_every_worker_count():
    from hvdtrain.benchmarks.throughput import train_config
    from hvdtrain.plan import Job, settle

    # Training's `--optimizer auto` takes LAMB from a global batch of 1,024 (16 x 64): a
    # bench's rows at 2 and at 32 workers must still time the same optimizer.
    for setup in _bench_setups("--modes", "sync,local,independent,hlocal", "--n-sync", "10"):
        cfg = train_config(setup, 60, "out", False).resolved()
        runs = {workers: settle(cfg, Job(workers)).config for workers in (2, 8, 16, 32)}
        assert {w: run.optimizer for w, run in runs.items()} == dict.fromkeys(runs, "sgd"), \
            setup.label
        assert not any(run.rescale_rounds for run in runs.values()), setup.label


def test_a_bench_row_records_its_settled_optimizer_and_round_compression():
    from hvdtrain.benchmarks.bench import CSV_COLUMNS
    from hvdtrain.benchmarks.throughput import as_planned, train_config
    from hvdtrain.config import load_config

    setups = [as_planned(s, 16) for s in _bench_setups(
        "--optimizer", "lamb", "--modes", "sync,local,async,hlocal", "--n-sync", "10")]
    assert {s.optimizer for s in setups} == {"lamb"}
    # Not given, a round travels as `hvdtrain train` of that mode sends it: here LAMB's
    # rescaled flat rounds in int4, hierarchical ones in int8, async's as they are.
    expected = {(mode, hierarchical): load_config(None, dict(
        mode=mode, optimizer="lamb", hierarchical_sgd=hierarchical)).resolved().round_compression
        for mode, hierarchical in (("local", False), ("local", True), ("async", False))}
    # Async's is left to the plan, which settles it by the job's period (float32 here).
    assert expected == {("local", False): "int4", ("local", True): "int8", ("async", False): None}
    assert [(s.label, s.round_compression) for s in setups] == [
        ("sync", "none"), ("local, n_sync 10, int4", "int4"), ("async, n_sync 10", "none"),
        ("hierarchical local, n_sync 10, int8", "int8")]
    # The settled setup trains as it says.
    assert [train_config(s, 20, "out", False).resolved().round_compression
            for s in setups[1:]] == ["int4", "none", "int8"]
    assert {"optimizer", "round_compression"} <= set(CSV_COLUMNS)


def test_a_default_period_is_timed_at_the_period_each_jobs_plan_settles():
    """`--n-sync default`: each job times the period `hvdtrain train` settles for its size
    and optimizer, and its row says which."""
    from hvdtrain.benchmarks.throughput import as_planned, train_config
    from hvdtrain.plan import Job, settle

    setups = _bench_setups("--modes", "local,async", "--n-sync", "default,10")
    assert [s.n_sync for s in setups] == ["default", 10, "default", 10]
    for workers in (2, 16):
        planned = [as_planned(s, workers) for s in setups]
        for given, timed in zip(setups, planned):
            settled = settle(train_config(given, 60, "out", False).resolved(), Job(workers))
            assert timed.n_sync == settled.period, (workers, given.label)
    assert [s.label for s in (as_planned(s, 16) for s in setups)] == [
        "local, n_sync 2, int8", "local, n_sync 10, int8", "async, n_sync 1, int8",
        "async, n_sync 10"]
    lamb = _bench_setups("--modes", "local", "--n-sync", "default", "--optimizer", "lamb")
    assert as_planned(lamb[0], 16).n_sync == 1  # LAMB's rescaled rounds, every step


def test_a_bench_period_is_steps_default_or_a_rule_and_nothing_else():
    from hvdtrain.benchmarks.bench import _periods
    from hvdtrain.errors import ConfigError

    assert _periods("default,5, 10,qsr,auto:8,link:20") == [
        "default", 5, 10, "qsr", "auto:8", "link:20"]
    for bad in ("default,qsr:0", "4,-1", "8/workers"):
        with pytest.raises(ConfigError, match="--n-sync"):
            _periods(bad)


def test_a_rule_periods_rounds_are_the_runs_own_over_its_steps():
    """A rule sets its period at rounds: nothing is rounded to whole periods, and the row
    counts the rounds the run held over the steps each worker took."""
    from hvdtrain.benchmarks.throughput import _exchange_counts, as_planned

    rule, steps = _bench_setups("--modes", "local,async", "--n-sync", "qsr,6", "--steps", "10")[:2]
    assert (rule.period, steps.period) == (None, 6)
    assert as_planned(rule, 4).n_sync == "qsr" and as_planned(rule, 4).steps == 10
    summary = dict(averaging_rounds=3, steps_per_worker=[13, 13, 13, 13])
    seconds = [[0.1] * 10 for _ in range(4)]
    assert _exchange_counts(rule, summary, seconds, 10) == (3, 13.0, 10)
    assert _exchange_counts(steps, summary, seconds, 12) == (2, 12, 12)


def test_bench_rounds_default_to_trainings_own_and_fp16_allreduce_makes_async_rounds_fp16():
    from hvdtrain.benchmarks.throughput import as_planned

    setups = [as_planned(s, 2) for s in _bench_setups(
        "--modes", "local,async,independent", "--n-sync", "10", fp16_allreduce=True)]
    assert [(s.optimizer, s.label) for s in setups] == [
        ("sgd", "local, n_sync 10, int8"), ("sgd", "async, n_sync 10, fp16"),
        ("sgd", "independent")]


class _Clock:
    now = 0.0

    def __call__(self):
        return self.now


class _FakeModel:
    """A compiled step that computes for 0.25 s, then waits `exchange` s for its gradients'
    averages; its exchange clock (as `hvdtrain.keras.exchange_clock`'s) counts the wait."""

    def __init__(self, clock, exchange=0.0):
        self.clock, self.exchange = clock, exchange
        self.exchange_clock = _Clock() if exchange else None
        if self.exchange_clock:
            self.exchange_clock.read = self.exchange_clock

    def train_function(self, iterator):
        self.clock.now += 0.25 + self.exchange
        if self.exchange_clock:
            self.exchange_clock.now += self.exchange
        return {"loss": 1.0}


@pytest.mark.parametrize("rank, slept", [(0, [0.5, 0.5]), (1, [])])
def test_a_slow_rank_sleeps_factor_minus_one_times_each_step_and_only_that_rank(rank, slept):
    # A fit's first step is not slowed: it mostly traces the step function.
    from hvdtrain import comm
    from hvdtrain.benchmarks.timing import SlowerSteps

    comm.init()  # a world of one: this process is rank 0
    clock, sleeps = _Clock(), []
    slower = SlowerSteps(rank, 3.0, clock=clock, sleep=sleeps.append)
    slower.set_model(_FakeModel(clock))
    slower.on_train_begin()
    for _ in range(3):
        assert slower.model.train_function(None) == {"loss": 1.0}
    assert sleeps == pytest.approx(slept)
    slower.on_train_end()
    slower.on_train_begin()  # a second fit is slowed once, not twice
    for _ in range(2):
        slower.model.train_function(None)
    assert sleeps == pytest.approx(slept + slept[:1])


def test_a_slow_rank_slows_its_compute_and_not_the_gradient_exchange_in_its_step():
    # A sync step: 0.25 s of compute, then 0.6 s waiting for the averages. A GPU 3x
    # slower computes for 0.75 s: 0.5 s more, whatever the network did.
    from hvdtrain import comm
    from hvdtrain.benchmarks.timing import SlowerSteps

    comm.init()
    clock, sleeps = _Clock(), []
    slower = SlowerSteps(0, 3.0, clock=clock, sleep=sleeps.append)
    slower.set_model(_FakeModel(clock, exchange=0.6))
    slower.on_train_begin()
    for _ in range(3):
        slower.model.train_function(None)
    assert sleeps == pytest.approx([0.5, 0.5])


def test_the_exchange_clock_counts_the_wait_from_the_inputs_to_the_outputs():
    import tensorflow as tf

    from hvdtrain.keras.exchange_clock import ExchangeClock, exchange_clock

    clock = ExchangeClock()

    def slow_identity(x):  # an exchange that takes at least 50 ms
        return tf.py_function(lambda v: (time.sleep(0.05), v)[1], [x], tf.float32)

    @tf.function
    def step(x):
        return clock.timed([x * 2.0], lambda: [slow_identity(x * 2.0)])

    assert step(tf.constant(1.0))[0].numpy() == 2.0
    assert step(tf.constant(1.0))[0].numpy() == 2.0
    assert clock.read() >= 0.1
    model = type("M", (), {"optimizer": type("O", (), {"exchange_clock": clock})()})()
    assert exchange_clock(model) is clock and exchange_clock(object()) is None


def run_bench(*argv: str) -> subprocess.CompletedProcess:
    """`hvdtrain bench` on LeNet-5 at a batch of 32, 12 timed steps after 3, windows of 4,
    and `argv`; it must succeed."""
    bin_dir = os.path.dirname(sys.executable)
    result = subprocess.run(
        [os.path.join(bin_dir, "hvdtrain"), "bench", "--model", "lenet", "--batch-size", "32",
         "--steps", "12", "--warmup-steps", "3", "--window", "4", *argv],
        capture_output=True, text=True, timeout=600,
        env=dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"]))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.mark.ci
@pytest.mark.long
@pytest.mark.multiprocess
def test_bench_measures_every_mode_on_one_and_two_workers(tmp_path):
    from hvdtrain.rounds import quantize

    out = tmp_path / "bench"
    result = run_bench("--workers", "1,2", "--modes", "sync,local,async,independent,horovod",
                       "--n-sync", "4", "--repeats", "2", "--out", str(out))
    report = json.loads((out / "bench.json").read_text())
    rows = report["rows"]
    assert [(r["workers"], r["label"]) for r in rows] == [
        (w, label) for w in (1, 2)
        for label in ("sync", "local, n_sync 4, int8", "async, n_sync 4", "independent", "horovod")]
    # Every row timed the bench's optimizer; local rounds went as training's default, int8.
    assert {r["optimizer"] for r in rows} == {"sgd"}
    assert [r["round_compression"] for r in rows[:5]] == ["none", "int8", "none", "none", "none"]
    for row in rows:
        assert row["total_images_per_sec"] > 0 and row["total_ci95"] >= 0
        assert row["total_images_per_sec"] == pytest.approx(
            row["workers"] * row["per_worker_images_per_sec"])
        assert row["timed_steps"] == 12 and 0.0 <= row["communication_share"] <= 1.0
        assert row["repeats"] == 2 and len(row["repeat_images_per_sec"]) == 2
        assert row["parameters"] == 61_706 and row["data"] == "device"
    by = {(r["workers"], r["mode"]): r for r in rows}
    gradient_bytes = 61_706 * 4
    assert by[(2, "sync")]["bytes_per_step"] == by[(2, "horovod")]["bytes_per_step"] == gradient_bytes
    # A round every 4 steps: the weights alone in both modes (each worker keeps its
    # momentum by default), local mode's as int8 codes and scales; nothing without a peer
    # or without rounds.
    assert by[(2, "local")]["bytes_per_step"] == pytest.approx(
        quantize.payload_bytes(61_706, 2, "int8") / 4)
    assert by[(2, "async")]["bytes_per_step"] == pytest.approx(gradient_bytes / 4)
    assert by[(2, "sync")]["communication_share"] > 0
    assert by[(2, "independent")]["bytes_per_step"] == by[(1, "sync")]["bytes_per_step"] == 0
    assert all(by[(1, m)]["speedup"] == 1.0
               for m in ("sync", "local", "async", "independent", "horovod"))
    assert by[(2, "sync")]["efficiency"] == pytest.approx(by[(2, "sync")]["speedup"] / 2)
    assert set(report["horovod_reference_over_sync"]) == {"1", "2"}
    assert set(report["horovod_reference_over_sync"]["2"]) == {"overhead", "ci95"}
    assert report["machine"]["cpus"] >= 1 and report["machine"]["horovod"] == "0.28.1"
    with open(out / "bench.csv", newline="") as fh:
        table = list(csv.DictReader(fh))
    assert len(table) == 10 and float(table[5]["total_images_per_sec"]) > 0
    assert "| lenet | local, n_sync 4, int8 | 2 |" in result.stdout


@pytest.mark.multiprocess
@pytest.mark.long  # six trainings and their benches in one job: about 25 seconds here
def test_a_local_rows_bytes_per_round_are_what_a_training_run_of_it_counts(tmp_path):
    from conftest import horovodrun
    from hvdtrain.rounds import quantize

    horovodrun("bench_bytes_worker.py", str(tmp_path))
    for rank in (0, 1):
        found = json.loads((tmp_path / f"bench_bytes-rank{rank}.json").read_text())
        for name, bytes_of in found.items():
            assert bytes_of["gradient_steps"] == 0, name  # every byte the run counted is a round's
            assert bytes_of["bench"] == bytes_of["run"], name
    # LeNet's 61,706 weights alone (each worker keeps its momentum): 4 bytes in local
    # mode; 2 in async, whose --fp16-allreduce rounds are fp16 compressed rounds.
    assert found["local"]["run"] == 61_706 * 4
    assert found["async_fp16"]["run"] == quantize.payload_bytes(61_706, 2, "fp16") == 61_706 * 2
    # int8: a byte a weight and a float32 scale per 1,024, padded to a whole shard of
    # 1,024-value chunks for each of the 2 workers: about a quarter of float32's bytes.
    assert found["local_int8"]["run"] == quantize.payload_bytes(61_706, 2, "int8")
    assert found["local_int8"]["run"] < 61_706 * 4 / 3.8
    # int4: half a byte a weight, the same scales.
    assert found["local_int4"]["run"] == quantize.payload_bytes(61_706, 2, "int4")
    assert found["local_int4"]["run"] < 61_706 * 4 / 7.6
    # Two fragments: a round sends half the weights on average, the larger half at most.
    fragmented = found["local_2_fragments"]
    assert sum(fragmented["fragments"]) == 61_706 * 4
    assert fragmented["bench"] == fragmented["run"] == 61_706 * 4 / 2
    assert fragmented["largest"] == max(fragmented["fragments"]) < 61_706 * 4


@pytest.mark.multiprocess
@pytest.mark.long  # four workers: about a minute and a half here
def test_hierarchical_rows_send_only_rounds_across_hosts_and_gradients_inside_them(tmp_path):
    """Two hostnames of two workers each (localhost and 127.0.0.1): a hierarchical local
    row's bytes per step across hosts are its rounds' (the state over n_sync steps), and
    its gradients, averaged every step, are counted inside a host."""
    from conftest import horovodrun

    out = tmp_path / "bench"
    # Float32 rounds (not local mode's int8), so that a round's bytes are 4 a weight.
    horovodrun("hvdtrain", "bench", "--modes", "local,hlocal", "--n-sync", "5", "--steps", "10",
               "--round-compression", "none", "--warmup-steps", "2", "--window", "5",
               "--batch-size", "16", "--out", str(out),
               np_=4, hosts="localhost:2,127.0.0.1:2", timeout=600)
    rows = json.loads((out / "bench.json").read_text())["rows"]
    assert [(r["label"], r["hierarchical"], r["hosts"]) for r in rows] == [
        ("local, n_sync 5", False, None), ("hierarchical local, n_sync 5", True, 2)]
    flat, hierarchical = rows
    # LeNet's 61,706 weights (each worker keeps its momentum), every 5 steps, in both; the
    # hierarchical round cut in 2 host shards, a worker sending one across hosts.
    assert flat["bytes_per_step"] == 61_706 * 4 / 5
    assert (hierarchical["host_shards"], flat["host_shards"]) == (2, 1)
    assert hierarchical["bytes_per_step"] == 61_706 / 2 * 4 / 5
    assert (flat["bytes_within_host_per_step"], hierarchical["bytes_within_host_per_step"]) == \
        (0, 61_706 * 4)


@pytest.mark.multiprocess
@pytest.mark.long  # 3 rows of 40 steps, one rank computing at half speed: about 25 seconds here
def test_bench_under_horovodrun_measures_that_job(tmp_path):
    from conftest import horovodrun

    out = tmp_path / "bench"
    # Timed rounds: an epoch of many periods, so that the slow rank gets timed steps too.
    horovodrun("hvdtrain", "bench", "--modes", "sync,local", "--n-sync", "2", "--steps", "40",
               "--warmup-steps", "2", "--window", "10", "--batch-size", "16", "--slow-rank", "1:2",
               "--sync-seconds", "0.1", "--pin-cores", "--out", str(out))
    report = json.loads((out / "bench.json").read_text())
    rows = report["rows"]
    assert [(r["workers"], r["label"]) for r in rows] == [
        (2, "sync"), (2, "local, n_sync 2, int8"), (2, "local, every 0.1 s, int8")]
    assert all((r["slow_rank"], r["slow_factor"]) == (1, 2.0) for r in rows)
    assert rows[1]["exchanges_timed"] == 20 and rows[0]["exchanges_timed"] == 40
    # Timed rounds: counted as they came (the epoch's end among them).
    assert rows[2]["sync_seconds"] == 0.1 and rows[2]["exchanges_timed"] >= 1
    assert rows[0]["round_share"] == 0.0 and 0.0 <= rows[2]["round_share"] <= 1.0
    # LeNet's 0.25 MB of gradients travel in groups of an eighth (--bucket-mb auto), the
    # last layers' first; its 192 kB dense kernel is a group of its own. The last group is
    # the cost model's exposed tail.
    assert rows[0]["gradient_group_bytes"] == [3736, 40320, 480, 192000, 10288]
    # Each worker had its own half of the cores, and its own rate in the row.
    assert report["machine"]["cores_per_worker"] == len(os.sched_getaffinity(0)) // 2
    for row in rows:
        assert len(row["worker_images_per_sec"]) == 2
        assert sum(row["worker_images_per_sec"]) == pytest.approx(row["total_images_per_sec"])
    # Rank 1 computes twice as slowly. Counted in steps, not timed: in sync and n_sync
    # rounds the workers step in lockstep, every worker the row's steps; with timed rounds
    # each steps at its own pace between rounds, so the slow rank takes fewer.
    assert rows[0]["worker_timed_steps"] == [40, 40] and rows[1]["worker_timed_steps"] == [40, 40]
    timed_fast, timed_slow = rows[2]["worker_timed_steps"]
    assert 0 < timed_slow < timed_fast
    # Asking for another size than horovodrun started is one clear line on every rank.
    wrong = horovodrun("hvdtrain", "bench", "--workers", "4", "--out", str(tmp_path / "x"),
                       check=False)
    assert wrong.returncode != 0
    assert "--workers 4 under horovodrun, which started 2" in wrong.stderr + wrong.stdout


@pytest.mark.long  # 14 seconds here
@pytest.mark.multiprocess
def test_gradient_averaging_times_its_exchange_inside_the_step_and_only_while_it_averages(
        tmp_path):
    from conftest import horovodrun, load_rank_files

    horovodrun("exchange_clock_worker.py", str(tmp_path))
    for rank in load_rank_files(str(tmp_path), "clock"):
        assert float(rank["averaging"]) > 0.0  # four allreduces of real gradients
        # Local steps (averaging off) take the cond's other branch: no time is added.
        assert float(rank["after_local"]) == float(rank["averaging"])


@pytest.mark.parametrize("workers, slots, expected", [
    (2, 1, "h1:1,h2:1"), (4, 2, "h1:2,h2:2"), (5, 2, "h1:2,h2:2,h3:1"), (1, 4, "h1:1")])
def test_a_job_on_emulated_hosts_fills_each_hosts_slots_in_turn(workers, slots, expected):
    from hvdtrain.benchmarks.launching import host_slots, on_emulated_hosts

    assert host_slots(workers, slots) == expected
    argv = on_emulated_hosts(workers, ["hvdtrain", "train"], 3, "100mbit", slots)
    assert argv[argv.index("-H") + 1] == expected and argv[argv.index("-np") + 1] == str(workers)


@pytest.mark.ci
@pytest.mark.long  # about 60 seconds here
@pytest.mark.multiprocess
def test_bench_times_a_rule_period_with_the_rounds_its_run_held(tmp_path):
    out = tmp_path / "bench"
    run_bench("--workers", "2", "--modes", "local", "--n-sync", "auto:4", "--out", str(out))
    (row,) = json.loads((out / "bench.json").read_text())["rows"]
    assert row["label"] == "local, n_sync auto:4, int8" and row["timed_steps"] == 12
    # The adaptive period starts at 4 steps: the 15 steps held a round at least every 4.
    assert row["exchanges_timed"] >= 3 and row["bytes_per_step"] > 0
    assert row["bytes_per_step"] == pytest.approx(
        row["exchanges_timed"] * row["bytes_per_round"] / 15)
