"""`hvdtrain compare`: settings over their seeds, from run folders as `hvdtrain train` leaves them."""

from __future__ import annotations

import csv
import json

import pytest

from hvdtrain.benchmarks.compare import load_runs, markdown, setting_of, summarize
from hvdtrain.benchmarks.diverged_runs import mark_diverged
from hvdtrain.cli import main
from hvdtrain.errors import DataError
from hvdtrain.stats import mean_ci95


def _run(name, accuracy=None, sent=0, wall=10.0):
    summary = None if accuracy is None else {"test_accuracy": accuracy, "bytes_allreduced": sent,
                                             "wall_seconds": wall}
    return {"name": name, "summary": summary}


def test_the_seed_suffix_names_the_setting():
    assert setting_of("w8-local-s3") == ("w8-local", 3)
    assert setting_of("w8-local-s3x") == ("w8-local-s3x", None)
    assert setting_of("docs-w16") == ("docs-w16", None)


def test_a_setting_is_its_seeds_mean_with_the_t_interval_in_percent():
    rows = summarize([_run("a-s1", 0.80, 100), _run("b-s1", 0.5, 50), _run("a-s2", 0.84, 300),
                      _run("a-s3", 0.86, 200)])
    assert [r["setting"] for r in rows] == ["a", "b"]
    a = rows[0]
    mean, half = mean_ci95([80.0, 84.0, 86.0])
    assert a["test_accuracy_mean"] == pytest.approx(mean)
    assert a["test_accuracy_ci95"] == pytest.approx(half)
    assert a["test_accuracy_min"] == pytest.approx(80.0)
    assert (a["runs"], a["stopped"], a["seeds"]) == (3, 0, "1 2 3")
    assert a["bytes_per_worker"] == 200 and a["bytes_share"] is None


def test_a_stopped_run_is_counted_not_averaged():
    rows = summarize([_run("a-s1", 0.8), _run("a-s2"), _run("b-s1")])
    assert (rows[0]["runs"], rows[0]["stopped"], rows[0]["test_accuracy_mean"]) == (2, 1, 80.0)
    assert rows[1]["stopped"] == 1 and rows[1]["test_accuracy_mean"] is None


def test_bytes_are_a_share_of_the_reference_settings():
    rows = summarize([_run("sync-s1", 0.8, 400), _run("local-s1", 0.8, 100)], reference="sync")
    assert [r["bytes_share"] for r in rows] == [1.0, 0.25]


def test_the_reference_is_subtracted_seed_by_seed_over_the_seeds_both_finished():
    runs = [_run("sync-s1", 0.80, 400), _run("sync-s2", 0.84, 400), _run("sync-s3", 0.86, 400),
            _run("int8-s1", 0.81, 100), _run("int8-s2", 0.845, 100), _run("int8-s3"),
            _run("int8-s4", 0.90, 100), _run("other", 0.9, 100)]
    sync, int8, other = summarize(runs, reference="sync")
    mean, half = mean_ci95([1.0, 0.5])  # seed 3 stopped, seed 4 has no pair
    assert int8["paired_diff_mean"] == pytest.approx(mean)
    assert int8["paired_diff_ci95"] == pytest.approx(half)
    assert (int8["paired_seeds"], int8["paired_higher"]) == (2, 2)
    assert sync["paired_diff_mean"] is None and other["paired_seeds"] is None  # no seeds
    assert f"| {mean:+.2f} ± {half:.2f} (2 of 2 higher) |" in markdown([int8])


def _folder(root, name, accuracy):
    run = root / name
    run.mkdir()
    (run / "config.yaml").write_text("epochs: 1\n")
    if accuracy is not None:
        (run / "summary.json").write_text(json.dumps(
            {"test_accuracy": accuracy, "bytes_allreduced": 1000, "wall_seconds": 3.0}))


def test_the_command_prints_the_table_and_writes_the_csv(tmp_path, capsys):
    for name, accuracy in (("local-s1", 0.86), ("local-s2", 0.88), ("guarded-s1", None)):
        _folder(tmp_path, name, accuracy)
    (tmp_path / "notes").mkdir()  # not a run: no config.yaml
    assert main(["compare", str(tmp_path), "--csv", str(tmp_path / "t.csv")]) == 0
    out = capsys.readouterr().out
    assert "| local | 2 | 87.00 ± 12.71 | 86.00 | 0.0 |  | 3 |" in out
    assert "| guarded | 1 (1 stopped) |" in out
    rows = list(csv.DictReader(open(tmp_path / "t.csv")))
    assert [r["setting"] for r in rows] == ["guarded", "local"]


