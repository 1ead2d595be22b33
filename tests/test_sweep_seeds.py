"""`hvdtrain sweep --seeds`: runs per seed, and each setting's mean accuracy and its 95%
interval over the seeds (hvdtrain.benchmarks.seeds)."""

import csv
import json
import math

import pytest

from hvdtrain.benchmarks.experiments import GridRun, grid, with_seeds
from hvdtrain.benchmarks.seeds import parse_seeds, summarize_seeds
from hvdtrain.cli import main
from hvdtrain.errors import ConfigError

from helpers import finished_sweep_run


def test_every_setting_runs_once_per_seed_named_and_trained_with_it():
    runs = with_seeds(grid([1, 2], [10], ["cold"], modes=("sync", "local")), [1, 2])
    assert [r.run_name for r in runs] == ["w1-s1", "w2-sync-s1", "w2-n10-cold-s1",
                                          "w1-s2", "w2-sync-s2", "w2-n10-cold-s2"]
    assert [r.name for r in runs[:3]] == [r.name for r in runs[3:]]  # the settings
    assert runs[2].train_options(500) == ["--mode", "local", "--n-sync", "10", "--seed", "1"]
    # Without --seeds: the names and options of sweeps made before it.
    plain = with_seeds(grid([2], [10], ["cold"]), None)
    assert plain == [GridRun("w2-n10-cold", 2, 10, "cold")] and plain[0].run_name == "w2-n10-cold"
    assert "--seed" not in plain[0].train_options(500)


@pytest.mark.parametrize("text", ["1,x", "1,1", "-1,2", ""])
def test_bad_seeds_are_one_line(text):
    with pytest.raises(ConfigError, match="--seeds must be distinct non-negative integers"):
        parse_seeds(text)
    assert parse_seeds("0,7,3") == [0, 7, 3]


def test_the_summary_gives_each_setting_its_mean_and_t_interval_over_the_seeds():
    rows = [{"setting": s, "workers": 2, "mode": "sync", "n_sync": "", "start": "cold",
             "seed": seed, "test_accuracy": acc}
            for seed, accs in ((1, (0.80, 0.70)), (2, (0.82, 0.71)), (3, (0.84, 0.75)))
            for s, acc in zip(("w2-sync", "w2-n10-cold"), accs)]
    sync, local = summarize_seeds(rows)
    assert (sync["setting"], sync["seeds"], sync["runs"]) == ("w2-sync", "1 2 3", 3)
    assert sync["test_accuracy_mean"] == pytest.approx(0.82)
    # s = 0.02 over 3 seeds: t(2 df) = 4.303 times 0.02 / sqrt(3).
    assert sync["test_accuracy_ci95"] == pytest.approx(4.303 * 0.02 / math.sqrt(3))
    assert local["test_accuracy_mean"] == pytest.approx(0.72)
    one = summarize_seeds(rows[:1])[0]
    assert (one["runs"], one["test_accuracy_ci95"]) == (1, 0.0)


def test_the_summary_gives_each_setting_its_mean_time_to_the_target_over_the_runs_that_reached_it():
    from hvdtrain.benchmarks.seeds import format_settings_table

    def row(setting, seed, seconds):
        return {"setting": setting, "workers": 8, "mode": "local", "n_sync": 2, "start": "cold",
                "seed": seed, "test_accuracy": 0.88, "target": 0.875, "seconds_to_target": seconds}

    rows = [row("all", 1, 100.0), row("all", 2, 110.0), row("all", 3, 120.0),
            row("some", 1, 90.0), row("some", 2, ""), row("some", 3, 96.0),
            row("none", 1, ""), row("none", 2, "")]
    every, some, none = summarize_seeds(rows)
    assert (every["reached_target"], every["seconds_to_target_mean"]) == (3, pytest.approx(110.0))
    # s = 10 over 3 runs: t(2 df) = 4.303 times 10 / sqrt(3).
    assert every["seconds_to_target_ci95"] == pytest.approx(4.303 * 10 / math.sqrt(3))
    # A run that never reached the target is counted, not averaged in.
    assert (some["reached_target"], some["seconds_to_target_mean"]) == (2, pytest.approx(93.0))
    assert (none["reached_target"], none["seconds_to_target_mean"], none["target"]) == (0, "", 0.875)
    table = format_settings_table([every, some, none])
    assert table.splitlines()[2].endswith(f"| 110 ± {4.303 * 10 / math.sqrt(3):.0f} |")
    assert table.splitlines()[3].endswith("| 93 ± 38 (2 of 3 reached it) |")
    assert table.endswith("| none of 2 reached 87.50% |")


def test_a_sweep_over_seeds_writes_the_settings_table(tmp_path, capsys):
    out = tmp_path / "sweep"
    for seed, accuracy in ((1, 0.80), (2, 0.84), (5, 0.82)):
        finished_sweep_run(str(out / "runs" / f"w1-s{seed}"), seed, accuracy)
    assert main(["sweep", "--out", str(out), "--workers", "1", "--seeds", "1,2,5",
                 "--window", "2"]) == 0
    printed = capsys.readouterr().out
    assert "sweep run" not in printed  # every run had finished: nothing trained
    half_width = 4.303 * 0.02 / math.sqrt(3)
    assert f"| w1 | 1 | – | cold | 1 2 5 | 82.00% ± {half_width:.2%} |" in printed
    report = json.loads((out / "sweep.json").read_text())
    assert [(r["name"], r["setting"], r["seed"]) for r in report["runs"]] == [
        ("w1-s1", "w1", 1), ("w1-s2", "w1", 2), ("w1-s5", "w1", 5)]
    (setting,) = report["settings"]
    assert setting["test_accuracy_mean"] == pytest.approx(0.82)
    assert setting["test_accuracy_ci95"] == pytest.approx(half_width, rel=1e-3)
    with open(out / "sweep-settings.csv", newline="") as fh:
        (row,) = list(csv.DictReader(fh))
    assert (row["setting"], row["runs"], row["seeds"]) == ("w1", "3", "1 2 5")
    with open(out / "sweep.csv", newline="") as fh:
        assert [r["seed"] for r in csv.DictReader(fh)] == ["1", "2", "5"]
