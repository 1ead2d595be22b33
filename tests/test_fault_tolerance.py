"""Checkpoints, resume, and what happens when workers die, hang or diverge."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np
import psutil
import pytest
import keras
import tensorflow as tf

from helpers import weights_in_file
from hvdtrain import comm
from hvdtrain.benchmarks.learning_curves import load_curve
from hvdtrain.config import LOCAL_MODES, load_config, parse_interval
from hvdtrain.data import load_dataset
from hvdtrain.errors import ConfigError
from hvdtrain.plan import Job, settle
from hvdtrain.training.callbacks import Checkpointer, CountProgress, ElasticCommit, StepLog
from hvdtrain.progress import TrainingProgress
from hvdtrain.rounds.save_plan import SavePlan
from hvdtrain.schedules import learning_rate_at, lr_scaling_workers, schedule_in_examples
from hvdtrain.training.checkpoints import CheckpointStore, SavedProgress

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


class _RecordingState:
    """Stands in for ElasticState: notes the optimizer step of every commit in `commits`."""

    def __init__(self, model, commits: list):
        self.model, self.commits, self.progress = model, commits, None

    def commit(self):
        self.commits.append(int(self.model.optimizer.iterations.numpy()))


class _RecordingStore:
    """Stands in for CheckpointStore: notes the step of every save in `saved`."""

    def __init__(self, saved: list):
        self.saved = saved

    def save(self, state, saved):
        self.saved.append(saved.progress.steps)

    def newest(self):
        return None


def _fit_two_epochs_logging(saver_for, saved: list) -> list:
    """Two epochs of 5 steps (batch 4): CountProgress, an epoch log, then the saver
    `saver_for(model, progress)` (the runner's order). Returns, per epoch, what `saved`
    held when the epoch's line was logged."""
    comm.init()  # a world of one worker
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    logged = []

    class EpochLog(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            logged.append((epoch, list(saved)))

    x, y = np.zeros((20, 3), "float32"), np.zeros((20, 1), "float32")
    progress = TrainingProgress(epoch_examples=20)
    model.fit(x, y, batch_size=4, epochs=2, verbose=0,
              callbacks=[CountProgress(progress, 4), EpochLog(), saver_for(model, progress)])
    return logged


def test_elastic_commits_an_epochs_last_step_once_and_after_its_log():
    commits: list[int] = []
    logged = _fit_two_epochs_logging(lambda model, progress: ElasticCommit(
        _RecordingState(model, commits), SavePlan(commit_every=2), progress=progress), commits)
    assert commits == [2, 4, 5, 6, 8, 10]
    assert logged == [(0, [2, 4]), (1, [2, 4, 5, 6, 8])]


def test_a_save_left_due_before_an_elastic_reset_is_void_in_the_next_fit(monkeypatch):
    from hvdtrain.training.callbacks import SavePoints

    progress = TrainingProgress(epoch_examples=80, steps=10, consensus_step=8)
    points = SavePoints(SavePlan("steps", 5).pending_checkpoint(), progress)
    points.begin_fit()
    assert not points.at_batch_end(1, 10)  # due at step 10, waiting for a round
    progress.restore({"steps": 8})        # the reset rolls back to the commit at step 8
    monkeypatch.setattr(comm, "world_id", lambda: comm._worlds_started + 1)  # a new world
    points.begin_fit()
    progress.advance(1)
    progress.consensus_step = 9           # a round after step 9
    assert not points.at_batch_end(0, 10)  # as on a worker that just joined


def test_a_step_checkpoint_at_an_epochs_last_step_is_saved_after_its_log():
    # Saved before the epoch's line, a crash in between would lose that line for good: the
    # resumed run starts at the next epoch.
    saved: list[int] = []
    logged = _fit_two_epochs_logging(lambda model, progress: Checkpointer(
        _RecordingStore(saved), None, SavePlan("steps", 5), progress, 4), saved)
    assert saved == [5, 10]
    assert logged == [(0, []), (1, [5])]  # each epoch's line came before its checkpoint


def test_a_checkpoint_keeps_the_seconds_trained_so_far_and_reads_them_back(tmp_path):
    comm.init()
    # A run resumed after 70 s of training and 5 of evaluating, 30 s into this process
    # (10 of them evaluating).
    progress = TrainingProgress(epoch_examples=80, steps=5, examples=40, train_seconds=70.0,
                                eval_seconds=5.0)
    progress.start_clock(time.time() - 30.0)
    progress.eval_seconds += 10.0
    store = CheckpointStore(str(tmp_path / "ckpt"))
    checkpointer = Checkpointer(store, _state(1), SavePlan("steps", 5), progress, 8)
    checkpointer.set_model(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]))
    checkpointer._save()
    saved, problem = CheckpointStore.verify(store.newest())
    assert problem is None and 89.0 < saved.progress.train_seconds < 95.0
    assert saved.progress.eval_seconds == 15.0  # the run's evaluations, not lost
    # Checkpoints written before the seconds were kept read as 0.
    meta = saved.to_json()
    del meta["train_seconds"], meta["eval_seconds"]
    old = SavedProgress.from_json(meta).progress
    assert (old.train_seconds, old.eval_seconds) == (0.0, 0.0)