def test_a_run_the_sweep_recorded_as_diverged_is_counted_apart_from_a_stopped_one(tmp_path):
    for name, accuracy in (("lr8-s1", 0.5), ("lr8-s2", None), ("lr8-s3", None)):
        _folder(tmp_path, name, accuracy)
    log = tmp_path / "lr8-s2.log"
    log.write_text("[0]<stderr>:hvdtrain: error: training diverged at step 22: ...\n")
    mark_diverged(str(tmp_path / "lr8-s2"), str(log))
    (row,) = summarize(load_runs([str(tmp_path)]))
    assert (row["runs"], row["diverged"], row["stopped"]) == (3, 1, 1)
    assert row["test_accuracy_mean"] == pytest.approx(50.0)
    assert "| lr8 | 3 (1 diverged, 1 stopped) | 50.00 ± 0.00 |" in markdown([row])


@pytest.mark.parametrize("argv, message", [
    (["compare", "{missing}"], "run folder not found"),
    (["compare", "{root}", "--reference", "nope"], "--reference nope is not one of the settings"),
])
def test_bad_folders_and_references_are_one_line(tmp_path, capsys, argv, message):
    _folder(tmp_path, "local-s1", 0.8)
    argv = [a.format(missing=tmp_path / "missing", root=tmp_path) for a in argv]
    assert main(argv) != 0
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def _two_sweeps(tmp_path):
    """Two sweeps of one grid, as `hvdtrain sweep` leaves them: the same names in each."""
    accuracies = {"sweep-int8": (0.880, 0.882, 0.878, 0.870, 0.872, 0.868),
                  "sweep-int4": (0.880, 0.882, 0.878, 0.850, 0.852, 0.848)}
    for sweep, values in accuracies.items():
        runs = tmp_path / sweep / "runs"
        runs.mkdir(parents=True)
        names = [f"{setting}-s{seed}" for setting in ("w8-sync", "w8-n2-cold")
                 for seed in (1, 2, 3)]
        for name, accuracy in zip(names, values):
            _folder(runs, name, accuracy)
    return [str(tmp_path / "sweep-int8"), str(tmp_path / "sweep-int4")]


def test_two_sweeps_of_one_grid_stay_apart_each_setting_named_with_its_folder(tmp_path):
    rows = summarize(load_runs(_two_sweeps(tmp_path)), reference="sweep-int8/w8-sync")
    assert [r["setting"] for r in rows] == ["sweep-int8/w8-n2-cold", "sweep-int4/w8-n2-cold",
                                            "sweep-int8/w8-sync", "sweep-int4/w8-sync"]
    int8, int4 = rows[0], rows[1]
    assert (int8["runs"], int8["seeds"], int4["runs"], int4["seeds"]) == (3, "1 2 3", 3, "1 2 3")
    assert int8["test_accuracy_mean"] == pytest.approx(87.0)
    assert int4["test_accuracy_mean"] == pytest.approx(85.0)
    # Paired with sweep-int8's sync runs, seed by seed: each folder's own cold runs.
    assert int8["paired_diff_mean"] == pytest.approx(-1.0) and int8["paired_seeds"] == 3
    assert int4["paired_diff_mean"] == pytest.approx(-3.0) and int4["paired_seeds"] == 3
    assert "| sweep-int4/w8-n2-cold | 3 | 85.00 ± " in markdown(rows)


def test_a_reference_both_folders_have_must_name_its_folder_one_that_only_one_has_need_not(
        tmp_path, capsys):
    sweeps = _two_sweeps(tmp_path)
    assert main(["compare", *sweeps, "--reference", "w8-sync"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and (
        "--reference w8-sync is a setting of 2 folders: name one, sweep-int8/w8-sync or "
        "sweep-int4/w8-sync") in err
    _folder(tmp_path / "sweep-int4" / "runs", "fp32-s1", 0.9)
    rows = summarize(load_runs(sweeps), reference="fp32")
    assert rows[-1]["setting"] == "sweep-int4/fp32" and rows[-1]["bytes_share"] == 1.0


def test_runs_named_one_by_one_from_one_folder_keep_their_bare_settings(tmp_path):
    for name, accuracy in (("local-s1", 0.86), ("local-s2", 0.88)):
        _folder(tmp_path, name, accuracy)
    paths = [str(tmp_path / "local-s1"), str(tmp_path / "local-s2"), str(tmp_path / "local-s1")]
    (row,) = summarize(load_runs(paths))
    assert (row["setting"], row["runs"], row["seeds"]) == ("local", 2, "1 2")


def test_two_runs_of_one_seed_in_one_setting_are_refused_naming_both(tmp_path):
    with pytest.raises(DataError) as err:
        summarize([_run("a-s1", 0.8), _run("a-s2", 0.8), _run("a-s01", 0.9)])
    assert str(err.value) == "setting a has two runs of seed 1: a-s1 and a-s01"
    for name in ("a-s1", "a-s01"):
        _folder(tmp_path, name, 0.8)
    with pytest.raises(DataError, match=f"seed 1: {tmp_path}/a-s01 and {tmp_path}/a-s1$"):
        summarize(load_runs([str(tmp_path)]))
