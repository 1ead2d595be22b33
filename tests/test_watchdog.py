"""The step watchdog, driven through its callback methods with a fake clock."""

from __future__ import annotations

import contextlib
import os
import threading
import time

import numpy as np
import pytest
import keras

from hvdtrain.training import watchdog as watchdog_module
from hvdtrain.training.watchdog import StepWatchdog

TIMEOUT = 10.0
FIRST_STEP = 600.0  # the first step's allowance at this timeout: the floor


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def fired():
    return []  # the messages on_timeout was given


@pytest.fixture
def dog(clock, fired):
    # A poll of an hour: the thread exists but never checks; the tests call check().
    with StepWatchdog(TIMEOUT, poll=3600, clock=clock, on_timeout=fired.append) as watchdog:
        yield watchdog


def _watchers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "hvdtrain-watchdog" and t.is_alive()]


def _start_fit(dog, clock, compile_seconds=0.0):
    """A fit up to its first step's end, that step taking `compile_seconds`."""
    dog.on_train_begin()
    dog.on_epoch_begin(0)
    dog.on_train_batch_begin(0)
    clock.advance(compile_seconds)


def _step(dog, clock, batch, seconds=1.0):
    dog.on_train_batch_begin(batch)
    clock.advance(seconds)
    dog.on_train_batch_end(batch)


def test_the_first_step_gets_its_allowance_and_a_hang_before_it_ends_fires(dog, clock, fired):
    _start_fit(dog, clock)
    assert dog.first_step_timeout == FIRST_STEP == 60 * TIMEOUT  # compiling may take long
    clock.advance(FIRST_STEP)
    assert not dog.check()
    clock.advance(1)
    assert dog.check()
    assert fired == ["hvdtrain: error: the first training step of this fit did not finish within "
                     "600 s of its start (the first step's allowance, tracing included); a peer "
                     "may have died or hung. Ending the job."]


def test_once_the_first_step_ends_the_step_timeout_applies(dog, clock, fired):
    _start_fit(dog, clock, compile_seconds=0.9 * FIRST_STEP)
    dog.on_train_batch_end(0)
    clock.advance(TIMEOUT / 2)
    assert not dog.check() and fired == []
    clock.advance(TIMEOUT)
    assert dog.check() and "after step 1 of this fit" in fired[0]


def test_the_first_steps_allowance_is_five_timeouts_and_at_least_ten_minutes():
    assert StepWatchdog(10).first_step_timeout == watchdog_module.FIRST_STEP_FLOOR == 600
    assert StepWatchdog(600).first_step_timeout == 3000
    assert StepWatchdog(10, first_step_timeout=30).first_step_timeout == 30


def test_armed_before_the_fit_a_hang_in_an_earlier_callbacks_train_begin_fires(dog, clock, fired):
    dog.expect_first_step()  # the runner, before fit: the broadcasts at train begin come first
    clock.advance(FIRST_STEP + 1)
    assert dog.check() and fired[0].startswith(
        "hvdtrain: error: the first training step of this fit did not finish within 600 s")


def test_a_watched_task_fires_when_a_batch_or_its_closing_allreduce_hangs(dog, clock, fired):
    dog.watch("the final evaluation")
    clock.advance(0.9 * FIRST_STEP)  # the first batch traces the test step
    assert not dog.check()
    for _ in range(5):  # an evaluation much longer than the timeout, in batches
        dog.beat()
        clock.advance(0.9 * TIMEOUT)
        assert not dog.check()
    dog.beat()
    clock.advance(TIMEOUT + 1)  # the allreduce of the totals never returns
    assert dog.check()
    assert fired == ["hvdtrain: error: the final evaluation made no progress for 10 s; a peer "
                     "may have died or hung. Ending the job."]


def test_a_closed_watchdog_ignores_beats(dog, clock, fired):
    dog.watch("the final evaluation")
    dog.close()
    dog.beat()
    clock.advance(2 * FIRST_STEP)
    assert not dog.check() and fired == []


def test_fires_when_no_step_ends_for_the_timeout(dog, clock, fired):
    _start_fit(dog, clock, compile_seconds=3 * TIMEOUT)
    dog.on_train_batch_end(0)
    dog.on_train_batch_begin(1)
    clock.advance(TIMEOUT)
    assert not dog.check()
    clock.advance(0.5)
    assert dog.check()
    assert len(fired) == 1


def test_the_message_names_the_step_and_the_timeout(dog, clock, fired):
    _start_fit(dog, clock)
    dog.on_train_batch_end(0)
    for batch in (1, 2):
        _step(dog, clock, batch)
    clock.advance(TIMEOUT + 1)
    dog.check()
    assert fired == ["hvdtrain: error: no training step finished for 10 s after step 3 of this "
                     "fit; a peer may have died or hung. Ending the job."]


