"""Checkpoints, resume, and what happens when workers die, hang or diverge."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest
import keras
import tensorflow as tf

from hvdtrain import comm
from hvdtrain.benchmarks.learning_curves import load_curve
from hvdtrain.config import parse_interval
from hvdtrain.data import load_dataset
from hvdtrain.errors import ConfigError
from hvdtrain.training.callbacks import ElasticCommit, StepLog
from hvdtrain.training.checkpoints import CheckpointStore, FitPhase, Progress, fit_phases

BIN = os.path.dirname(sys.executable)


# --- pure parts ---

@pytest.mark.parametrize("text, expected", [
    ("500", ("steps", 500)), ("500steps", ("steps", 500)), ("7s", ("steps", 7)),
    ("1epoch", ("epochs", 1)), ("2e", ("epochs", 2)), ("3 epochs", ("epochs", 3)),
])
def test_checkpoint_interval_parses_steps_and_epochs(text, expected):
    assert parse_interval(text) == expected


@pytest.mark.parametrize("text", ["0", "-5", "5 minutes", "", "e"])
def test_bad_checkpoint_interval_is_one_line(text):
    with pytest.raises(ConfigError, match="--checkpoint-every must be a positive number of steps"):
        parse_interval(text)


def test_resume_mid_epoch_runs_the_rest_of_that_epoch_first():
    assert fit_phases(0, 10, 3) == [FitPhase(0, 3, 10, 0)]
    assert fit_phases(13, 10, 3) == [FitPhase(1, 2, 7, 13), FitPhase(2, 3, 10, 20)]
    assert fit_phases(20, 10, 3) == [FitPhase(2, 3, 10, 20)]
    assert fit_phases(29, 10, 3) == [FitPhase(2, 3, 1, 29)]
    assert fit_phases(30, 10, 3) == []


def test_progress_knows_its_epoch():
    progress = Progress(step=23, steps_per_epoch=10, workers=2, batch_size=8)
    assert (progress.epoch, progress.step_in_epoch) == (2, 3)


class _RecordingState:
    """Stands in for ElasticState: notes the optimizer step of every commit."""

    def __init__(self, model):
        self.model, self.commits, self.sync_count = model, [], 0

    def commit(self):
        self.commits.append(int(self.model.optimizer.iterations.numpy()))


def test_elastic_commits_an_epochs_last_step_once_and_after_its_log():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    state = _RecordingState(model)
    logged = []

    class EpochLog(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            logged.append((epoch, list(state.commits)))

    x, y = np.zeros((20, 3), "float32"), np.zeros((20, 1), "float32")
    # The runner's order: logging callbacks, then the commit.
    model.fit(x, y, batch_size=4, epochs=2, verbose=0,
              callbacks=[EpochLog(), ElasticCommit(state, every=2)])
    assert state.commits == [2, 4, 5, 6, 8, 10]
    assert logged == [(0, [2, 4]), (1, [2, 4, 5, 6, 8])]


def test_step_log_flushed_at_commits_writes_each_step_once_with_its_own_value(tmp_path):
    comm.init()  # a world of one worker

    def fit_logging(path, flush_after):
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), metrics=["accuracy"],
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        step_log = StepLog(str(path), time.time())

        class Flush(keras.callbacks.Callback):  # as ElasticCommit does before committing
            def on_train_batch_end(self, batch, logs=None):
                if batch in flush_after:
                    step_log.flush()

        rng = np.random.default_rng(0)
        x, y = rng.normal(size=(24, 3)).astype("float32"), rng.integers(0, 2, 24)
        model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0,
                  callbacks=[step_log, Flush()])
        return [json.loads(line) for line in path.read_text().splitlines()]

    plain = fit_logging(tmp_path / "plain.jsonl", flush_after=())
    flushed = fit_logging(tmp_path / "flushed.jsonl", flush_after=(1, 2, 5))
    assert [r["step"] for r in flushed] == list(range(1, 13)) == [r["step"] for r in plain]
    for a, b in zip(flushed, plain):
        assert a["loss"] == pytest.approx(b["loss"]) and a["error"] == pytest.approx(b["error"])


def test_resumed_data_stream_continues_exactly_where_it_stopped(idx_dataset_dir):
    data = load_dataset("fashion-mnist", idx_dataset_dir)
    fresh = iter(data.train(rank=1, workers=2, batch_size=16, seed=3))
    batches = [next(fresh) for _ in range(40)]  # 640 examples: crosses epochs of 256
    for start in (5, 16, 33):
        resumed = next(iter(data.train(rank=1, workers=2, batch_size=16, seed=3, start_step=start)))
        np.testing.assert_array_equal(resumed[1], batches[start][1])
        np.testing.assert_allclose(resumed[0], batches[start][0])
    # Every epoch of the shard is a permutation of it.
    seen = np.concatenate([b[1].numpy() for b in batches[:16]])
    np.testing.assert_array_equal(np.sort(seen), np.sort(data.train_labels[1::2]))


# --- the checkpoint store ---

def _state(value):
    return tf.train.Checkpoint(v=tf.Variable(np.full(1000, value, np.float32)))


def test_store_keeps_the_newest_and_verifies_them(tmp_path):
    store = CheckpointStore(str(tmp_path / "ckpt"), keep=2)
    for step in (5, 10, 15):
        store.save(_state(step), Progress(step, 10, 2, 8))
    assert [os.path.basename(p) for p in store.checkpoints()] == ["step-000000015", "step-000000010"]
    path, progress, problems = store.newest_sound()
    assert path.endswith("step-000000015") and progress.step == 15 and problems == []


def test_damaged_newest_checkpoint_is_reported_and_the_previous_used(tmp_path):
    store = CheckpointStore(str(tmp_path / "ckpt"), keep=3)
    for step in (5, 10):
        store.save(_state(step), Progress(step, 10, 2, 8))
    data = [f for f in os.listdir(store.path_for(10)) if ".data-" in f][0]
    with open(os.path.join(store.path_for(10), data), "r+b") as fh:
        fh.seek(100)
        fh.write(b"\x00\x01\x02")
    path, progress, problems = store.newest_sound()
    assert progress.step == 5
    assert problems == [f"{store.path_for(10)}: {data} is damaged (checksum mismatch)"]
    os.remove(os.path.join(store.path_for(5), "meta.json"))
    assert store.newest_sound()[0] is None


def test_a_crash_during_save_leaves_no_checkpoint_under_a_final_name(tmp_path):
    store = CheckpointStore(str(tmp_path / "ckpt"))
    store.save(_state(1), Progress(5, 10, 1, 8))

    class Crashing(tf.train.Checkpoint):
        def write(self, prefix, options=None):
            super().write(prefix, options)
            raise KeyboardInterrupt  # the process dies between writing and renaming

    with pytest.raises(KeyboardInterrupt):
        store.save(Crashing(v=tf.Variable([1.0])), Progress(10, 10, 1, 8))
    assert os.listdir(store.folder) == ["step-000000005"]


# --- real runs, killed, hung and diverging ---

def _train_command(data_dir, out, *extra, workers=2):
    train = [os.path.join(BIN, "hvdtrain"), "train", "--data-dir", data_dir, "--out", str(out),
             "--batch-size", "8", "--epochs", "2", "--no-validate", *extra]
    if workers == 1:
        return train
    return [os.path.join(BIN, "horovodrun"), "-np", str(workers), "-H", f"localhost:{workers}",
            "--gloo", *train]


def _env():
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                PATH=BIN + os.pathsep + os.environ.get("PATH", ""))


def _workers_of(proc: subprocess.Popen) -> list[psutil.Process]:
    workers = []
    for child in psutil.Process(proc.pid).children(recursive=True):
        try:
            cmdline = child.cmdline()
        except psutil.NoSuchProcess:
            continue
        # The Python process running the console script, not the shell that launched it.
        if len(cmdline) > 2 and cmdline[1].endswith("/hvdtrain") and cmdline[2] == "train":
            workers.append(child)
    return workers


def _wait_for(predicate, timeout, proc=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        if proc is not None and proc.poll() is not None:
            return False
        time.sleep(0.05)
    return False


def _checkpoints(out):
    return CheckpointStore(str(out / "checkpoints")).checkpoints()


@pytest.mark.multiprocess
def test_killed_worker_then_same_command_resumes_and_finishes_all_steps(tmp_path, idx_dataset_dir):
    out = tmp_path / "run"
    command = _train_command(idx_dataset_dir, out, "--model", "resnet20", "--steps-per-epoch", "24",
                             "--checkpoint-every", "4")
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_env())
    try:
        assert _wait_for(lambda: len(_checkpoints(out)) >= 1, 240, proc), proc.communicate()[0][-3000:]
        victim = _workers_of(proc)[-1]
        victim.send_signal(signal.SIGKILL)
        first_output = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, first_output[-2000:]
    assert not (out / "summary.json").exists()
    for path in _checkpoints(out):  # whatever was on disk at the kill is whole
        assert CheckpointStore.verify(path)[1] is None

    second = subprocess.run(command, capture_output=True, text=True, env=_env(), timeout=300)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "resuming from" in second.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from_step"] > 0 and summary["resumed_from_step"] % 4 == 0
    assert summary["resumed_from_step"] + summary["steps_run"] == summary["total_steps"] == 48
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2] and records[-1]["step"] == 48


def test_killed_during_frequent_saves_leaves_only_whole_checkpoints(tmp_path, idx_dataset_dir):
    out = tmp_path / "run"
    command = _train_command(idx_dataset_dir, out, "--checkpoint-every", "1", "--keep-checkpoints",
                             "2", "--steps-per-epoch", "200", workers=1)
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env())
    try:
        assert _wait_for(lambda: len(_checkpoints(out)) >= 2, 240, proc)
        time.sleep(0.37)  # most of each step is spent saving: likely mid-save
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    names = os.listdir(out / "checkpoints")
    assert all(n.startswith(("step-", ".tmp-")) for n in names)
    for path in _checkpoints(out):
        assert CheckpointStore.verify(path)[1] is None, path
    resumed = subprocess.run(command + ["--checkpoint-every", "1epoch"], capture_output=True,
                             text=True, env=_env(), timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((out / "summary.json").read_text())["total_steps"] == 128  # 2 x 512 / 8
    assert not [n for n in os.listdir(out / "checkpoints") if n.startswith(".tmp-")]


def test_non_finite_loss_stops_naming_the_step_and_keeps_good_checkpoints(tmp_path, idx_dataset_dir):
    out = tmp_path / "run"
    result = subprocess.run(
        _train_command(idx_dataset_dir, out, "--base-lr", "1e9", "--warmup-epochs", "0",
                       "--checkpoint-every", "1", "--steps-per-epoch", "30", workers=1),
        capture_output=True, text=True, env=_env(), timeout=300)
    assert result.returncode == 4, result.stderr[-3000:]
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("hvdtrain: error: ") and " at step " in message
    assert "not finite" in message or "loss is nan" in message or "loss is inf" in message
    for path in _checkpoints(out):
        reader = tf.train.load_checkpoint(os.path.join(path, "state"))
        for name in reader.get_variable_to_shape_map():
            value = reader.get_tensor(name)
            if np.issubdtype(np.asarray(value).dtype, np.floating):
                assert np.all(np.isfinite(value)), (path, name)


@pytest.mark.multiprocess
def test_a_hung_worker_ends_the_job_within_the_step_timeout(tmp_path, idx_dataset_dir):
    out = tmp_path / "run"
    command = _train_command(idx_dataset_dir, out, "--step-timeout", "6", "--steps-per-epoch", "400",
                             "--epochs", "3", "--checkpoint-every", "5")
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_env())
    victim = None
    try:
        # A checkpoint proves training is under way: the watchdog arms after the first step.
        assert _wait_for(lambda: len(_checkpoints(out)) >= 1, 240, proc)
        victim = _workers_of(proc)[-1]
        victim.send_signal(signal.SIGSTOP)  # alive but stuck, as a hung peer is
        output = proc.communicate(timeout=120)[0]
    finally:
        if victim is not None and victim.is_running():
            victim.send_signal(signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert "no training step finished for 6 s" in output


# --- elastic training: workers leave and join ---

def _elastic_job(tmp_path, data_dir, hosts: str, np_: int):
    hosts_file = tmp_path / "hosts.txt"
    hosts_file.write_text(hosts)
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts_file}\n")
    discover.chmod(0o755)
    out = tmp_path / "run"
    # localhost and 127.0.0.1 are two hosts to Horovod; --network-interfaces lo spares the
    # NIC discovery that otherwise waits for two hosts.
    command = [os.path.join(BIN, "horovodrun"), "-np", str(np_), "--min-np", "1", "--max-np", "2",
               "--host-discovery-script", str(discover), "--network-interfaces", "lo", "--gloo",
               os.path.join(BIN, "hvdtrain"), "train", "--elastic", "--out", str(out),
               "--data-dir", data_dir, "--model", "resnet20", "--batch-size", "8",
               "--steps-per-epoch", "30", "--epochs", "6", "--elastic-commit-every", "5",
               "--no-validate"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_env())
    return proc, hosts_file, out


def _epochs_done(out):
    path = out / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _assert_resized(proc, output, out, first_workers, last_workers):
    """The job finished every step, starting with `first_workers` and ending with `last_workers`."""
    assert proc.returncode == 0, output[-4000:]
    assert f"training with {last_workers} worker(s) from step" in output
    records = _epochs_done(out)
    assert records[0]["workers"] == first_workers and records[-1]["workers"] == last_workers
    assert records[-1]["step"] == 180 and [r["epoch"] for r in records] == [1, 2, 3, 4, 5, 6]
    # Every step's training error is logged across the change of workers.
    assert load_curve(str(out)).step == list(range(1, 181))
    assert json.loads((out / "summary.json").read_text())["workers"] == last_workers


def _finish(proc, timeout=240):
    try:
        return proc.communicate(timeout=timeout)[0]
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.multiprocess
def test_elastic_job_loses_a_worker_and_finishes_with_the_other(tmp_path, idx_dataset_dir):
    proc, hosts, out = _elastic_job(tmp_path, idx_dataset_dir, "localhost:1\n127.0.0.1:1\n", 2)
    try:
        assert _wait_for(lambda: len(_epochs_done(out)) >= 1, 240, proc)
        hosts.write_text("localhost:1\n")
        victim = [p for p in _workers_of(proc) if p.environ().get("HOROVOD_HOSTNAME") == "127.0.0.1"]
        victim[0].send_signal(signal.SIGKILL)
    finally:
        output = _finish(proc)
    _assert_resized(proc, output, out, first_workers=2, last_workers=1)


@pytest.mark.multiprocess
def test_elastic_job_takes_in_a_worker_that_joins(tmp_path, idx_dataset_dir):
    proc, hosts, out = _elastic_job(tmp_path, idx_dataset_dir, "localhost:1\n", 1)
    try:
        assert _wait_for(lambda: len(_epochs_done(out)) >= 1, 240, proc)
        hosts.write_text("localhost:1\n127.0.0.1:1\n")
    finally:
        output = _finish(proc)
    _assert_resized(proc, output, out, first_workers=1, last_workers=2)
