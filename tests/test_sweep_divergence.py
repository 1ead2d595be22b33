"""`hvdtrain sweep` and a run the divergence guard stopped: a row marked diverged, the
sweep goes on, and every table and plot says so (`hvdtrain compare`: test_compare.py)."""

from __future__ import annotations

import csv
import json
import os
import subprocess

import pytest

from hvdtrain.benchmarks import experiments
from hvdtrain.benchmarks.diverged_runs import MARKER, first_error, mark_diverged, read_marker
from hvdtrain.benchmarks.experiments import add_time_to_target, format_table
from hvdtrain.benchmarks.learning_curves import load_curve, plot_runs
from hvdtrain.benchmarks.predicted_speedup import examples_to_target
from hvdtrain.benchmarks.round_form import RoundForm
from hvdtrain.benchmarks.seeds import format_settings_table, summarize_seeds
from hvdtrain.cli import main
from hvdtrain.errors import DataError

from helpers import finished_sweep_run

GUARD_LINE = ("training diverged at step 22: the training loss averaged over the last 20 "
              "steps, 24, is above 10 times where training started, 2.3 (peak learning rate "
              "0.2 for a global batch of 1024); try --lr-scaling sqrt")


def _job_log(log_path: str, *errors: str) -> None:
    with open(log_path, "w") as fh:
        fh.write("Epoch 1/1\n")
        fh.writelines(f"[{rank}]<stderr>:hvdtrain: error: {line}\n"
                      for rank, line in enumerate(errors))


def _fake_jobs(outcomes: dict[str, int], trained: list[str]):
    """A run_job that trains nothing: by run name, exit 0 leaves a finished run folder,
    exit 4 a folder the guard stopped (a config, an evaluation, no summary) and the
    guard's line in the log, anything else a log with a failure's line."""
    def run_job(command, log_path):
        run_dir = command[command.index("--out") + 1]
        name = os.path.basename(run_dir)
        trained.append(name)
        code = outcomes[name]
        if code == 0:
            finished_sweep_run(run_dir, seed=int(name[-1]), accuracy=0.80)
        elif code == 4:
            os.makedirs(run_dir)
            with open(os.path.join(run_dir, "config.yaml"), "w") as fh:
                fh.write("mode: sync\n")
            _job_log(log_path, GUARD_LINE, "training diverged at step 22: the same")
        else:
            _job_log(log_path, "cannot read /data/train-images-idx3-ubyte.gz")
        return subprocess.CompletedProcess(command, code)
    return run_job