def test_steps_run_several_per_call_are_all_counted(dog, clock, fired):
    dog.on_train_begin()
    for first in (0, 4, 8):  # steps_per_execution=4
        dog.on_train_batch_begin(first)
        dog.on_train_batch_end(first + 3)
    clock.advance(TIMEOUT + 1)
    assert dog.check() and "after step 12 of this fit" in fired[0]


def test_each_step_that_ends_resets_the_timer(dog, clock, fired):
    _start_fit(dog, clock)
    dog.on_train_batch_end(0)
    for batch in range(1, 20):
        _step(dog, clock, batch, seconds=0.9 * TIMEOUT)
        assert not dog.check()
    assert fired == []


def test_a_stall_is_reported_once(dog, clock, fired):
    _start_fit(dog, clock)
    dog.on_train_batch_end(0)
    clock.advance(2 * TIMEOUT)
    assert dog.check()
    clock.advance(2 * TIMEOUT)
    assert not dog.check() and len(fired) == 1


def test_validation_pauses_until_its_first_batch_ends_then_each_batch_counts(dog, clock, fired):
    _start_fit(dog, clock)
    dog.on_train_batch_end(0)
    clock.advance(0.9 * TIMEOUT)
    dog.on_test_begin()
    clock.advance(5 * TIMEOUT)  # the test step compiling
    assert not dog.check()
    dog.on_test_batch_end(0)
    for batch in range(1, 5):  # a validation pass much longer than the timeout
        clock.advance(0.9 * TIMEOUT)
        assert not dog.check()
        dog.on_test_batch_end(batch)
    clock.advance(TIMEOUT + 1)  # a hang within validation is still seen
    assert dog.check()


def test_epoch_boundaries_give_the_save_its_own_timeout(dog, clock, fired):
    _start_fit(dog, clock)
    dog.on_train_batch_end(0)
    clock.advance(0.9 * TIMEOUT)
    dog.on_test_begin()
    dog.on_test_batch_end(0)
    clock.advance(0.9 * TIMEOUT)
    dog.on_test_end()
    clock.advance(0.9 * TIMEOUT)  # epoch-end logs and a checkpoint save
    assert not dog.check()
    dog.on_epoch_end(0)
    clock.advance(0.5 * TIMEOUT)
    dog.on_epoch_begin(1)
    dog.on_train_batch_begin(0)
    clock.advance(0.9 * TIMEOUT)
    assert not dog.check()
    clock.advance(0.2 * TIMEOUT)  # but the next step does not end
    assert dog.check() and "after step 1 of this fit" in fired[0]


def test_evaluation_outside_a_fit_does_not_arm(dog, clock, fired):
    dog.on_test_begin()
    dog.on_test_batch_end(0)
    dog.on_test_end()
    clock.advance(2 * TIMEOUT)
    assert not dog.check()


def test_disarmed_and_its_thread_stopped_after_the_fit_ends(dog, clock, fired):
    before = len(_watchers())
    _start_fit(dog, clock)
    assert len(_watchers()) == before + 1
    dog.on_train_batch_end(0)
    dog.on_epoch_end(0)
    dog.on_train_end()
    assert len(_watchers()) == before
    clock.advance(100 * TIMEOUT)
    assert not dog.check() and fired == []


def test_a_fit_ended_by_an_exception_then_a_new_fit_leaves_one_quiet_watcher(dog, clock, fired):
    before = len(_watchers())
    _start_fit(dog, clock)
    dog.on_train_batch_end(0)
    _step(dog, clock, 1)  # then the fit raises: no on_train_end
    clock.advance(0.5 * TIMEOUT)
    _start_fit(dog, clock, compile_seconds=5 * TIMEOUT)  # e.g. an elastic restart, retracing
    assert not dog.check()
    assert len(_watchers()) == before + 1
    dog.on_train_batch_end(0)
    clock.advance(TIMEOUT + 1)
    assert dog.check() and "after step 1 of this fit" in fired[0]  # counted from the new fit


def test_close_disarms_and_stops_the_thread(dog, clock, fired):
    before = len(_watchers())
    _start_fit(dog, clock)
    dog.on_train_batch_end(0)
    dog.close()
    assert len(_watchers()) == before
    clock.advance(2 * TIMEOUT)
    assert not dog.check()


def test_the_thread_calls_on_timeout_when_a_step_stalls():
    fired = threading.Event()
    with StepWatchdog(0.05, poll=0.01, on_timeout=lambda message: fired.set()) as dog:
        dog.on_train_begin()
        dog.on_train_batch_end(0)
        assert fired.wait(30)


