import json
import os

import pytest

from hvdtrain.files import append_jsonl, atomic_write, write_json
from hvdtrain.training.run_folder import existing_run_problem


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