def test_a_run_the_guard_stopped_is_a_diverged_row_and_the_sweep_goes_on(tmp_path, capsys,
                                                                          monkeypatch):
    out, trained = tmp_path / "sweep", []
    monkeypatch.setattr(experiments, "run_job", _fake_jobs({"w1-s1": 4, "w1-s2": 0}, trained))
    argv = ["sweep", "--out", str(out), "--workers", "1", "--seeds", "1,2", "--window", "2"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert trained == ["w1-s1", "w1-s2"]  # the run after the divergence trained too
    assert f"sweep run w1-s1 diverged ({GUARD_LINE}); the sweep goes on" in printed
    assert "| w1-s1 | 1 | – | cold | diverged at step 22 | – | – | – |" in printed
    assert "| w1 | 1 | – | cold | 1 2 | 80.00% ± 0.00% (1 of 2 diverged; mean of the 1 " \
           "that finished) |" in printed
    # It diverged before steps.jsonl got a line: left out of the plots, named.
    assert "w1-s1 diverged at step 22 before its first logged step" in printed
    assert (out / "training_error_vs_steps.png").exists()
    assert read_marker(str(out / "runs" / "w1-s1")) == {"reason": GUARD_LINE, "step": 22}
    report = json.loads((out / "sweep.json").read_text())
    diverged, finished = report["runs"]
    assert (diverged["status"], diverged["diverged_step"], diverged["test_accuracy"]) == (
        "diverged", 22, "")
    assert (finished["status"], finished["test_accuracy"]) == ("finished", 0.80)
    assert report["settings"][0]["diverged"] == 1
    with open(out / "sweep.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["status"], r["diverged_step"]) for r in rows] == [("diverged", "22"),
                                                                 ("finished", "")]
    assert rows[0]["diverged_reason"] == GUARD_LINE

    # Started again, the sweep trains neither: one finished, the other diverged.
    assert main(argv) == 0
    assert trained == ["w1-s1", "w1-s2"] and "sweep run" not in capsys.readouterr().out
    assert json.loads((out / "sweep.json").read_text())["runs"] == report["runs"]


def test_any_other_failed_run_still_stops_the_sweep_with_its_line(tmp_path, capsys,
                                                                  monkeypatch):
    out, trained = tmp_path / "sweep", []
    monkeypatch.setattr(experiments, "run_job", _fake_jobs({"w1-s1": 3, "w1-s2": 0}, trained))
    assert main(["sweep", "--out", str(out), "--workers", "1", "--seeds", "1,2"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"hvdtrain: error: sweep run w1-s1 failed (exit 3): cannot read "
                   f"/data/train-images-idx3-ubyte.gz; log: {out / 'runs' / 'w1-s1.log'}")
    assert trained == ["w1-s1"] and not (out / "sweep.json").exists()
    assert not (out / "runs" / "w1-s1" / MARKER).exists()


@pytest.mark.parametrize("line, step", [
    (GUARD_LINE, 22),
    ("loss is nan at step 3; stopping. Last good checkpoint: none", 3),
    ("weights are not finite at step 40; not saving. Last good checkpoint: none", 40),
])
def test_the_marker_holds_the_first_workers_line_and_its_step(tmp_path, line, step):
    log = str(tmp_path / "run.log")
    _job_log(log, line, "worker 0 lost a peer after step 41")
    assert first_error(log) == line
    assert mark_diverged(str(tmp_path / "run"), log) == {"reason": line, "step": step}
    assert os.listdir(tmp_path / "run") == [MARKER]  # no temporary file left beside it
    assert read_marker(str(tmp_path / "run")) == {"reason": line, "step": step}


def test_a_marker_without_a_line_has_no_step_and_a_broken_one_is_one_line(tmp_path):
    marker = mark_diverged(str(tmp_path / "run"), str(tmp_path / "missing.log"))
    assert marker["step"] is None and "exit 4 without an error line" in marker["reason"]
    assert read_marker(str(tmp_path)) is None
    (tmp_path / "run" / MARKER).write_text("{")
    with pytest.raises(DataError, match=f"{MARKER} is not JSON .*delete it to train the run"):
        read_marker(str(tmp_path / "run"))


def _eval_folder(folder, accuracy, summary: dict | None):
    """A run folder with one evaluation at 10 s, and a summary if the run finished."""
    os.makedirs(folder)
    with open(os.path.join(folder, "metrics.jsonl"), "w") as fh:
        fh.write(json.dumps({"eval": True, "step": 10, "examples": 640, "train_seconds": 10.0,
                             "bytes_allreduced": 1000, "test_accuracy": accuracy}) + "\n")
    if summary is not None:
        with open(os.path.join(folder, "summary.json"), "w") as fh:
            json.dump(summary, fh)
    return str(folder)


def _sweep_row(name, workers, mode, accuracy, diverged_step=None):
    row = {"name": name, "workers": workers, "mode": mode, "n_sync": "", "start": "cold",
           "status": "finished", "diverged_step": "", "test_accuracy": accuracy,
           "final_training_error": 0.1, "wall_seconds": 30.0, "bytes_allreduced": 8e6}
    if diverged_step is not None:
        row.update(status="diverged", diverged_step=diverged_step, test_accuracy="",
                   final_training_error="", wall_seconds="", bytes_allreduced="")
    return row


def test_a_diverged_sync_run_reaches_no_target_and_sets_no_default(tmp_path):
    summary = {"test_accuracy": 0.88, "wall_seconds": 20.0, "examples_trained": 1280,
               "bytes_allreduced": 2000}
    # The diverged run passed 95% at its evaluation before it blew up.
    dirs = [_eval_folder(tmp_path / "w4-sync-s1", 0.70, summary),
            _eval_folder(tmp_path / "w4-sync-s2", 0.95, None),
            _eval_folder(tmp_path / "w1", 0.70, dict(summary, test_accuracy=0.91))]
    rows = [_sweep_row("w4-sync-s1", 4, "sync", 0.88), _sweep_row("w4-sync-s2", 4, "sync", "", 22),
            _sweep_row("w1", 1, "sync", 0.91)]
    add_time_to_target(rows, dirs, None)
    assert rows[0]["target"] == pytest.approx(0.87)  # the finished seed's 88% alone
    assert rows[0]["seconds_to_target"] == 20.0
    assert (rows[1]["target"], rows[1]["seconds_to_target"]) == (rows[0]["target"], "")
    # Where every sync run of a count diverged, the one-worker run sets its target.
    add_time_to_target(rows[1:], dirs[1:], None)
    assert rows[1]["target"] == pytest.approx(0.90) and rows[1]["examples_to_target"] == ""
    assert "| w4-sync-s2 | 4 | – | cold | diverged at step 22 | – | – | – | 90.00% | – | – | – |" \
        in format_table(rows, 400)
    # `hvdtrain predict --time-to-target` reads the sweep's rows: the diverged one is not a setup.
    add_time_to_target(rows, dirs, 0.85)
    reached = examples_to_target({"runs": rows})
    sync4, sync1 = ("sync", 1, 4, "cold", RoundForm()), ("sync", 1, 1, "cold", RoundForm())
    assert reached.examples == {sync4: 1280, sync1: 1280}
    # The diverged seed is a run of its setup that never reached the target.
    assert reached.reached == {sync4: (1, 2), sync1: (1, 1)}


def test_a_setting_counts_its_diverged_seeds_and_averages_the_finished_ones():
    rows = [dict(_sweep_row(f"w8-sync-s{seed}", 8, "sync", acc, step), setting="w8-sync", seed=seed)
            for seed, acc, step in ((1, 0.80, None), (2, "", 14), (3, 0.84, None))]
    rows += [dict(_sweep_row(f"w8-big-s{seed}", 8, "sync", "", 9), setting="w8-big", seed=seed)
             for seed in (1, 2)]
    sync, big = summarize_seeds(rows)
    assert (sync["runs"], sync["diverged"], sync["seeds"]) == (3, 1, "1 2 3")
    assert sync["test_accuracy_mean"] == pytest.approx(0.82)
    assert (big["diverged"], big["test_accuracy_mean"], big["test_accuracy_ci95"]) == (2, "", "")
    table = format_settings_table([sync, big])
    assert "| 1 2 3 | 82.00% ± " in table
    assert "(1 of 3 diverged; mean of the 2 that finished) |" in table
    assert table.endswith("| w8-big | 8 | – | cold | 1 2 | all 2 diverged | – |")  # no target


def _steps_folder(folder, steps: int, marker: str | None):
    os.makedirs(folder)
    (folder / "config.yaml").write_text("mode: sync\n")
    with open(folder / "steps.jsonl", "w") as fh:
        fh.writelines(json.dumps({"step": s, "examples": 8 * s, "loss": 1.0, "error": 0.5,
                                  "wall_seconds": 0.1 * s}) + "\n" for s in range(1, steps + 1))
    if marker is not None:
        _job_log(str(folder) + ".log", marker)
        mark_diverged(str(folder), str(folder) + ".log")
    return str(folder)


def test_a_diverged_runs_curve_is_drawn_to_its_last_logged_step_and_labelled(tmp_path, capsys):
    late = _steps_folder(tmp_path / "late", 40, "training diverged at step 55: loss 24")
    early = _steps_folder(tmp_path / "early", 0, GUARD_LINE)
    assert load_curve(late).label == "1 worker (diverged at step 55)"
    written = plot_runs([late, early], str(tmp_path / "plots"), window=5)
    assert "early diverged at step 22 before its first logged step" in capsys.readouterr().out
    with open(tmp_path / "plots" / "training_error_vs_steps.csv", newline="") as fh:
        table = list(csv.DictReader(fh))
    assert {r["label"] for r in table} == {"1 worker (diverged at step 55)"}
    assert max(int(r["step"]) for r in table) == 40 and written
    # Only runs without a logged step: `hvdtrain plot` says so in one line.
    assert main(["plot", early, "--out", str(tmp_path / "none")]) == 3
    assert capsys.readouterr().err.strip() == f"hvdtrain: error: no run in {early} logged a " \
                                              "step to plot"


@pytest.mark.long  # a sweep of 13 seconds here
@pytest.mark.slow
def test_a_real_sweep_records_a_diverging_run_and_tabulates_the_finished_one(tmp_path, capsys,
                                                                              idx_dataset_dir):
    # Seed 1 finished in an earlier sweep; seed 2 trains now, in a job of its own, at a
    # rate of 1e9, uncapped, and its loss stops being finite within its first steps.
    out = tmp_path / "sweep"
    finished_sweep_run(str(out / "runs" / "w1-s1"), seed=1, accuracy=0.80)
    argv = ["sweep", "--out", str(out), "--workers", "1", "--seeds", "1,2", "--window", "2",
            "--model", "lenet", "--batch-size", "16", "--epochs", "1", "--steps-per-epoch", "8",
            "--base-lr", "1e9", "--max-lr", "0", "--warmup-epochs", "0", "--no-validate",
            "--data-dir", idx_dataset_dir]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    marker = read_marker(str(out / "runs" / "w1-s2"))
    assert marker is not None and f"at step {marker['step']}" in marker["reason"], printed
    rows = {r["name"]: r for r in json.loads((out / "sweep.json").read_text())["runs"]}
    assert (rows["w1-s1"]["status"], rows["w1-s2"]["status"]) == ("finished", "diverged")
    assert f"| w1-s2 | 1 | – | cold | diverged at step {marker['step']} |" in printed
    assert main(argv) == 0 and "sweep run" not in capsys.readouterr().out
