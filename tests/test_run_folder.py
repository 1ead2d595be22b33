import json
import os

import pytest

from hvdtrain.files import append_jsonl, atomic_write, write_json
from hvdtrain.errors import RunFolderError
from hvdtrain.training.run_folder import (STEPS, existing_run_problem, naming_write_errors,
                                          truncate_logs)


def test_a_crash_while_writing_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "summary.json"
    write_json(str(path), {"v": 1})

    def crash_halfway(tmp):
        with open(tmp, "w") as fh:
            fh.write('{"v": 2, "trunc')
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(str(path), crash_halfway)
    assert json.loads(path.read_text()) == {"v": 1}
    assert os.listdir(tmp_path) == ["summary.json"]


def test_temporary_name_keeps_the_suffix_keras_reads_the_format_from(tmp_path):
    seen = []
    atomic_write(str(tmp_path / "model.weights.h5"), lambda tmp: (seen.append(tmp), open(tmp, "w").close()))
    assert seen[0].endswith("model.weights.h5") and os.path.basename(seen[0]).startswith(".tmp-")
    assert os.listdir(tmp_path) == ["model.weights.h5"]


def test_metrics_lines_append(tmp_path):
    path = str(tmp_path / "metrics.jsonl")
    append_jsonl(path, {"epoch": 1})
    append_jsonl(path, {"epoch": 2})
    assert [json.loads(line)["epoch"] for line in open(path)] == [1, 2]


def test_resume_cuts_per_worker_step_lines_at_the_checkpoints_examples_not_its_step(tmp_path):
    # A timed run of 2 workers, batch 16: rank 0 took 4 steps and rank 1 two by the round
    # that ended the epoch (96 examples: job step 3), where the checkpoint was written;
    # then each went on before the crash. Each line counts its own worker's steps.
    def line(rank, step, examples):
        return {"rank": rank, "step": step, "examples": examples, "loss": 1.0}

    before = [line(0, 1, 16), line(1, 1, 16), line(0, 2, 32), line(0, 3, 48),
              line(0, 4, 96), line(1, 2, 96)]
    after = [line(0, 5, 112), line(1, 3, 112), line(0, 6, 128)]
    path = str(tmp_path / STEPS)
    for record in before + after:
        append_jsonl(path, record)
    with open(path, "a") as fh:
        fh.write('{"rank": 1, "step": 4, "exa')  # cut short by the crash
    truncate_logs(str(tmp_path), examples=96)
    assert [json.loads(text) for text in open(path)] == before


def test_a_failed_write_in_the_run_folder_is_named_and_one_elsewhere_passes(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(RunFolderError) as err:
        with naming_write_errors(str(run)):
            raise OSError(28, "No space left on device", str(run / "checkpoints" / "x"))
    assert str(err.value) == (f"run folder {run} cannot be written: {run}/checkpoints/x: "
                              "No space left on device")
    with pytest.raises(FileNotFoundError):  # e.g. a data file: not the run folder's to name
        with naming_write_errors(str(run)):
            open(tmp_path / "data" / "train.bin")


def test_existing_run_is_refused(tmp_path):
    assert existing_run_problem(str(tmp_path / "new")) is None
    (tmp_path / "config.yaml").write_text("x: 1\n")
    assert "already holds a run" in existing_run_problem(str(tmp_path))


def test_finished_files_and_checkpoints_get_the_usual_permissions_not_private_ones(tmp_path):
    import stat

    import tensorflow as tf

    from hvdtrain.progress import TrainingProgress
    from hvdtrain.training.checkpoints import CheckpointStore, SavedProgress

    old = os.umask(0o022)
    try:
        write_json(str(tmp_path / "summary.json"), {"v": 1})
        checkpoint = CheckpointStore(str(tmp_path / "checkpoints")).save(
            tf.train.Checkpoint(v=tf.Variable(1.0)),
            SavedProgress(TrainingProgress(epoch_examples=80, examples=8, steps=1), 1, 8))
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "summary.json").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(checkpoint).st_mode) == 0o755
