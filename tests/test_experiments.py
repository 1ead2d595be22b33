"""`hvdtrain sweep` and `hvdtrain plot`: the grid, the curves, the files, one real sweep."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest
import yaml

from hvdtrain.benchmarks import experiments
from hvdtrain.benchmarks.experiments import GridRun, _failure, grid, saved_round_form
from hvdtrain.config import TrainConfig, load_config
from hvdtrain.errors import ConfigError
from hvdtrain.benchmarks.learning_curves import (Curve, load_curve, panels, plot_runs,
                                                 run_folders, smoothed_rows, thinned)
from hvdtrain.cli import build_parser, main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_grid_has_one_reference_run_for_one_worker_and_every_combination_above():
    runs = grid([1, 2, 4], [10, 100], ["cold", "warm"])
    assert runs[0] == GridRun("w1", 1, None, "cold")
    assert [r.name for r in runs[1:5]] == ["w2-n10-cold", "w2-n10-warm", "w2-n100-cold",
                                           "w2-n100-warm"]
    assert len(runs) == 1 + 2 * 2 * 2
    assert grid([2, 2], [10, 10], ["warm", "warm"]) == [GridRun("w2-n10-warm", 2, 10, "warm")]
    assert [r.name for r in grid([2], [10], ["cold", "warm", "single"])] == [
        "w2-n10-cold", "w2-n10-warm", "w2-n10-single"]


def test_async_runs_join_the_grid_with_their_own_names():
    runs = grid([1, 2], [50], ["cold"], modes=("local", "async"))
    assert [(r.name, r.mode) for r in runs[1:]] == [("w2-n50-cold", "local"),
                                                    ("w2-async-n50-cold", "async")]
    assert runs[2].train_options(500) == ["--mode", "async", "--n-sync", "50"]
    curve = Curve("w2-async-n50-cold", 2, "async", 50, 0)
    assert curve.label == "2 workers, async, n_sync 50"


def test_periods_that_differ_only_in_their_colons_get_run_folders_of_their_own():
    periods = experiments.parse_period_list("link:15,link:1:5,qsr:1:15,qsr:11:5")
    assert [r.name for r in grid([8], periods, ["cold"])] == [
        "w8-nlink-cold", "w8-nlink1-5-cold", "w8-nqsr1-15-cold", "w8-nqsr11-5-cold"]


def test_a_sweep_refuses_two_runs_of_one_folder_before_any_trains(tmp_path):
    """One period spelt twice would be one run folder: the sweep would train the first and
    give the second its results."""
    from hvdtrain.benchmarks.experiments import check_runs

    base = load_config(None, {"mode": "local"})
    for periods, mode, folder in ((["link", "link:15"], "local", "w4-nlink-cold"),
                                  ([10, "link:15", "auto", "link:15:8"], "local", "w4-nlink-cold"),
                                  (["auto", "auto:32"], "async", "w4-async-nauto-cold")):
        runs = grid([4], periods, ["cold"], (mode,))
        with pytest.raises(ConfigError, match=rf"^sweep runs of --n-sync \S+ and \S+ would "
                                              rf"share the run folder runs/{folder}: they are "
                                              rf"one period, give it once; nothing has trained$"):
            check_runs(runs, base, 50, str(tmp_path / "sweep"))
    assert not (tmp_path / "sweep").exists()


def _run_folder(path, config: dict, summary: dict):
    path.mkdir()
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    (path / "summary.json").write_text(json.dumps(summary))
    (path / "steps.jsonl").write_text(json.dumps({"step": 1, "wall_seconds": 0.1, "error": 0.9}) + "\n")
    return str(path)


def test_a_hierarchical_run_is_told_from_a_flat_one_of_its_period_in_the_plots(tmp_path):
    flat = load_curve(_run_folder(tmp_path / "flat", {"mode": "local", "n_sync": 10}, {"workers": 8}))
    hier = load_curve(_run_folder(tmp_path / "hier", {"mode": "local", "n_sync": "40/hosts",
                                                      "hierarchical_sgd": True},
                                  {"workers": 8, "hosts": 4}))
    assert flat.label == "8 workers, n_sync 10"
    assert hier.label == "8 workers, hierarchical, n_sync 10"  # 40/hosts on its 4 hosts


def test_hierarchical_runs_start_cold_count_hosts_and_train_with_the_flag():
    runs = grid([4], [10, "40/hosts"], ["cold", "warm"], modes=("local", "hlocal"), slots=2)
    # Flat local runs leave N/hosts out; hierarchical ones resolve it for 2 hosts of 2.
    assert [(r.name, r.n_sync, r.start) for r in runs] == [
        ("w4-n10-cold", 10, "cold"), ("w4-n10-warm", 10, "warm"),
        ("w4-hlocal-n10-cold", 10, "cold"), ("w4-hlocal-n20-cold", 20, "cold")]
    assert runs[3].train_options(500) == ["--mode", "local", "--n-sync", "20", "--hierarchical-sgd"]
    hasync = grid([2], ["10/hosts"], ["cold"], modes=("hasync",))
    assert [(r.name, r.n_sync) for r in hasync] == [("w2-hasync-n10-cold", 10)]  # one host
    assert hasync[0].train_options(500)[:2] == ["--mode", "async"]


def test_grid_runs_become_train_options():
    assert GridRun("w1", 1, None, "cold").train_options(500)[:2] == ["--mode", "sync"]
    assert GridRun("w2-n10-cold", 2, 10, "cold").train_options(500) == [
        "--mode", "local", "--n-sync", "10"]
    assert GridRun("w2-n10-warm", 2, 10, "warm").train_options(500) == [
        "--mode", "local", "--n-sync", "10", "--warm-start-steps", "500", "--warm-start", "sync"]
    assert GridRun("w2-n10-single", 2, 10, "single").train_options(500) == [
        "--mode", "local", "--n-sync", "10", "--warm-start-steps", "500", "--warm-start", "single"]


def test_a_sweeps_sync_run_drops_the_outer_optimizer_its_local_runs_share():
    # Sync refuses an outer optimizer, so a sweep's shared --outer-optimizer is for its
    # local runs only: its sync run must still get a valid config.
    options = GridRun("w8-sync", 8, None, "cold").train_options(500)
    args = build_parser().parse_args(["train", *options])
    cli = {name: getattr(args, name) for name in TrainConfig.field_names() if hasattr(args, name)}
    cfg = load_config(None, {"outer_optimizer": "slowmo", "outer_momentum": 0.5, **cli})
    assert (cfg.mode, cfg.outer_optimizer, cfg.outer_momentum) == ("sync", "none", 0.0)


def _curve(name, workers, n_sync=1, warm=0, errors=(0.9, 0.7, 0.5, 0.3), warm_start="sync"):
    mode = "local" if workers > 1 else "sync"
    return Curve(name, workers, mode, n_sync, warm, warm_start,
                 step=list(range(1, len(errors) + 1)),
                 wall_seconds=[0.5 * i for i in range(1, len(errors) + 1)], error=list(errors))


def test_curves_are_labelled_and_split_into_a_panel_per_start():
    one, cold, warm = _curve("w1", 1), _curve("c", 2, 100), _curve("w", 2, 100, warm=50)
    single = _curve("s", 2, 100, warm=50, warm_start="single")
    assert (one.label, cold.label, warm.label) == ("1 worker", "2 workers, n_sync 100",
                                                   "2 workers, n_sync 100")
    assert (cold.start, warm.start, single.start) == ("cold", "warm", "single")
    # The one-worker reference appears in every panel.
    assert panels([one, cold, warm]) == [("cold start", [one, cold]),
                                         ("warm start: synchronous steps first", [one, warm])]
    assert [title for title, _ in panels([single, one, cold])] == [
        "cold start", "warm start: one worker's steps first"]
    assert panels([one, cold]) == [("", [one, cold])]


def test_thinning_spreads_points_evenly_and_keeps_the_last():
    assert thinned(10, 500) == list(range(10))
    picked = thinned(10_000, 500)
    assert len(picked) == 501 and picked[0] == 0 and picked[-1] == 9_999
    assert picked == sorted(set(picked))


def test_smoothed_rows_hold_the_sliding_mean_along_either_axis():
    rows = smoothed_rows([_curve("c", 2, 10)], window=2, axis="steps")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["smoothed_error"] for r in rows] == pytest.approx([0.9, 0.8, 0.6, 0.4])
    assert rows[0]["n_sync"] == 10 and rows[0]["start"] == "cold" and rows[0]["run"] == "c"
    by_time = smoothed_rows([_curve("w1", 1)], window=2, axis="time")
    assert [r["wall_seconds"] for r in by_time] == [0.5, 1.0, 1.5, 2.0]
    assert by_time[0]["n_sync"] == ""


def _write_run(folder, workers, mode, n_sync, warm, errors, batch_size=32):
    """A run folder as `hvdtrain train` writes it; batch_size None: a steps.jsonl from
    before it counted the examples."""
    os.makedirs(folder)
    with open(os.path.join(folder, "config.yaml"), "w") as fh:
        yaml.safe_dump({"mode": mode, "n_sync": n_sync, "warm_start_steps": warm}, fh)
    with open(os.path.join(folder, "summary.json"), "w") as fh:
        json.dump({"workers": workers}, fh)
    with open(os.path.join(folder, "steps.jsonl"), "w") as fh:
        for i, error in enumerate(errors, start=1):
            examples = {} if batch_size is None else {"examples": i * workers * batch_size}
            fh.write(json.dumps({"step": i, **examples, "loss": 2 * error, "error": error,
                                 "wall_seconds": 0.1 * i}) + "\n")
        fh.write('{"step": 99, "lo')  # a line cut short by a crash is skipped


def test_a_step_written_twice_keeps_its_later_record(tmp_path):
    run = str(tmp_path / "run")
    _write_run(run, 2, "local", 10, 0, [0.5, 0.4, 0.3])
    with open(os.path.join(run, "steps.jsonl"), "a") as fh:  # an elastic job ran 2-3 again
        fh.write("\n" + "\n".join(json.dumps({"step": s, "loss": 0, "error": e, "wall_seconds": w})
                                  for s, e, w in ((2, 0.35, 0.9), (3, 0.25, 1.0))) + "\n")
    curve = load_curve(run)
    assert curve.step == [1, 2, 3]
    assert curve.error == [0.5, 0.35, 0.25] and curve.wall_seconds == [0.1, 0.9, 1.0]


def test_plot_draws_pngs_and_writes_the_tables_behind_them(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    errors = [0.9 - 0.0005 * i for i in range(1200)]
    _write_run(str(sweep / "runs" / "w1"), 1, "sync", 100, 0, errors)
    _write_run(str(sweep / "runs" / "w2-n10-cold"), 2, "local", 10, 0, errors[:600])
    _write_run(str(sweep / "runs" / "w2-n10-warm"), 2, "local", 10, 50, errors[:600])
    curve = load_curve(str(sweep / "runs" / "w2-n10-warm"))
    assert (curve.workers, curve.n_sync, curve.start, len(curve.step)) == (2, 10, "warm", 600)

    assert main(["plot", str(sweep), "--window", "100", "--out", str(tmp_path / "plots")]) == 0
    assert "training_error_vs_steps.png" in capsys.readouterr().out
    for axis in ("steps", "time", "examples"):
        png = (tmp_path / "plots" / f"training_error_vs_{axis}.png").read_bytes()
        assert png.startswith(PNG_MAGIC) and len(png) > 10_000
        with open(tmp_path / "plots" / f"training_error_vs_{axis}.csv", newline="") as fh:
            table = list(csv.DictReader(fh))
        assert {r["run"] for r in table} == {"w1", "w2-n10-cold", "w2-n10-warm"}
        assert all(0.0 <= float(r["smoothed_error"]) <= 1.0 for r in table)
        # At most 500 points (plus the last) per run.
        assert sum(r["run"] == "w1" for r in table) == 501
    with open(tmp_path / "plots" / "training_error_vs_steps.csv", newline="") as fh:
        last_w1 = [r for r in csv.DictReader(fh) if r["run"] == "w1"][-1]
    assert float(last_w1["smoothed_error"]) == pytest.approx(sum(errors[-100:]) / 100)
    # Against examples, the 2-worker runs' steps count twice: 600 steps of 2 x 32.
    with open(tmp_path / "plots" / "training_error_vs_examples.csv", newline="") as fh:
        last = {r["run"]: int(r["examples"]) for r in csv.DictReader(fh)}
    assert last == {"w1": 1200 * 32, "w2-n10-cold": 600 * 64, "w2-n10-warm": 600 * 64}


def test_runs_whose_steps_do_not_count_examples_get_no_examples_plot(tmp_path):
    errors = [0.5] * 20
    _write_run(str(tmp_path / "old"), 2, "local", 10, 0, errors, batch_size=None)
    written = plot_runs([str(tmp_path / "old")], str(tmp_path / "plots"), window=5)
    assert [os.path.basename(p) for p in written if p.endswith(".png")] == [
        "training_error_vs_steps.png", "training_error_vs_time.png"]


def test_plot_rejects_folders_without_steps_and_bad_windows_in_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["plot", str(tmp_path / "empty")]) == 3
    assert "is not an hvdtrain run folder with steps.jsonl" in capsys.readouterr().err
    assert main(["plot", str(tmp_path / "missing")]) == 3
    assert f"run folder not found: {tmp_path / 'missing'}" in capsys.readouterr().err
    _write_run(str(tmp_path / "run"), 1, "sync", 1, 0, [0.5, 0.4])
    assert main(["plot", str(tmp_path / "run"), "--window", "0"]) == 2
    err = capsys.readouterr().err
    assert "--window must be a positive number of minibatches, got 0" in err
    assert len(err.strip().splitlines()) == 1
    assert run_folders([str(tmp_path / "run")]) == [str(tmp_path / "run")]


@pytest.mark.parametrize("argv, message", [
    (["--workers", "1,0"], "--workers must be positive integers separated by commas, got '1,0'"),
    (["--n-sync", "ten"], "--n-sync takes periods separated by commas, got 'ten': 'ten' is none"),
    (["--start", "cold,hot"],
     "--start takes a comma-separated list of cold, warm, single; got 'hot'"),
    (["--start", "single", "--warm-start-steps", "0"],
     "--warm-start-steps must be positive for a warm or single start, got 0"),
    (["--window", "-5"], "--window must be a positive number of minibatches, got -5"),
    (["--batch-size", "0"], "--batch-size must be a positive integer"),
    (["--hostfile", "/nonexistent"], "--hostfile not found: /nonexistent"),
    (["--hosts", "2", "--workers", "2,4"], "--workers 4 needs as many hosts, one worker each"),
    (["--hosts", "2", "--hostfile", __file__], "--hosts makes its own emulated hosts"),
])
def test_bad_sweep_options_exit_non_zero_before_any_run(argv, message, tmp_path, capsys):
    assert main(["sweep", "--out", str(tmp_path / "sweep"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "sweep" / "runs").exists()


@pytest.mark.parametrize("shared, modes, refused", [
    (["--no-epoch-rounds"], "sync,local,async",
     "w2-async-n2-cold (async) would be refused: --epoch-rounds needs --mode local"),
    (["--optimizer", "lamb", "--rescale-rounds"], "local,hlocal",
     "w2-hlocal-n2-cold (hlocal) would be refused: --rescale-rounds needs blocking flat rounds "
     "of the whole model, got --hierarchical-sgd"),
    (["--outer-optimizer", "slowmo", "--outer-momentum", "0.5"], "local,async",
     "w2-async-n2-cold (async) would be refused: --mode async takes the plain average"),
])
def test_a_run_its_mode_refuses_stops_the_sweep_before_any_run_trains(shared, modes, refused,
                                                                        tmp_path, capsys,
                                                                        monkeypatch):
    # Local mode takes each of these shared options; the later runs' modes do not.
    trained = []
    monkeypatch.setattr(experiments, "run_job", lambda command, log_path: trained.append(
        command) or subprocess.CompletedProcess(command, 1))
    out = tmp_path / "sweep"
    assert main(["sweep", "--out", str(out), "--workers", "1,2", "--n-sync", "2,10", "--start",
                 "cold", "--modes", modes, *shared]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"hvdtrain: error: sweep run {refused}") and len(err.splitlines()) == 1
    mode = refused.split("(")[1].split(")")[0]
    assert err.endswith(f"; nothing has trained: change the shared options, or leave {mode} "
                        f"out of --modes")
    assert trained == [] and not out.exists()


def test_every_grid_run_is_loaded_as_its_own_train_command_loads_it(tmp_path):
    from hvdtrain.benchmarks.experiments import check_runs, run_config, train_argv, train_parser
    from hvdtrain.config_options import config_of

    # Sync runs put back what local runs share and sync refuses; the others take it.
    base = load_config(None, {"mode": "local", "outer_optimizer": "slowmo",
                              "outer_momentum": 0.5, "seed": 7})
    runs = grid([1, 4], [2], ["cold", "warm"], ("sync", "local", "hlocal"), slots=2)
    check_runs(runs, base, 50, str(tmp_path / "sweep"))
    assert not (tmp_path / "sweep").exists()  # checking writes nothing there
    base.save_yaml(str(tmp_path / "base.yaml"))
    parser = train_parser()
    configs = {run.run_name: run_config(parser, run, str(tmp_path / "base.yaml"), 50,
                                        str(tmp_path / run.run_name)) for run in runs}
    # The CLI's own train command reads each run's words alike.
    assert configs == {run.run_name: config_of(build_parser().parse_args(train_argv(
        run, str(tmp_path / "base.yaml"), 50, str(tmp_path / run.run_name)))) for run in runs}
    assert {name: (cfg.mode, cfg.outer_optimizer, cfg.hierarchical_sgd, cfg.warm_start_steps)
            for name, cfg in configs.items()} == {
        "w1": ("sync", "none", False, 0), "w4-sync": ("sync", "none", False, 0),
        "w4-n2-cold": ("local", "slowmo", False, 0), "w4-n2-warm": ("local", "slowmo", False, 50),
        "w4-hlocal-n2-cold": ("local", "slowmo", True, 0)}
    assert {cfg.seed for cfg in configs.values()} == {7}
    assert configs["w4-n2-cold"].out == str(tmp_path / "w4-n2-cold")


@pytest.mark.ci
@pytest.mark.long
@pytest.mark.multiprocess
def test_sweep_trains_the_grid_then_tabulates_and_plots_it(tmp_path, idx_dataset_dir):
    out = tmp_path / "sweep"
    bin_dir = os.path.dirname(sys.executable)
    command = [os.path.join(bin_dir, "hvdtrain"), "sweep", "--out", str(out), "--workers", "1,2",
               "--n-sync", "4", "--start", "cold,warm,single", "--warm-start-steps", "2",
               "--window", "4",
               "--model", "lenet", "--batch-size", "16", "--epochs", "1", "--steps-per-epoch", "8",
               "--no-validate", "--checkpoint-every", "1000epochs", "--data-dir", idx_dataset_dir]
    env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"])
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "sweep.json").read_text())
    rows = {r["name"]: r for r in report["runs"]}
    assert list(rows) == ["w1", "w2-n4-cold", "w2-n4-warm", "w2-n4-single"]
    for row in rows.values():
        assert 0.0 <= row["test_accuracy"] <= 1.0 and 0.0 <= row["final_training_error"] <= 1.0
        assert row["total_steps"] == 8 and row["wall_seconds"] > 0
    assert rows["w1"]["bytes_allreduced"] == 0 and rows["w1"]["n_sync"] == ""
    # Each row says how its rounds travelled: local mode's default int8, none for sync.
    assert [(r["round_fragments"], r["round_compression"]) for r in rows.values()] == [
        (1, "none"), (1, "int8"), (1, "int8"), (1, "int8")]
    # Warm: 2 synchronous steps of gradients, then rounds of weights; cold: rounds only.
    assert rows["w2-n4-warm"]["bytes_allreduced"] > rows["w2-n4-cold"]["bytes_allreduced"] > 0
    # Single: no gradients, rounds at steps 2 (hand-over), 6 and 8; cold: at 4 and 8.
    assert 2 * rows["w2-n4-single"]["bytes_allreduced"] == 3 * rows["w2-n4-cold"]["bytes_allreduced"]
    with open(out / "sweep.csv", newline="") as fh:
        assert [r["name"] for r in csv.DictReader(fh)] == list(rows)
    for name in ("training_error_vs_steps", "training_error_vs_time", "training_error_vs_examples"):
        assert (out / f"{name}.png").read_bytes().startswith(PNG_MAGIC)
        with open(out / f"{name}.csv", newline="") as fh:
            assert {r["run"] for r in csv.DictReader(fh)} == set(rows)
    config = yaml.safe_load((out / "runs" / "w2-n4-warm" / "config.yaml").read_text())
    assert (config["mode"], config["n_sync"], config["warm_start_steps"]) == ("local", 4, 2)
    single = yaml.safe_load((out / "runs" / "w2-n4-single" / "config.yaml").read_text())
    assert (single["warm_start"], single["warm_start_steps"]) == ("single", 2)

    # Started again, a finished sweep trains nothing and rewrites its tables.
    again = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 0 and "sweep run" not in again.stdout


def test_a_failed_sweep_run_is_reported_by_its_first_error_the_cause(tmp_path):
    log = tmp_path / "w8.log"
    log.write_text("[4]<stderr>:hvdtrain: error: loss is nan at step 82; stopping.\n"
                   "[0]<stderr>:hvdtrain: error: worker 0 lost a peer after step 88: ...\n")
    error = _failure(GridRun("w8", 8, 10, "cold"), 1, str(log))
    assert "failed (exit 1): loss is nan at step 82" in str(error)
    assert "lost a peer" not in str(error)


def test_a_sync_runs_curve_has_the_period_of_one_step_whatever_its_config_saved(tmp_path):
    _write_run(str(tmp_path / "sync"), 4, "sync", None, 0, [0.5, 0.4])  # n_sync: null
    assert load_curve(str(tmp_path / "sync")).n_sync == 1
    _write_run(str(tmp_path / "local"), 4, "local", "40/workers", 0, [0.5, 0.4])
    assert load_curve(str(tmp_path / "local")).n_sync == 10  # the rule's steps at 4 workers


@pytest.mark.parametrize("options, form", [
    ({"optimizer": "sgd"}, (1, "int8")),                                  # local's default
    ({"optimizer": "lamb"}, (1, "int4")),                                 # rescaled rounds
    ({"optimizer": "sgd", "round_compression": "none", "fp16_allreduce": True}, (1, "fp16")),
    ({"optimizer": "sgd", "round_fragments": 4}, (4, "int8")),
])
def test_a_sweep_row_gives_the_form_its_runs_rounds_travelled_in(tmp_path, options, form):
    config = load_config(None, {"mode": "local", "batch_size": 64, **options}).resolved()
    config.save_yaml(str(tmp_path / "config.yaml"))
    saved = saved_round_form(str(tmp_path))
    assert (saved["round_fragments"], saved["round_compression"]) == form


def test_a_sweep_row_of_a_run_that_saved_no_config_leaves_its_form_blank(tmp_path):
    assert saved_round_form(str(tmp_path)) == {"round_fragments": "", "round_compression": ""}



def test_a_warm_start_as_long_as_a_run_at_the_most_workers_stops_the_sweep_before_any_run(
        tmp_path, capsys, monkeypatch, idx_dataset_dir):
    # 512 training examples at 16 a worker: 16 steps at 2 workers, 8 at 4. A warm start of
    # 10 steps leaves local steps at 2 workers and none at 4: refused before anything trains.
    trained = []
    monkeypatch.setattr(experiments, "run_job", lambda command, log_path: trained.append(
        command) or subprocess.CompletedProcess(command, 1))
    out = tmp_path / "sweep"
    assert main(["sweep", "--out", str(out), "--workers", "2,4", "--n-sync", "2", "--start",
                 "cold,warm", "--warm-start-steps", "10", "--data-dir", idx_dataset_dir,
                 "--batch-size", "16", "--epochs", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("hvdtrain: error: sweep run w4-n2-warm (local) would be refused: "
                   "--warm-start-steps 10 leaves no local steps in a run of 8 steps at 4 "
                   "workers; nothing has trained: change the shared options, or leave local "
                   "out of --modes")
    assert trained == [] and not out.exists()


def test_a_default_period_run_trains_without_n_sync_and_its_row_gives_the_settled_period(
        tmp_path):
    """`--n-sync default` in a sweep: each run takes the period `hvdtrain train` settles
    for its job, so its command gives none, and its row reads the period from plan.json."""
    from hvdtrain.benchmarks.experiments import _settled_period, parse_period_list

    periods = parse_period_list("default,10")
    runs = grid([4], periods, ["cold"], ("local", "async"))
    assert [r.name for r in runs] == ["w4-ndefault-cold", "w4-n10-cold",
                                      "w4-async-ndefault-cold", "w4-async-n10-cold"]
    default_local = runs[0].train_options(0)
    assert "--n-sync" not in default_local and default_local[:2] == ["--mode", "local"]
    assert runs[1].train_options(0)[:4] == ["--mode", "local", "--n-sync", "10"]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "plan.json").write_text(json.dumps({"period": 2}))
    assert _settled_period(runs[0], str(run_dir)) == {"n_sync": 2}
    assert _settled_period(runs[1], str(run_dir)) == {}
    with pytest.raises(ConfigError, match="'defaults' is none"):
        parse_period_list("defaults")
