import dataclasses
import json
import math
import os
import subprocess
import sys

import pytest
import yaml

from hvdtrain.cli import build_parser, main
from hvdtrain.config import TrainConfig


def test_help_documents_every_option_with_its_default(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # no line wrapping inside hyphenated words
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for f in dataclasses.fields(TrainConfig):
        assert "--" + f.name.replace("_", "-") in text
        assert " ".join(f.metadata["help"].split()) in text
    assert "(default: 64)" in text and "(default: cosine)" in text and "--config FILE.yaml" in text
    assert "(default: 2 in local mode, 1 on LAMB; 10/workers in async mode)" in text
    assert "(default: int8 in local mode, int4 on LAMB; none in async mode, int8 at a " \
           "period of 1 step)" in text
    switch = text.split("--no-average-optimizer-state ")[1].split(" --outer-optimizer")[0]
    assert switch.endswith("(default: off)") and switch.count("(default:") == 1


def test_cli_options_map_onto_config_fields():
    args = build_parser().parse_args(["train", "--batch-size", "16", "--no-validate",
                                      "--mode", "local", "--n-sync", "5"])
    assert (args.batch_size, args.validate, args.mode, args.n_sync) == (16, False, "local", 5)
    assert not hasattr(args, "epochs")  # not given: left to YAML or the default


@pytest.mark.parametrize("argv, message", [
    (["--batch-size", "0"], "hvdtrain: error: --batch-size must be a positive integer, got 0"),
    (["--mode", "local", "--n-sync", "0"], "hvdtrain: error: --n-sync must be a positive integer, got 0"),
    (["--outer-optimizer", "slowmo"], "hvdtrain: error: --outer-optimizer needs --mode local"),
    (["--config", "/nonexistent.yaml"], "hvdtrain: error: config file not found: /nonexistent.yaml"),
    (["--config", "/etc"], "hvdtrain: error: config file /etc cannot be read: Is a directory"),
    (["--mode", "local", "--n-sync", "auto", "--sync-seconds", "2"],
     "hvdtrain: error: --n-sync auto adapts a period of steps; --sync-seconds 2.0 sets rounds by "
     "time"),
])
def test_bad_configuration_exits_non_zero_with_one_line(argv, message):
    result = subprocess.run([sys.executable, "-m", "hvdtrain", "train", *argv],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert result.stderr.strip().startswith(message)


def test_a_keras_layer_argument_error_in_setup_is_one_line_other_value_errors_are_not(
        monkeypatch, capsys):
    from hvdtrain.errors import ArgumentError
    from hvdtrain.training import runner

    def refused(cfg):  # what a Keras-layer check raises for a clash validation let through
        raise ArgumentError("LocalSGD takes n_sync or sync_seconds, got n_sync='auto' and "
                            "sync_seconds=2.0")

    monkeypatch.setattr(runner, "train", refused)
    assert main(["train"]) == 2
    assert capsys.readouterr().err == ("hvdtrain: error: LocalSGD takes n_sync or sync_seconds, "
                                       "got n_sync='auto' and sync_seconds=2.0\n")
    assert issubclass(ArgumentError, ValueError)  # a user's own model.fit still gets ValueError

    def broken(cfg):  # e.g. TensorFlow failing deep inside training: a bug, with its traceback
        raise ValueError("Shapes (8, 10) and (8, 5) are incompatible")

    monkeypatch.setattr(runner, "train", broken)
    with pytest.raises(ValueError, match="Shapes"):
        main(["train"])


@pytest.mark.parametrize("argv, message", [
    (["train", "--sync-seconds", "abc"], "argument --sync-seconds: invalid float value: 'abc' "
                                         "(see hvdtrain train --help)"),
    (["data", "bench", "--batches", "x"], "argument --batches: invalid int value: 'x' "
                                          "(see hvdtrain data bench --help)"),
    (["bench", "--workers"], "argument --workers: expected one argument "
                             "(see hvdtrain bench --help)"),
])
def test_a_value_argparse_rejects_is_one_line_pointing_to_help_not_the_usage(argv, message,
                                                                             capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert capsys.readouterr().err == f"hvdtrain: error: {message}\n"


def test_unknown_model_is_one_line_before_tensorflow_is_imported():
    code = ("import sys\n"
            "from hvdtrain.cli import main\n"
            "code = main(['train', '--model', 'nosuch'])\n"
            "print('tensorflow imported' if 'tensorflow' in sys.modules else 'no tensorflow')\n"
            "sys.exit(code)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stdout.strip() == "no tensorflow"
    assert result.stderr.strip() == (
        "hvdtrain: error: --model must be one of alexnet, alexnet-lrn, alexnet-2col, lenet, "
        "resnet50, resnet20, resnet32, resnet56, got 'nosuch'")


@pytest.mark.long  # a training process of 8 to 9 seconds here
@pytest.mark.slow
def test_missing_data_exits_non_zero_naming_the_folder(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "hvdtrain", "train", "--data-dir", str(tmp_path / "gone"),
         "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 3
    assert f"hvdtrain: error: {tmp_path}/gone: Fashion-MNIST folder not found" in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.long  # a training process of 8 to 9 seconds here
@pytest.mark.slow
@pytest.mark.parametrize("out, reason", [
    ("/proc/forbidden/run", "/proc/forbidden: No such file or directory"),
    ("{tmp}/a-file/run", "Not a directory"),
], ids=["parent-cannot-be-made", "parent-is-a-file"])
def test_a_run_folder_that_cannot_be_made_is_one_line_naming_it(tmp_path, out, reason):
    (tmp_path / "a-file").write_text("")
    out = out.format(tmp=tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "hvdtrain", "train", "--dataset", "synthetic", "--train-examples",
         "64", "--epochs", "1", "--out", out], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"hvdtrain: error: run folder {out} cannot be written: {reason}")
    assert "Traceback" not in result.stderr


@pytest.mark.long  # a training process of 8 to 12 seconds here
@pytest.mark.slow
def test_missing_init_weights_file_is_one_line(tmp_path, idx_dataset_dir):
    result = subprocess.run(
        [sys.executable, "-m", "hvdtrain", "train", "--data-dir", idx_dataset_dir,
         "--init-weights", str(tmp_path / "none.weights.h5"), "--out", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().endswith(
        f"hvdtrain: error: --init-weights file not found: {tmp_path}/none.weights.h5")


def _older_config(**changes) -> str:
    """A config.yaml as an older hvdtrain saved it: every option, no schema version."""
    return yaml.safe_dump(dict(TrainConfig().to_dict(), **changes), sort_keys=False)


@pytest.mark.long  # a training process of 8 to 12 seconds here
@pytest.mark.slow
def test_a_folder_that_holds_a_run_is_not_overwritten(tmp_path, idx_dataset_dir):
    run = tmp_path / "run"
    run.mkdir()
    saved = _older_config(epochs=1)
    (run / "config.yaml").write_text(saved)
    result = subprocess.run(
        [sys.executable, "-m", "hvdtrain", "train", "--data-dir", idx_dataset_dir, "--out", str(run),
         "--epochs", "3"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert (f"cannot resume {run}: --epochs is 3 but the run was started with 1"
            in result.stderr)
    assert (run / "config.yaml").read_text() == saved


@pytest.mark.long  # a training process of 8 to 12 seconds here
@pytest.mark.slow
def test_the_same_command_after_an_upgrade_goes_on_with_the_runs_options(tmp_path,
                                                                        idx_dataset_dir):
    # A run started when the defaults were others (here: 1 epoch, batch 32) and stopped
    # before its first checkpoint: the command without those options continues it as it was.
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(_older_config(epochs=1, batch_size=32))
    result = subprocess.run(
        [sys.executable, "-m", "hvdtrain", "train", "--data-dir", idx_dataset_dir, "--out", str(run),
         "--no-validate"], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (f"hvdtrain: resuming {run} as it was started: --epochs 1, --batch-size 32 (this "
            "command gave the defaults, which differ)") in result.stdout
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert (saved["epochs"], saved["batch_size"], saved["validate"]) == (1, 32, False)
    assert json.loads((run / "summary.json").read_text())["global_batch"] == 32


@pytest.mark.long  # a training process of 8 to 12 seconds here
@pytest.mark.slow
def test_single_process_run_without_horovodrun(tmp_path, idx_dataset_dir):
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "hvdtrain", "train", "--data-dir", idx_dataset_dir, "--epochs", "2",
         "--batch-size", "32", "--out", str(out)], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"run folder: {out}" in result.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["workers"] == 1 and summary["global_batch"] == 32
    assert summary["bytes_allreduced"] == 0  # nothing to exchange with one worker
    assert summary["test_accuracy"] > 0.5    # the generated pattern is easy; chance is 0.1


@pytest.mark.long  # a training process of 8 to 12 seconds here
@pytest.mark.slow
def test_a_diverging_run_ends_in_the_guards_one_line_without_a_traceback(tmp_path,
                                                                          idx_dataset_dir):
    # At rate 2 the small dataset's LeNet spikes to a loss near 70 after about 20 steps,
    # and then sits at ln(10): without the guard it would finish at chance, exit 0.
    result = _run("train", "--data-dir", idx_dataset_dir, "--out", str(tmp_path / "run"),
                  "--batch-size", "8", "--epochs", "1", "--steps-per-epoch", "60",
                  "--no-validate", "--warmup-epochs", "0", "--lr-decay", "constant",
                  "--base-lr", "2", "--log-every", "0")
    assert result.returncode == 4, result.stdout[-2000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("hvdtrain: error: training diverged at step "), last
    assert "(peak learning rate 0.0625 for a global batch of 8); try --lr-scaling sqrt, " \
           "--max-lr 0.0156, --optimizer lamb (its peak is capped at 0.03), or a lower " \
           "--base-lr" in last
    assert not (tmp_path / "run" / "summary.json").exists()


def _run(*argv, timeout=180):
    return subprocess.run([sys.executable, "-m", "hvdtrain", *argv], capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.long  # four hvdtrain commands, a training among them: about 20 seconds here
def test_data_to_tfrecords_then_train_on_them(tmp_path):
    from helpers import write_image_folder

    folder = write_image_folder(str(tmp_path / "imgs"), classes=2, train_per_class=4, val_per_class=2)
    result = _run("data", "to-tfrecords", folder, str(tmp_path / "rec"), "--train-shards", "3")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "wrote 8 training and 4 validation images of 2 classes" in result.stdout
    assert len([f for f in os.listdir(tmp_path / "rec") if f.startswith("train-")]) == 3
    manifest = json.loads((tmp_path / "rec" / "manifest.json").read_text())
    assert manifest["splits"]["train"]["examples"] == 8
    # Counting again (as for TFRecords made elsewhere) finds the same and keeps the class names.
    result = _run("data", "manifest", str(tmp_path / "rec"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "counted 8 training and 4 validation records" in result.stdout
    assert json.loads((tmp_path / "rec" / "manifest.json").read_text()) == manifest
    result = _run("train", "--dataset", "imagenet", "--data-dir", str(tmp_path / "rec"),
                  "--model", "alexnet", "--image-size", "32", "--batch-size", "4", "--epochs", "1",
                  "--out", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps_per_epoch"] == 2 and summary["parameters"] > 20_000_000


@pytest.mark.long  # a training process of 8 to 12 seconds here
@pytest.mark.slow
def test_data_bench_reports_pipeline_throughput_as_json(idx_dataset_dir):
    result = _run("data", "bench", "--data-dir", idx_dataset_dir, "--batch-size", "16",
                  "--batches", "20")
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["images_per_sec"] > 0 and report["ci95"] >= 0 and report["batches"] == 20


@pytest.mark.long  # a training process of 8 to 12 seconds here
@pytest.mark.slow
def test_data_tools_reject_bad_arguments(tmp_path):
    result = _run("data", "to-tfrecords", str(tmp_path / "none"), str(tmp_path / "out"))
    assert result.returncode == 3 and f"{tmp_path}/none: image folder not found" in result.stderr
    result = _run("data", "bench", "--batches", "0")
    assert result.returncode == 2 and "--batches and --workers must be positive" in result.stderr


@pytest.mark.long  # a training process of 8 to 12 seconds here
@pytest.mark.slow
@pytest.mark.parametrize("flag", ["--mixed-precision", "--xla"])
def test_speed_options_train_in_one_process(tmp_path, idx_dataset_dir, flag):
    result = _run("train", "--data-dir", idx_dataset_dir, "--epochs", "1", "--steps-per-epoch", "4",
                  "--batch-size", "16", flag, "--out", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["total_steps"] == 4 and math.isfinite(summary["test_loss"])


@pytest.mark.long  # a training process of 8 to 12 seconds here
@pytest.mark.slow
def test_weights_for_another_image_size_are_refused_in_one_line(tmp_path):
    import tensorflow as tf

    from hvdtrain.models import build_model

    weights = str(tmp_path / "lenet28.weights.h5")
    build_model("lenet", (28, 28, 1), 10).save_weights(weights)
    result = _run("train", "--dataset", "synthetic", "--synthetic-shape", "32x32x3",
                  "--init-weights", weights, "--epochs", "1", "--out", str(tmp_path / "run"))
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"hvdtrain: error: --init-weights {weights} does not fit model lenet")
    assert tf.io.gfile.exists(weights)