def test_step_log_flushed_at_commits_writes_each_step_once_with_its_own_value(tmp_path):
    comm.init()  # a world of one worker

    def fit_logging(path, flush_after):
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), metrics=["accuracy"],
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        progress = TrainingProgress(epoch_examples=24)
        step_log = StepLog(str(path), time.time(), progress)

        class Flush(keras.callbacks.Callback):  # as ElasticCommit does before committing
            def on_train_batch_end(self, batch, logs=None):
                if batch in flush_after:
                    step_log.flush()

        rng = np.random.default_rng(0)
        x, y = rng.normal(size=(24, 3)).astype("float32"), rng.integers(0, 2, 24)
        model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0,
                  callbacks=[CountProgress(progress, 4), step_log, Flush()])
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


@pytest.mark.parametrize("message, lost", [
    ("Graph execution error:\n[/tmp/x/horovod-0.28.1/third_party/compatible17_gloo/gloo/transport/"
     "tcp/pair.cc:589] Read error [198.18.0.3]:16051: Connection reset by peer", True),
    ("Horovod has been shut down. This was caused by an exception on one of the ranks", True),
    ("Graph execution error: Incompatible shapes: [16,10] vs. [8,10]", False),
])
def test_a_peers_loss_is_told_from_other_op_errors_by_the_message(message, lost):
    # The first: what a worker saw when its peer's host was killed on an emulated cluster.
    assert comm.is_lost_peer(tf.errors.UnknownError(None, None, message)) is lost
    assert comm.is_lost_peer(ValueError(message)) is False


FORGOTTEN = ("Graph execution error: Detected at node Allreduce_gradients_0 ... Allreduce: "
             "Process set provided does not exist, or has not been registered.")


def test_a_host_groups_op_after_horovod_shut_down_is_a_lost_peer(monkeypatch):
    """A hierarchical step enqueued just after a peer's loss finds its host group forgotten
    by the shutdown: a lost peer (an elastic job goes on), not an error that ends the job."""
    monkeypatch.setattr(comm, "_host_group", comm.WorkerGroup((0, 1), 2, object()))
    assert comm.is_lost_peer(tf.errors.InvalidArgumentError(None, None, FORGOTTEN))


@pytest.mark.parametrize("group", [None, comm.WorkerGroup((0, 1), 1)])
def test_a_missing_process_set_where_none_was_registered_stays_an_error(monkeypatch, group):
    monkeypatch.setattr(comm, "_host_group", group)
    assert not comm.is_lost_peer(tf.errors.InvalidArgumentError(None, None, FORGOTTEN))


# --- the checkpoint store ---

def _saved(step: int) -> SavedProgress:
    return SavedProgress(TrainingProgress(epoch_examples=160, examples=16 * step, steps=step), 2, 8)


def _state(value):
    return tf.train.Checkpoint(v=tf.Variable(np.full(1000, value, np.float32)))


def test_store_keeps_the_newest_and_verifies_them(tmp_path):
    store = CheckpointStore(str(tmp_path / "ckpt"), keep=2)
    for step in (5, 10, 15):
        store.save(_state(step), _saved(step))
    assert [os.path.basename(p) for p in store.checkpoints()] == ["step-000000015", "step-000000010"]
    path, progress, problems = store.newest_sound()
    assert path.endswith("step-000000015") and progress.progress.steps == 15 and problems == []


def test_damaged_newest_checkpoint_is_reported_and_the_previous_used(tmp_path):
    store = CheckpointStore(str(tmp_path / "ckpt"), keep=3)
    for step in (5, 10):
        store.save(_state(step), _saved(step))
    data = [f for f in os.listdir(store.path_for(10)) if ".data-" in f][0]
    with open(os.path.join(store.path_for(10), data), "r+b") as fh:
        fh.seek(100)
        fh.write(b"\x00\x01\x02")
    path, progress, problems = store.newest_sound()
    assert progress.progress.steps == 5
    assert problems == [f"{store.path_for(10)}: {data} is damaged (checksum mismatch)"]
    os.remove(os.path.join(store.path_for(5), "meta.json"))
    assert store.newest_sound()[0] is None


