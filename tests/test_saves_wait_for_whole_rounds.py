"""A save that waits asks for a whole round, and only an elastic reset cancels it.

Without epoch rounds a checkpoint waits for the period's next round. With fragments a
period's round averages one fragment and leaves the workers apart, so the round a save
waits for must be whole; and a save still waiting when a `fit` ends (the trainer starts a
new one at every change of epoch length) is written in the next. Two workers in threads
run the real LocalSGD and the real Checkpointer, with a store that notes the steps it
saves at.
"""

from __future__ import annotations

import threading

import keras
import numpy as np
import pytest
import tensorflow as tf

import hvdtrain.keras as hk
from fake_comm import FakeComm
from hvdtrain import comm
from hvdtrain.progress import TrainingProgress
from hvdtrain.rounds.save_plan import PendingSave, SavePlan
from hvdtrain.rounds.triggers import ConsensusWanted
from hvdtrain.training.callbacks import Checkpointer
from threaded_comm import run_workers

BUILDING = threading.Lock()  # Keras's seeding and layer names are the process's
N_SYNC = 4


class SavedSteps:
    """Stands in for the CheckpointStore: the steps saved at."""

    def __init__(self):
        self.steps: list[int] = []

    def save(self, state, saved) -> None:
        self.steps.append(saved.progress.steps)

    def newest(self):
        return None


class PendingAtFitStart(keras.callbacks.Callback):
    """Whether LocalSGD (the callback before this one) wants a whole round as each fit starts."""

    def __init__(self, sgd):
        super().__init__()
        self.sgd = sgd
        self.seen: list[bool] = []

    def on_train_begin(self, logs=None):
        self.seen.append(self.sgd.consensus.pending)


