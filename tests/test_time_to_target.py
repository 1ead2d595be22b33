"""Time to a target accuracy, from a run folder's metrics.jsonl and summary.json."""

import json
import os

import pytest

from hvdtrain.benchmarks.experiments import add_time_to_target, format_table, grid, parse_period_list
from hvdtrain.benchmarks.time_to_accuracy import (AccuracyPoint, default_targets, first_reaching,
                                                  load_points)
from hvdtrain.errors import ConfigError


def _run_folder(folder, evals, summary):
    os.makedirs(folder)
    epoch = {"epoch": 1, "step": 40, "examples": 2560, "loss": 0.5, "val_accuracy": 0.99,
             "wall_seconds": 9.0}
    with open(os.path.join(folder, "metrics.jsonl"), "w") as fh:
        for record in evals[:2] + [epoch] + evals[2:]:
            fh.write(json.dumps(record) + "\n")
        fh.write('{"eval": true, "step": 9')  # cut short by a crash
    with open(os.path.join(folder, "summary.json"), "w") as fh:
        json.dump(summary, fh)
    return folder


def _eval(step, seconds, accuracy):
    return {"eval": True, "step": step, "examples": step * 64, "train_seconds": seconds,
            "wall_seconds": seconds + 1.0, "bytes_allreduced": step * 1000,
            "test_accuracy": accuracy, "test_loss": 1.0, "n_sync": 10}


SUMMARY = {"test_accuracy": 0.87, "wall_seconds": 30.0, "eval_seconds": 4.0,
           "examples_trained": 5120, "bytes_allreduced": 80_000}


def test_the_first_evaluation_at_or_over_the_target_gives_time_examples_and_bytes(tmp_path):
    run = _run_folder(str(tmp_path / "run"), [_eval(10, 3.0, 0.70), _eval(20, 6.5, 0.86),
                                              _eval(30, 9.0, 0.84), _eval(40, 12.0, 0.88)],
                      SUMMARY)
    points = load_points(run)
    # The evaluations in order (epoch lines and a torn line left out), then the final one,
    # timed without the evaluations.
    assert [p.test_accuracy for p in points] == [0.70, 0.86, 0.84, 0.88, 0.87]
    assert points[-1] == AccuracyPoint(26.0, 5120, 80_000, 0.87)
    assert first_reaching(points, 0.85) == AccuracyPoint(6.5, 1280, 20_000, 0.86)
    assert first_reaching(points, 0.88) == AccuracyPoint(12.0, 2560, 40_000, 0.88)
    assert first_reaching(points, 0.95) is None


def test_without_evaluations_only_the_final_accuracy_counts(tmp_path):
    run = _run_folder(str(tmp_path / "run"), [], SUMMARY)
    assert first_reaching(load_points(run), 0.8) == AccuracyPoint(26.0, 5120, 80_000, 0.87)


def test_the_default_target_is_syncs_final_accuracy_minus_one_point():
    targets = default_targets({(1, "sync"): 0.90, (4, "sync"): 0.88, (8, "local"): 0.5})
    assert targets == pytest.approx({1: 0.89, 4: 0.87, 8: 0.89})  # 8: no sync run, w1's
    assert default_targets({(4, "local"): 0.8}) == {}


def test_the_sweep_table_reports_when_each_run_reached_the_target(tmp_path):
    sync = _run_folder(str(tmp_path / "w4-sync"), [_eval(10, 5.0, 0.80), _eval(20, 10.0, 0.87)],
                       dict(SUMMARY, test_accuracy=0.88))
    local = _run_folder(str(tmp_path / "w4-nauto-cold"), [_eval(10, 2.0, 0.875)], SUMMARY)
    rows = [{"name": n, "workers": 4, "mode": m, "n_sync": p, "start": "cold",
             "test_accuracy": a, "final_training_error": 0.1, "wall_seconds": 30.0,
             "bytes_allreduced": 80_000}
            for n, m, p, a in (("w4-sync", "sync", "", 0.88), ("w4-nauto-cold", "local",
                                                                "auto", 0.87))]
    add_time_to_target(rows, [sync, local], None)
    assert rows[0]["target"] == pytest.approx(0.87)
    assert (rows[0]["seconds_to_target"], rows[1]["seconds_to_target"]) == (10.0, 2.0)
    assert (rows[1]["examples_to_target"], rows[1]["bytes_to_target"]) == (640, 10_000)
    add_time_to_target(rows, [sync, local], 0.99)
    assert rows[1]["seconds_to_target"] == ""
    assert "| 99.00% | – | – | – |" in format_table(rows, 400)


def test_the_sweep_grid_takes_sync_runs_and_adaptive_periods():
    assert parse_period_list("10, 50,auto,auto:48,link:20") == [10, 50, "auto", "auto:48",
                                                                  "link:20"]
    with pytest.raises(ConfigError, match="--n-sync takes periods separated by commas, got "
                                          "'10,often': 'often' is none"):
        parse_period_list("10,often")
    names = [r.name for r in grid([4], [10, "auto:48", "link"], ["cold"],
                                  ("sync", "local", "async"))]
    assert names == ["w4-sync", "w4-n10-cold", "w4-nauto48-cold", "w4-nlink-cold",
                     "w4-async-n10-cold", "w4-async-nauto48-cold", "w4-async-nlink-cold"]
    # N/workers becomes each worker count's own number, and runs once where it repeats one.
    assert parse_period_list("40/workers,10") == ["40/workers", 10]
    names = [r.name for r in grid([2, 4, 8], ["40/workers", 10], ["cold"])]
    assert names == ["w2-n20-cold", "w2-n10-cold", "w4-n10-cold", "w8-n5-cold", "w8-n10-cold"]


def test_a_worker_count_without_a_sync_run_takes_the_one_worker_runs_target(tmp_path):
    # As --target's help says; the sweep used to hand default_targets its sync runs
    # alone, so a count with only local runs got no target at all.
    one = _run_folder(str(tmp_path / "w1"), [], dict(SUMMARY, test_accuracy=0.88))
    local = _run_folder(str(tmp_path / "w2-n10-cold"), [_eval(10, 2.0, 0.875)], SUMMARY)
    rows = [{"name": "w1", "workers": 1, "mode": "sync", "test_accuracy": 0.88},
            {"name": "w2-n10-cold", "workers": 2, "mode": "local", "test_accuracy": 0.87}]
    add_time_to_target(rows, [one, local], None)
    assert rows[1]["target"] == pytest.approx(0.87)
    assert rows[1]["seconds_to_target"] == 2.0