def test_a_crash_during_save_leaves_no_checkpoint_under_a_final_name(tmp_path):
    store = CheckpointStore(str(tmp_path / "ckpt"))
    store.save(_state(1), _saved(5))

    class Crashing(tf.train.Checkpoint):
        def write(self, prefix, options=None):
            super().write(prefix, options)
            raise KeyboardInterrupt  # the process dies between writing and renaming

    with pytest.raises(KeyboardInterrupt):
        store.save(Crashing(v=tf.Variable([1.0])), _saved(10))
    assert os.listdir(store.folder) == ["step-000000005"]


def _run_with_checkpoints(out, steps) -> CheckpointStore:
    """A stopped run in `out` (its config.yaml, saves every 500 steps) with checkpoints at `steps`."""
    out.mkdir()
    load_config(None, {"out": str(out), "checkpoint_every": "500"}).resolved().save_yaml(
        str(out / "config.yaml"))
    store = CheckpointStore(str(out / "checkpoints"), keep=3)
    for step in steps:
        store.save(_state(step), _saved(step))
    return store


def plan_resume(cfg, job):
    """Where `hvdtrain train` starts `cfg` on `job` (rank 0's read of its run folder),
    once the plan settled from it has refused what it refuses."""
    from hvdtrain.training.saved_run import read_saved_run

    saved = read_saved_run(cfg)
    settle(cfg, job, saved)
    return saved


def _names(paths) -> list[str]:
    return [os.path.basename(p) for p in paths]


def test_resuming_an_older_checkpoint_of_the_run_sets_the_newer_aside_and_keeps_it(tmp_path,
                                                                                  capsys):
    from hvdtrain.training.resume import restore_on_chief

    comm.init()  # a world of one worker: this process is rank 0
    out = tmp_path / "run"
    store = _run_with_checkpoints(out, (3000, 4000, 5000))
    cfg = load_config(None, {"out": str(out), "checkpoint_every": "500",
                             "resume": store.path_for(3000)}).resolved()
    plan = plan_resume(cfg, Job(1, 1))
    restore_on_chief(plan, _state(0), cfg)
    (line,) = [line for line in capsys.readouterr().out.splitlines() if "branch" in line]
    assert re.fullmatch(r"hvdtrain: resuming from an older checkpoint starts a new branch: moved "
                        r"the newer step-000004000, step-000005000 to (\S+/abandoned-\S+) \(.*\)",
                        line), line
    aside = re.search(r" to (\S+) \(", line).group(1)
    assert _names(CheckpointStore(aside).checkpoints()) == ["step-000005000", "step-000004000"]
    assert _names(store.checkpoints()) == ["step-000003000"]
    # The new branch's first save keeps the checkpoint it started from...
    store.save(_state(3500), _saved(3500))
    assert _names(store.checkpoints()) == ["step-000003500", "step-000003000"]
    # ...and a rerun after a crash continues the new branch, not the abandoned step 5000.
    assert plan_resume(replace(cfg, resume="auto"), Job(1, 1)).checkpoint == store.path_for(3500)


def test_resuming_another_runs_checkpoint_keeps_its_optimizer_or_refuses_another(tmp_path):

    # A LAMB run at 16 x 64; a new job of 2 workers, where auto would take SGD, starts
    # from its checkpoint: LAMB's slots are what the checkpoint holds.
    source = tmp_path / "lamb-run"
    source.mkdir()
    load_config(None, {"out": str(source), "optimizer": "lamb"}).resolved().save_yaml(
        str(source / "config.yaml"))
    store = CheckpointStore(str(source / "checkpoints"), keep=3)
    store.save(_state(1), _saved(100))
    given = {"out": str(tmp_path / "new"), "resume": store.path_for(100)}
    cfg = load_config(None, given).resolved()
    assert settle(cfg, Job(2, 1), plan_resume(cfg, Job(2, 1))).config.optimizer == "lamb"
    with pytest.raises(ConfigError, match=r"^--resume \S+: the checkpoint was written with "
                                          r"--optimizer lamb \(\S+config.yaml\), not sgd: "
                                          r"give --optimizer lamb or auto$"):
        plan_resume(load_config(None, dict(given, optimizer="sgd")).resolved(), Job(2, 1))