def _model() -> keras.Model:
    with BUILDING:
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(2)])
    model.compile(hk.with_gradient_averaging(keras.optimizers.SGD(0.1), averaging=False),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _stream(rank: int) -> tf.data.Dataset:
    rng = np.random.default_rng(rank)
    x = rng.normal(size=(512, 5)).astype("float32")
    y = (x[:, 0] > 0).astype("int64")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(4).repeat()


def _train(fits, saves: SavePlan, run_epochs: int, fragments: int, resets=None,
           reset_before_fit: int | None = None):
    """Two workers through `fits` [(first_epoch, end_epoch, steps_per_epoch)], as the
    trainer's fit phases, without epoch rounds. `reset_before_fit`: every worker joins a
    new set of workers (a new `comm.world_id()`) before that fit, as after an elastic reset.
    Rank 0's checkpoint steps, and whether rank k's LocalSGD wanted a whole round at each
    fit's start."""
    def work(rank):
        model = _model()
        sgd = hk.LocalSGD(n_sync=N_SYNC, epoch_rounds=False, saves=saves,
                          run_epochs=run_epochs, round_fragments=fragments)
        watch = PendingAtFitStart(sgd)
        store = SavedSteps()
        checkpointer = Checkpointer(store, None, saves, sgd.progress, 4)
        stream = _stream(comm.rank())
        for fit, (first, end, steps) in enumerate(fits):
            if fit == reset_before_fit:
                resets[rank] = 1
            model.fit(stream, initial_epoch=first, epochs=end, steps_per_epoch=steps, verbose=0,
                      callbacks=[sgd, watch] + ([checkpointer] if rank == 0 else []))
        return store.steps, watch.seen, sgd.progress.steps
    results = run_workers(2, work)
    return results[0][0], [seen for _, seen, _ in results], results[0][2]


@pytest.mark.parametrize("fragments, saved", [(1, [8, 12, 20, 24]), (2, [8, 16, 20, 24])])
def test_without_epoch_rounds_each_epochs_checkpoint_is_written_within_a_period(fragments, saved):
    # Epochs of 6 steps, rounds every 4: each epoch's end (6, 12, 18) waits for the next
    # round, which is whole; the last is the run's end. With two fragments the round at
    # step 12 averaged one fragment only, so epoch 2's checkpoint waited for the next.
    steps, _, trained = _train([(0, 4, 6)], SavePlan("epochs", 1), run_epochs=4,
                               fragments=fragments)
    assert trained == 24
    assert steps == saved
    ends = [6, 12, 18, 24]
    assert all(0 <= step - end <= N_SYNC for step, end in zip(steps, ends))


@pytest.mark.parametrize("fragments", [1, 2])
def test_a_step_checkpoint_due_as_a_fit_ends_is_written_in_the_next_fit(fragments):
    # Every 6 steps, rounds every 4: the save due after step 6 waits for the round after 8,
    # which falls in the second of the run's fits (epochs of 7 and 6 steps).
    one_fit, _, _ = _train([(0, 1, 13)], SavePlan("steps", 6), 1, fragments)
    two_fits, pending, trained = _train([(0, 1, 7), (1, 2, 6)], SavePlan("steps", 6), 2,
                                        fragments)
    assert trained == 13
    assert one_fit == two_fits == [8, 12]
    assert pending == [[False, True]] * 2  # every worker asks for a whole round at step 8


def test_only_a_new_set_of_workers_cancels_a_pending_save(monkeypatch):
    # As after an elastic reset: the survivors roll back past the save's step, and a worker
    # that joins never saw it fall due, so no worker may still wait for it (a survivor asking
    # for a whole round where the newcomer does not would part their collectives).
    resets: dict[int, int] = {}
    monkeypatch.setattr(FakeComm, "fake_world_id",
                        lambda self: self.world_id + resets.get(self.rank, 0))
    steps, pending, _ = _train([(0, 1, 7), (1, 2, 6)], SavePlan("steps", 6), 2, fragments=2,
                               resets=resets, reset_before_fit=1)
    assert steps == [12]  # step 6's save is void; step 12's is written
    assert pending == [[False, False]] * 2


def test_consensus_is_wanted_after_an_epoch_checkpoint_the_workers_end_apart():
    wanted = ConsensusWanted(SavePlan("epochs", 2))
    wanted.begin_fit(world=1)
    wanted.note_epoch_end(1, agree=False)
    assert not wanted.pending              # epoch 1 saves nothing
    wanted.note_epoch_end(2, agree=True)
    assert not wanted.pending              # saved at the epoch's end
    wanted.note_epoch_end(4, agree=False)
    assert wanted.pending                  # waits for the next round
    wanted.begin_fit(world=1)  # the next fit
    assert wanted.take() and not wanted.take()  # one whole round, across fits of one world


def test_a_pending_save_outlives_fits_of_one_set_of_workers_only():
    pending = PendingSave((5,), lambda epochs: epochs % 2 == 0)
    pending.begin_fit(world=1)
    pending.after_steps(range(4, 6))
    pending.begin_fit(world=1)
    assert pending.due
    pending.begin_fit(world=2)
    assert not pending.due
    pending.after_epoch(2)
    assert pending.due
    pending.written()
    assert not pending.due


def test_a_checkpoint_due_inside_an_execution_of_several_steps_is_written(tmp_path):
    # With steps_per_execution = 2 a batch callback covers steps 5 and 6: a save due after
    # step 5 is written at the execution's end, where the workers agree (one worker here).
    with FakeComm(2, 0):
        progress = TrainingProgress(epoch_examples=80)
        store = SavedSteps()
        checkpointer = Checkpointer(store, None, SavePlan("steps", 5), progress, 4)
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        checkpointer.set_model(model)
        checkpointer.set_params({"steps": 10})
        checkpointer.on_train_begin()
        for begin in range(0, 8, 2):
            checkpointer.on_train_batch_begin(begin)
            progress.advance(2)
            checkpointer.on_train_batch_end(begin + 1)
    assert store.steps == [6]