def test_the_default_on_timeout_prints_and_exits_with_code_5(monkeypatch, capsys):
    def fake_exit(code):
        raise SystemExit(code)

    monkeypatch.setattr(os, "_exit", fake_exit)
    with pytest.raises(SystemExit) as exited:
        watchdog_module.end_job("hvdtrain: error: stalled")
    assert exited.value.code == StepWatchdog.EXIT_CODE == 5
    assert capsys.readouterr().err == "hvdtrain: error: stalled\n"


def test_in_a_real_fit_a_raising_fit_then_a_new_one_share_one_watcher(clock, fired):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    x, y = np.zeros((16, 3), "float32"), np.zeros((16, 1), "float32")
    before = len(_watchers())
    seen = []

    class Probe(keras.callbacks.Callback):
        def __init__(self, fail_at=None):
            super().__init__()
            self.fail_at = fail_at

        def on_train_batch_end(self, batch, logs=None):
            seen.append(len(_watchers()) - before)
            if batch == self.fail_at:
                raise RuntimeError("a peer failed")  # as an elastic reset ends a fit

    with StepWatchdog(TIMEOUT, poll=3600, clock=clock, on_timeout=fired.append) as dog:
        with pytest.raises(RuntimeError):
            model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[Probe(fail_at=1), dog])
        assert len(_watchers()) == before + 1  # left running, armed
        model.fit(x, y, batch_size=4, epochs=2, verbose=0, validation_data=(x, y),
                  callbacks=[Probe(), dog])
        assert len(_watchers()) == before
    assert seen == [1] * 10 and fired == []


def test_in_a_real_fit_the_message_counts_every_step_run_several_per_call(clock, fired):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", steps_per_execution=2)
    x, y = np.zeros((16, 3), "float32"), np.zeros((16, 1), "float32")

    class StallAtTheEnd(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                clock.advance(TIMEOUT + 1)
                dog.check()

    with StepWatchdog(TIMEOUT, poll=3600, clock=clock, on_timeout=fired.append) as dog:
        model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[StallAtTheEnd(), dog])
    assert len(fired) == 1 and "after step 8 of this fit" in fired[0]


@pytest.mark.long  # a training process of 8 seconds here
def test_a_run_is_watched_from_each_fits_start_and_through_the_final_evaluation(
        tmp_path, monkeypatch):
    from hvdtrain import comm
    from hvdtrain.config import load_config
    from hvdtrain.training import callback_factory, runner

    fired = []
    monkeypatch.setattr(callback_factory, "StepWatchdog", lambda timeout: StepWatchdog(
        timeout, first_step_timeout=1.0, poll=0.05, on_timeout=fired.append))
    real_evaluate = runner.evaluate

    def evaluate_after_a_hang(*args, **kwargs):
        time.sleep(3)  # as an allreduce that a hung peer never joins
        return real_evaluate(*args, **kwargs)

    class HangAtTrainBegin(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            time.sleep(3)  # as a broadcast at train begin that a hung peer never joins

    monkeypatch.setattr(runner, "evaluate", evaluate_after_a_hang)
    comm.init()  # a world of one worker
    before = len(_watchers())
    runner.train(load_config(None, dict(
        model="lenet", dataset="synthetic", batch_size=8, epochs=1, steps_per_epoch=2,
        validate=False, step_timeout=60, out=str(tmp_path / "run"))),
        verbose=0, extra_callbacks=(HangAtTrainBegin(),))
    assert any(m.startswith("hvdtrain: error: the first training step of this fit did not "
                            "finish within 1 s") for m in fired), fired
    assert "hvdtrain: error: the final evaluation made no progress for 1 s; a peer may have " \
           "died or hung. Ending the job." in fired
    assert len(_watchers()) == before  # closed for good when the run ended


def test_an_evaluation_within_training_beats_the_watchdog_after_every_test_batch(tmp_path):
    """An --eval-every evaluation runs between two steps: without beats, one longer than
    --step-timeout would end a healthy job."""
    import keras
    import numpy as np
    import tensorflow as tf

    from hvdtrain import comm
    from hvdtrain.keras import with_gradient_averaging
    from hvdtrain.progress import TrainingProgress
    from hvdtrain.training.periodic_eval import PeriodicEvaluation

    comm.init()

    class InConsensus:
        period = 1

        def evaluating(self):
            return contextlib.nullcontext()

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(with_gradient_averaging(keras.optimizers.SGD()),  # counts what it sent
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    test = tf.data.Dataset.from_tensor_slices(
        (np.zeros((12, 3), "float32"), np.zeros(12, "int64"))).batch(4)
    beats = []
    evaluation = PeriodicEvaluation(1, lambda: test, InConsensus(),
                                    TrainingProgress(epoch_examples=12), 0.0,
                                    str(tmp_path / "metrics.jsonl"), beat=lambda: beats.append(1))
    evaluation.set_model(model)
    evaluation.evaluate_now()
    assert len(beats) == 3