def test_a_checkpoint_that_does_not_fit_the_optimizer_is_one_line_naming_it(tmp_path):
    import keras

    from hvdtrain.training.checkpoints import STATE_PREFIX, restore

    def compiled(optimizer):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
        model.compile(optimizer, "mse")
        model.optimizer.build(model.trainable_variables)
        return tf.train.Checkpoint(model=model, optimizer=model.optimizer)

    compiled(keras.optimizers.Lamb()).write(str(tmp_path / STATE_PREFIX))
    with pytest.raises(ConfigError, match=rf"^checkpoint {tmp_path} does not fit this run's "
                                          r"model and optimizer: [^\n]+$"):
        restore(compiled(keras.optimizers.SGD(momentum=0.9)), str(tmp_path))


def test_resuming_an_older_checkpoint_keeps_the_log_lines_it_cuts_with_the_abandoned_branch(
        tmp_path, capsys):
    from hvdtrain.training import run_folder
    from hvdtrain.training.resume import restore_on_chief

    comm.init()
    out = tmp_path / "run"
    store = _run_with_checkpoints(out, (3000, 4000))
    # Epoch lines at steps 2000, 4000 (16 examples a step), and a step line for each.
    for log in (run_folder.METRICS, run_folder.STEPS):
        with open(out / log, "w") as fh:
            fh.writelines(json.dumps({"step": step, "examples": 16 * step}) + "\n"
                          for step in (2000, 4000))
    cfg = load_config(None, {"out": str(out), "checkpoint_every": "500",
                             "resume": store.path_for(3000)}).resolved()
    restore_on_chief(plan_resume(cfg, Job(1, 1)), _state(0), cfg)
    run_folder.start(str(out), cfg.save_yaml, 16 * 3000)
    line = capsys.readouterr().out.splitlines()[-1]
    assert "(no longer resumed, with the lines of metrics.jsonl and steps.jsonl written after " \
           "the resumed one; delete them when done)" in line, line
    aside = tmp_path / "run" / "checkpoints" / re.search(r"/(abandoned-[^/ ]+) \(", line).group(1)
    for log in (run_folder.METRICS, run_folder.STEPS):
        assert [json.loads(text)["step"] for text in open(out / log)] == [2000]
        assert [json.loads(text)["step"] for text in open(aside / log)] == [4000]


def test_branches_abandoned_within_one_second_get_folders_of_their_own(tmp_path):
    store = CheckpointStore(str(tmp_path / "ckpt"))
    for step in (10, 20):
        store.save(_state(step), _saved(step))
    first = store.set_aside([store.path_for(20)], "abandoned-20260101-120000")
    second = store.set_aside([store.path_for(10)], "abandoned-20260101-120000")
    assert (os.path.basename(first), os.path.basename(second)) == (
        "abandoned-20260101-120000", "abandoned-20260101-120000-2")
    assert os.listdir(first) == ["step-000000020"] and os.listdir(second) == ["step-000000010"]


def test_resuming_a_checkpoint_of_the_run_with_another_config_is_refused_as_auto_is(tmp_path):

    out = tmp_path / "run"
    store = _run_with_checkpoints(out, (3000, 4000))
    with pytest.raises(ConfigError, match=f"cannot resume {out}: --epochs is 5 but the run was "
                                          "started with 2"):
        plan_resume(load_config(None, {"out": str(out), "epochs": 5,
                                       "resume": store.path_for(3000)}).resolved(), Job(1, 1))
    assert _names(store.checkpoints()) == ["step-000004000", "step-000003000"]


def test_resuming_another_runs_checkpoint_into_a_folder_that_holds_a_run_is_refused(tmp_path):

    other = _run_with_checkpoints(tmp_path / "other", (3000,))
    out = tmp_path / "run"
    store = _run_with_checkpoints(out, (4000,))
    with pytest.raises(ConfigError, match=f"run folder {out} already holds a run; choose a new "
                                          f"--out to start from {other.path_for(3000)}"):
        plan_resume(load_config(None, {"out": str(out),
                                       "resume": other.path_for(3000)}).resolved(), Job(1, 1))
    assert _names(store.checkpoints()) == ["step-000004000"]


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


@pytest.mark.ci
@pytest.mark.multiprocess
@pytest.mark.parametrize("mode", [
    (),
    # Overlapped rounds every 2 steps; the one after each 4th step blocks for the checkpoint.
    ("--mode", "async", "--n-sync", "2"),
], ids=["sync", "async"])
@pytest.mark.long
def test_killed_worker_then_same_command_resumes_and_finishes_all_steps(tmp_path, idx_dataset_dir,
                                                                        mode):
    out = tmp_path / "run"
    command = _train_command(idx_dataset_dir, out, "--model", "resnet20", "--steps-per-epoch", "24",
                             "--checkpoint-every", "4", *mode)
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
    trained_before = CheckpointStore.verify(_checkpoints(out)[0])[0].progress.train_seconds

    second = subprocess.run(command, capture_output=True, text=True, env=_env(), timeout=300)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "resuming from" in second.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from_step"] > 0 and summary["resumed_from_step"] % 4 == 0
    assert summary["resumed_from_step"] + summary["steps_run"] == summary["total_steps"] == 48
    # The run's clock went on from the checkpoint's: time to a target counts the first part.
    assert 0 < trained_before < summary["train_seconds"]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2] and records[-1]["step"] == 48


@pytest.mark.long
@pytest.mark.multiprocess
def test_a_two_worker_checkpoint_resumes_on_one_worker_in_examples(tmp_path, idx_dataset_dir):
    out = tmp_path / "run"
    # 512 examples: 32 steps per epoch on two workers of 8, then 64 on one.
    two = _train_command(idx_dataset_dir, out, "--checkpoint-every", "8", "--keep-checkpoints", "10")
    first = subprocess.run(two, capture_output=True, text=True, env=_env(), timeout=300)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    # Make it a run that stopped after step 40, a quarter into its second epoch.
    for name in ("summary.json", "model.weights.h5"):
        os.remove(out / name)
    for path in _checkpoints(out):
        if int(os.path.basename(path).split("-")[1]) > 40:
            shutil.rmtree(path)
    one = _train_command(idx_dataset_dir, out, "--checkpoint-every", "8", "--keep-checkpoints", "10",
                         workers=1)
    second = subprocess.run(one, capture_output=True, text=True, env=_env(), timeout=300)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "resuming from" in second.stdout and "written by 2 workers" in second.stdout
    summary = json.loads((out / "summary.json").read_text())
    # 40 steps of 16 examples, then (1024 - 640) / 8 = 48 steps of 8.
    assert (summary["resumed_from_step"], summary["total_steps"]) == (40, 88)
    assert summary["examples_trained"] == 2 * 512
    records = _epochs_done(out)
    assert [r["workers"] for r in records] == [2, 1]
    _assert_progress_in_examples(out, epochs=2)


@pytest.mark.long  # a job of 10 to 20 seconds here
@pytest.mark.slow
def test_a_run_without_epoch_rounds_resumed_from_an_epoch_checkpoint_is_the_run_that_went_on(
        tmp_path, idx_dataset_dir):
    """SlowMo between rounds every 5 steps, epochs of 12: the first epoch's checkpoint waits
    for the round after step 15, so its model is SlowMo's x0 too, which a resume starts
    from (x0 is not kept), a quarter into the second epoch."""
    command = _train_command(
        idx_dataset_dir, tmp_path / "whole", "--model", "lenet", "--mode", "local",
        "--no-epoch-rounds", "--n-sync", "5", "--outer-optimizer", "slowmo",
        "--outer-momentum", "0.5", "--steps-per-epoch", "12", "--checkpoint-every", "1epoch",
        "--deterministic", workers=1)
    whole = subprocess.run(command, capture_output=True, text=True, env=_env(), timeout=300)
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-3000:]
    # The run as a kill right after the first epoch's checkpoint (at step 15) leaves it.
    assert [os.path.basename(p) for p in _checkpoints(tmp_path / "whole")] == \
        ["step-000000024", "step-000000015"]
    killed = tmp_path / "killed"
    shutil.copytree(tmp_path / "whole", killed)
    for name in ("summary.json", "model.weights.h5"):
        os.remove(killed / name)
    shutil.rmtree(CheckpointStore(str(killed / "checkpoints")).path_for(24))
    resumed = subprocess.run([*command[:command.index("--out") + 1], str(killed),
                              *command[command.index("--out") + 2:]],
                             capture_output=True, text=True, env=_env(), timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resuming from" in resumed.stdout
    went_on, again = (weights_in_file(folder / "model.weights.h5")
                      for folder in (tmp_path / "whole", killed))
    assert went_on.keys() == again.keys() and went_on
    for key in went_on:
        np.testing.assert_array_equal(again[key], went_on[key], err_msg=key)


def _tmp_folders(folder) -> list[str]:
    """The `.tmp-*` folders in checkpoints/: each one a save that has not finished."""
    try:
        return [n for n in os.listdir(folder) if n.startswith(".tmp-")]
    except FileNotFoundError:
        return []


def _kill_during_a_save(command, out, log) -> list[str]:
    """Run `command` until it has saved, SIGKILL it the moment its next save starts, and
    return the `.tmp-*` folders left: none if that save finished before the kill landed."""
    before = _checkpoints(out)[:1]
    with open(log, "w") as log_file:
        proc = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=_env())
    try:
        # A save of this run first: its prune clears what an earlier kill may have left
        # (e.g. an old checkpoint half removed), so whatever is on disk now is this kill's.
        saved = _wait_for(lambda: len(_checkpoints(out)) >= 2 and _checkpoints(out)[:1] != before,
                          240, proc)
        assert saved, log.read_text()[-3000:]
        while proc.poll() is None and not _tmp_folders(out / "checkpoints"):
            time.sleep(0.001)
        assert proc.poll() is None, "the run ended before a save was seen\n" + log.read_text()[-3000:]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    return _tmp_folders(out / "checkpoints")


@pytest.mark.long  # a job of 10 to 20 seconds here
@pytest.mark.slow
def test_killed_during_frequent_saves_leaves_only_whole_checkpoints(tmp_path, idx_dataset_dir):
    out = tmp_path / "run"
    command = _train_command(idx_dataset_dir, out, "--checkpoint-every", "1", "--keep-checkpoints",
                             "2", "--steps-per-epoch", "200", workers=1)
    # A save leaves no `.tmp-*` folder when it finishes (its prune removes every one), so
    # one left after the kill proves the kill landed inside a save. If the save finished
    # between being seen and the kill, run again: the job resumes and saves again.
    attempts = 5
    for _ in range(attempts):
        if _kill_during_a_save(command, out, tmp_path / "killed.log"):
            break
    else:
        pytest.fail(f"in {attempts} runs every save finished before the SIGKILL landed")
    names = os.listdir(out / "checkpoints")
    assert all(n.startswith(("step-", ".tmp-")) for n in names), names
    assert len(_checkpoints(out)) >= 2
    for path in _checkpoints(out):
        assert CheckpointStore.verify(path)[1] is None, path
    resumed = subprocess.run(command + ["--checkpoint-every", "1epoch"], capture_output=True,
                             text=True, env=_env(), timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stdout
    assert json.loads((out / "summary.json").read_text())["total_steps"] == 128  # 2 x 512 / 8
    assert not _tmp_folders(out / "checkpoints")


@pytest.mark.long  # a job of 10 to 20 seconds here
@pytest.mark.slow
def test_non_finite_loss_stops_naming_the_step_and_keeps_good_checkpoints(tmp_path, idx_dataset_dir):
    out = tmp_path / "run"
    result = subprocess.run(
        _train_command(idx_dataset_dir, out, "--base-lr", "1e9", "--max-lr", "0",
                       "--warmup-epochs", "0", "--checkpoint-every", "1", "--steps-per-epoch",
                       "30", workers=1),
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


@pytest.mark.long  # a job of 10 to 20 seconds here
@pytest.mark.multiprocess
def test_the_divergence_guard_stops_both_workers_at_the_same_step(tmp_path, idx_dataset_dir):
    # Two workers of 8 at rate 4 (peak 0.25): the loss spikes to about 40 within 20 steps.
    result = subprocess.run(
        _train_command(idx_dataset_dir, tmp_path / "run", "--base-lr", "4", "--warmup-epochs",
                       "0", "--lr-decay", "constant", "--log-every", "0"),
        capture_output=True, text=True, env=_env(), timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    stops = dict(re.findall(r"\[(\d)\]<stderr>:hvdtrain: error: (training diverged at step \d+)",
                            output))
    assert set(stops) == {"0", "1"} and stops["0"] == stops["1"], output[-3000:]
    # The first to exit left with the guard's code; horovodrun then ends the other, which
    # has stopped by itself already (its line above), not for a lost peer. The venv's
    # horovodrun (launch/quiet-horovodrun.sh) closes with one line and that code, where
    # Horovod's own printed its RuntimeError's traceback and exited 1.
    assert re.search(r"Process \d exit with status code 4\.", output), output[-3000:]
    assert "lost a peer" not in output and "Traceback" not in output, output[-3000:]
    assert result.returncode == 4, output[-3000:]
    assert re.search(r"^horovodrun: worker \d exited with status 4, so the job was ended",
                     result.stderr, re.M), output[-3000:]
    assert not (tmp_path / "run" / "summary.json").exists()


@pytest.mark.long
@pytest.mark.multiprocess
def test_a_hung_worker_ends_the_job_within_the_step_timeout(tmp_path, idx_dataset_dir):
    out = tmp_path / "run"
    # A short timeout: a fit's first step has the first step's allowance (10 minutes at
    # least), so a loaded machine compiling that step slowly does not end the job before the stop.
    command = _train_command(idx_dataset_dir, out, "--step-timeout", "5", "--steps-per-epoch", "400",
                             "--epochs", "3", "--checkpoint-every", "5")
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_env())
    victim = None
    try:
        # A checkpoint proves training is under way: step 5 has ended on every worker.
        if not _wait_for(lambda: len(_checkpoints(out)) >= 1, 240, proc):
            proc.kill()
            pytest.fail("no checkpoint was written\n" + proc.communicate(timeout=30)[0][-3000:])
        workers = _workers_of(proc)
        assert len(workers) == 2, workers
        victim = workers[-1]
        victim.send_signal(signal.SIGSTOP)  # alive but stuck, as a hung peer is
        try:
            output = proc.communicate(timeout=180)[0]  # generous: 5 s is what is meant
        except subprocess.TimeoutExpired:
            pytest.fail("the job was still running 180 s after a worker hung")
    finally:
        if victim is not None and victim.is_running():
            victim.send_signal(signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode != 0, output[-3000:]
    stalled = re.search(r"hvdtrain: error: no training step finished for 5 s after step (\d+) of "
                        r"this fit; a peer may have died or hung\. Ending the job\.", output)
    assert stalled, output[-3000:]
    assert int(stalled.group(1)) >= 5
    assert not (out / "summary.json").exists()


# --- elastic training: workers leave and join ---

def _elastic_job(tmp_path, data_dir, hosts: str, np_: int, *extra: str, max_np: int = 2):
    hosts_file = tmp_path / "hosts.txt"
    hosts_file.write_text(hosts)
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts_file}\n")
    discover.chmod(0o755)
    out = tmp_path / "run"
    # localhost and 127.0.0.1 are two hosts to Horovod; --network-interfaces lo spares the
    # NIC discovery that otherwise waits for two hosts.
    command = [os.path.join(BIN, "horovodrun"), "-np", str(np_), "--min-np", "1", "--max-np", str(max_np),
               "--host-discovery-script", str(discover), "--network-interfaces", "lo", "--gloo",
               os.path.join(BIN, "hvdtrain"), "train", "--elastic", "--out", str(out),
               "--data-dir", data_dir, "--model", "resnet20", "--batch-size", "8",
               "--elastic-commit-every", "5", "--no-validate", *extra]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_env())
    return proc, hosts_file, out


def _epochs_done(out):
    path = out / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _assert_progress_in_examples(out, epochs: int):
    """Each epoch logged once; every step logged once; the examples add up to the epochs
    within one global batch; each epoch's rate is the schedule at the examples seen."""
    cfg = load_config(str(out / "config.yaml"))
    summary = json.loads((out / "summary.json").read_text())
    length = summary["epoch_examples"]
    records = _epochs_done(out)
    assert [r["epoch"] for r in records] == list(range(1, epochs + 1))
    for record in records:
        global_batch = cfg.batch_size * record["workers"]
        assert 0 <= record["examples"] - record["epoch"] * length < global_batch, record
        # Hierarchical: the rule counts a host's workers too (hosts of equal slots here).
        host_workers = summary["workers_per_host"] if cfg.hierarchical_sgd else 0
        spec = schedule_in_examples(cfg.base_lr, cfg.batch_size, record["workers"],
                                    cfg.warmup_epochs * length, epochs * length, cfg.lr_decay, 0, 0,
                                    lr_scaling_workers(record["workers"], cfg.mode in LOCAL_MODES,
                                                       cfg.local_lr_workers, host_workers),
                                    cfg.lr_scaling, cfg.max_lr)
        # The rate logged is the one of the epoch's last step. Near a cosine's end the rate
        # is ~1e-6 and float32's rounding of it ~1e-10: hence an absolute floor too.
        last_step = (record["examples"] - global_batch) / global_batch
        assert record["lr"] == pytest.approx(learning_rate_at(last_step, spec), rel=1e-4,
                                             abs=1e-9), record
    assert summary["examples_trained"] == records[-1]["examples"]
    assert load_curve(str(out)).step == list(range(1, records[-1]["step"] + 1))


def _assert_resized(proc, output, out, first_workers, last_workers, epochs):
    """The job finished every epoch, starting with `first_workers` and ending with `last_workers`."""
    assert proc.returncode == 0, output[-4000:]
    assert f"training with {last_workers} worker(s) from step" in output
    records = _epochs_done(out)
    assert records[0]["workers"] == first_workers and records[-1]["workers"] == last_workers
    _assert_progress_in_examples(out, epochs)
    assert json.loads((out / "summary.json").read_text())["workers"] == last_workers


def _finish(proc, timeout=240):
    try:
        return proc.communicate(timeout=timeout)[0]
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.ci
@pytest.mark.multiprocess
@pytest.mark.parametrize("mode", [
    (),
    # A round in flight when the worker dies; the round after each 5th step blocks to commit.
    ("--mode", "async", "--n-sync", "2"),
], ids=["sync", "async"])
@pytest.mark.long
def test_elastic_job_loses_a_worker_and_finishes_with_the_other(tmp_path, idx_dataset_dir, mode):
    # No --steps-per-epoch: the epoch is the 512-example training set, 32 steps for two
    # workers and 64 for one; the worker is lost somewhere in the second epoch.
    proc, hosts, out = _elastic_job(tmp_path, idx_dataset_dir, "localhost:1\n127.0.0.1:1\n", 2,
                                    "--epochs", "3", *mode)
    try:
        assert _wait_for(lambda: len(_epochs_done(out)) >= 1, 240, proc)
        hosts.write_text("localhost:1\n")
        victim = [p for p in _workers_of(proc) if p.environ().get("HOROVOD_HOSTNAME") == "127.0.0.1"]
        victim[0].send_signal(signal.SIGKILL)
    finally:
        output = _finish(proc)
    _assert_resized(proc, output, out, first_workers=2, last_workers=1, epochs=3)


@pytest.mark.multiprocess
@pytest.mark.parametrize("extra, epochs", [
    ((), 6),
    # The worker that joins takes the survivor's F0, period and next round from the
    # commit; from its own first period it would hold other rounds, the collectives would
    # stop matching, and the step timeout would end the job.
    (("--mode", "local", "--n-sync", "auto:8", "--step-timeout", "60"), 5),
], ids=["sync", "local-adaptive-period"])
@pytest.mark.long
def test_elastic_job_takes_in_a_worker_that_joins(tmp_path, idx_dataset_dir, extra, epochs):
    proc, hosts, out = _elastic_job(tmp_path, idx_dataset_dir, "localhost:1\n", 1,
                                    "--steps-per-epoch", "30", "--epochs", str(epochs), *extra)
    try:
        assert _wait_for(lambda: len(_epochs_done(out)) >= 1, 240, proc)
        hosts.write_text("localhost:1\n127.0.0.1:1\n")
    finally:
        output = _finish(proc)
    _assert_resized(proc, output, out, first_workers=1, last_workers=2, epochs=epochs)
    for record in _epochs_done(out):
        for key in ("averaging_rounds", "n_sync"):
            # Logged as the mean over the workers: whole only if all held the same.
            assert float(record.get(key, 0)).is_integer(), record


@pytest.mark.multiprocess
@pytest.mark.long
def test_a_hierarchical_elastic_job_loses_a_host_and_finishes_on_the_other(tmp_path,
                                                                           idx_dataset_dir):
    """Two hosts of two workers (localhost and 127.0.0.1); both of 127.0.0.1's workers are
    killed at once after the first epoch. The other host's pair goes on from the last
    commit in a hierarchy of one host (its groups made again after the reset), and every
    epoch is logged once."""
    proc, hosts, out = _elastic_job(
        tmp_path, idx_dataset_dir, "localhost:2\n127.0.0.1:2\n", 4, "--epochs", "3",
        "--mode", "local", "--hierarchical-sgd", "--n-sync", "4", "--step-timeout", "60",
        max_np=4)
    try:
        assert _wait_for(lambda: len(_epochs_done(out)) >= 1, 300, proc)
        hosts.write_text("localhost:2\n")
        for victim in [p for p in _workers_of(proc)
                       if p.environ().get("HOROVOD_HOSTNAME") == "127.0.0.1"]:
            victim.send_signal(signal.SIGKILL)
    finally:
        output = _finish(proc, timeout=400)
    _assert_resized(proc, output, out, first_workers=4, last_workers=2, epochs=3)
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["hosts"], summary["workers_per_host"]) == (1, 2)
