"""--divergence-guard: the rule (hvdtrain.divergence) and the callback fed Keras's logs."""

import math
from types import SimpleNamespace

import pytest

from hvdtrain.divergence import (FACTOR, WINDOW, LossHistory, agree, divergence_message,
                                 left_guessing, reason_to_stop, reference_loss, shares)

FRESH = LossHistory(first=2.3, highest=2.3, lowest=2.3)  # a run that has not risen above its start


def test_a_non_finite_window_stops_the_run_even_during_warmup():
    for loss in (math.nan, math.inf):
        assert str(loss) in reason_to_stop(loss, FRESH, 10, after_warmup=False)
        assert str(loss) in reason_to_stop(loss, FRESH, 10, after_warmup=True)


def test_a_blow_up_stops_the_run_after_warmup_only():
    blown = FACTOR * 2.3 + 0.01
    history = LossHistory(2.3, blown, 2.3)
    assert reason_to_stop(blown, history, 10, after_warmup=False) is None
    reason = reason_to_stop(blown, history, 10, after_warmup=True)
    assert f"above {FACTOR:g} times where training started, 2.3" in reason
    below = FACTOR * 2.3 - 0.01
    assert reason_to_stop(below, LossHistory(2.3, below, below), 10, after_warmup=True) is None


def test_a_blow_up_in_warmup_stops_the_run_after_it_unless_the_loss_came_back_down():
    # It rose to 6.4 during warmup; after it, a network that died sits at ln(10).
    blew_up = LossHistory(first=2.9, highest=6.4, lowest=2.35)  # a first step above ln(10) too
    reason = reason_to_stop(2.35, blew_up, 10, after_warmup=True)
    assert "rose to 6.4" in reason and "has not come back down: 2.35" in reason
    assert reason_to_stop(left_guessing(10) - 0.01, blew_up, 10, True) is None
    assert reason_to_stop(0.6, blew_up, 10, after_warmup=True) is None  # it recovered
    assert reason_to_stop(2.35, FRESH, 10, after_warmup=True) is None   # never rose: slow


def test_a_run_that_never_left_guessing_stops_once_its_stall_is_judged():
    at_chance = LossHistory(first=2.3, highest=2.35, lowest=2.29)
    assert reason_to_stop(2.31, at_chance, 10, after_warmup=True) is None  # not judged yet
    reason = reason_to_stop(2.31, at_chance, 10, after_warmup=True, stall_judged=True)
    assert "never come below 2.07, ln(10) less 0.23" in reason and "2.29" in reason
    # It learnt once (a window below 0.9 ln 10): slow or noisy now, not stuck at chance.
    learnt = LossHistory(first=2.3, highest=2.35, lowest=left_guessing(10) - 0.01)
    assert reason_to_stop(2.31, learnt, 10, after_warmup=True, stall_judged=True) is None
    assert reason_to_stop(2.31, at_chance, 0, after_warmup=True, stall_judged=True) is None


def test_the_bar_for_leaving_guessing_is_a_tenth_below_ln_classes_from_10_classes_up():
    for classes in (10, 100, 1000):
        assert left_guessing(classes) == pytest.approx(0.9 * math.log(classes))
    # Fewer classes: 0.0256 nats a class beyond the first, less than a tenth of ln(classes).
    assert left_guessing(2) == pytest.approx(math.log(2) - 0.1 * math.log(10) / 9)
    assert left_guessing(2) == pytest.approx(0.668, abs=5e-4)
    assert 0.9 * math.log(5) < left_guessing(5) < math.log(5)


def test_a_binary_run_learning_slowly_goes_on_a_dead_one_stops():
    guessing = math.log(2)
    # Its lowest window 0.64 (a calibrated 65% right), half an epoch after warmup.
    slow = LossHistory(first=guessing, highest=0.70, lowest=0.64)
    assert reason_to_stop(0.64, slow, 2, after_warmup=True, stall_judged=True) is None
    # One warmup window rose above 1.5 ln 2, and it has come back down to 0.65.
    spiked = LossHistory(first=guessing, highest=1.10, lowest=0.65)
    assert reason_to_stop(0.65, spiked, 2, after_warmup=True, stall_judged=True) is None
    # A network that died sits at ln 2, whether it rose first or not.
    dead = LossHistory(first=guessing, highest=0.70, lowest=0.685)
    reason = reason_to_stop(0.69, dead, 2, after_warmup=True, stall_judged=True)
    assert "never come below 0.668, ln(2) less 0.026 (guessing scores 0.693)" in reason
    blew_up = LossHistory(first=guessing, highest=1.10, lowest=0.685)
    assert "has not come back down: 0.69" in reason_to_stop(0.69, blew_up, 2, True)


def test_ten_classes_are_judged_as_before_a_slow_run_goes_on_a_stuck_one_stops():
    slow = LossHistory(first=math.log(10), highest=2.40, lowest=2.00)
    assert reason_to_stop(2.00, slow, 10, after_warmup=True, stall_judged=True) is None
    stuck = LossHistory(first=math.log(10), highest=2.40, lowest=2.08)
    assert "never come below 2.07" in reason_to_stop(2.10, stuck, 10, True, stall_judged=True)
    blew_up = LossHistory(first=math.log(10), highest=3.6, lowest=2.08)
    assert "has not come back down: 2.08" in reason_to_stop(2.08, blew_up, 10, True)


def test_the_reference_is_where_training_started_but_never_below_guessing():
    assert reference_loss(2.5, 10) == 2.5                          # a fresh run's first step
    assert reference_loss(0.3, 10) == pytest.approx(math.log(10))  # resumed, or --init-weights
    assert reference_loss(0.3, 0) == 0.3                           # classes unknown


def _average(*parts):
    return {key: sum(part[key] for part in parts) / len(parts) for key in parts[0]}


def test_the_workers_agree_on_one_history_a_joining_worker_takes_from_the_others():
    # The first check: each worker's own first step, averaged; the window is the highest
    # and the lowest.
    window_mean, history = agree(_average(shares(2.2, None, 44.0, 20), shares(2.4, None, 48.0, 20)))
    assert window_mean == pytest.approx(2.3) and history == LossHistory(2.3, 2.3, 2.3)
    # Later, one of three joined an elastic job: its own first loss (0.4) is not the run's.
    old = LossHistory(2.3, 6.4, 1.9)
    window_mean, history = agree(_average(shares(2.2, old, 10.0, 20), shares(2.4, old, 12.0, 20),
                                          shares(0.4, None, 8.0, 20)))
    assert window_mean == pytest.approx(0.5) and history == LossHistory(
        pytest.approx(2.3), pytest.approx(6.4), pytest.approx(0.5))
    # A higher window leaves the lowest where it was.
    _, history = agree(_average(shares(None, history, 40.0, 20)))
    assert history.lowest == pytest.approx(0.5) and history.highest == pytest.approx(6.4)
    assert agree(_average(shares(None, None, 0.0, 0))) is None  # no step since the last check


def test_the_message_names_the_step_the_peak_the_batch_and_what_to_try():
    line = divergence_message("the loss is nan", 40, 0.4, 1024)
    assert "\n" not in line
    for words in ("step 40", "peak learning rate 0.4", "global batch of 1024",
                  "--lr-scaling sqrt", "--max-lr 0.1",
                  "--optimizer lamb (its peak is capped at 0.03)",
                  "--base-lr",
                  "--no-divergence-guard"):
        assert words in line, words
    # A run on LAMB already (--optimizer auto takes it at this batch) is not sent to it.
    lamb = divergence_message("the loss is nan", 40, 0.03, 1024, lamb=True)
    assert "--optimizer lamb" not in lamb and "--max-lr 0.0075, or a lower --base-lr" in lamb


# --- the callback, fed the running means Keras logs after each batch ---

def _guard(warmup_epochs=0.5, epoch_examples=640, batch_size=32, peak=0.4, classes=10):
    from hvdtrain import comm
    from hvdtrain.keras.schedule import WarmupDecaySchedule
    from hvdtrain.progress import TrainingProgress
    from hvdtrain.training.divergence_guard import DivergenceGuard

    comm.init()  # a world of one worker
    progress = TrainingProgress(epoch_examples=epoch_examples)
    guard = DivergenceGuard(progress, batch_size, warmup_epochs, classes)
    # 32 workers' global batch at base 0.1 scaled linearly: peak 0.4 over 1024.
    schedule = WarmupDecaySchedule(peak / 4, 32, 32, 10, 100)
    guard.set_model(SimpleNamespace(optimizer=SimpleNamespace(_learning_rate=schedule)))
    return guard, progress


def _train(guard, progress, losses, steps_per_epoch=20, batch_size=32):
    """Feed `losses`, one per step, as Keras does: its running mean within each epoch.
    Returns the steps trained before the guard stopped the run (all of them if not)."""
    guard.on_train_begin()
    for start in range(0, len(losses), steps_per_epoch):
        guard.on_epoch_begin(start // steps_per_epoch)
        epoch = losses[start:start + steps_per_epoch]
        for batch, _ in enumerate(epoch):
            progress.advance(1, batch_size, 1)
            guard.on_train_batch_end(batch, {"loss": sum(epoch[:batch + 1]) / (batch + 1)})
        guard.on_epoch_end(start // steps_per_epoch, {})
    return progress.steps


def _decreasing(steps):
    return [2.3 * math.exp(-step / 60) + 0.2 for step in range(steps)]


def test_the_guard_lets_a_normal_decreasing_loss_train():
    guard, progress = _guard()
    assert _train(guard, progress, _decreasing(200)) == 200
    assert guard.history.first == pytest.approx(_decreasing(1)[0])


def test_a_run_that_starts_low_is_held_to_guessing_not_to_its_first_loss():
    from hvdtrain.training.callbacks import TrainingDiverged

    bump = [0.3] * WINDOW + [0.6] * 3 * WINDOW  # twice its start, far better than guessing
    guard, progress = _guard()
    assert _train(guard, progress, bump) == 4 * WINDOW
    guard, progress = _guard(classes=0)
    with pytest.raises(TrainingDiverged):
        _train(guard, progress, bump)


def test_the_guard_stops_a_blow_up_after_warmup_naming_the_step(monkeypatch):
    from hvdtrain.training.callbacks import TrainingDiverged

    guard, progress = _guard()  # warmup: 320 examples, 10 steps
    losses = _decreasing(40) + [6.4] * 40
    with pytest.raises(TrainingDiverged) as stopped:
        _train(guard, progress, losses)
    # The first window after the blow-up at step 40, over 1.5 x the first step's 2.5.
    assert progress.steps == 60
    assert "training diverged at step 60" in str(stopped.value)
    assert "peak learning rate 0.4 for a global batch of 32" in str(stopped.value)


def test_the_guard_does_not_stop_a_blow_up_during_warmup_that_recovers():
    guard, progress = _guard(warmup_epochs=4.0)  # warmup: 80 steps
    losses = _decreasing(20) + [6.4] * 40 + _decreasing(200)[-80:]
    assert _train(guard, progress, losses) == 140


def test_the_guard_stops_a_loss_that_explodes_during_warmup_without_waiting_for_its_end():
    from hvdtrain.training.callbacks import TrainingDiverged

    guard, progress = _guard(warmup_epochs=4.0)  # warmup: 80 steps
    losses = _decreasing(20) + [1e18] * 60
    with pytest.raises(TrainingDiverged, match="above 10 times where training started"):
        _train(guard, progress, losses)
    assert progress.steps < 80


def test_the_guard_stops_a_run_that_blew_up_in_warmup_and_died_after_it():
    from hvdtrain.training.callbacks import TrainingDiverged

    guard, progress = _guard(warmup_epochs=4.0)  # warmup: 80 steps
    losses = _decreasing(20) + [6.4] * 20 + [2.35] * 80  # then constant outputs: ln(10)
    with pytest.raises(TrainingDiverged, match="rose to 6.4 .* has not come back down"):
        _train(guard, progress, losses)
    assert progress.steps == 100  # the first check after warmup


def test_the_guard_stops_a_nan_loss_during_warmup():
    from hvdtrain.training.callbacks import TrainingDiverged

    guard, progress = _guard(warmup_epochs=4.0)
    with pytest.raises(TrainingDiverged, match="last 20 steps is nan"):
        _train(guard, progress, _decreasing(25) + [math.nan] * 20)
    assert progress.steps == 40


def test_the_guard_stops_a_run_stuck_at_chance_half_an_epoch_after_warmup():
    from hvdtrain.training.callbacks import TrainingDiverged

    # LAMB at 0.1 at 16 x 64: ln(10) from the start, never above it. Warmup: 10 steps;
    # half an epoch (10 steps) later, 320 + 320 examples; but not before 100 steps.
    guard, progress = _guard()
    with pytest.raises(TrainingDiverged, match="at step 100: .*never come below"):
        _train(guard, progress, [2.31] * 200)
    # A short run at a small rate that has not left guessing yet is not judged.
    guard, progress = _guard()
    assert _train(guard, progress, [2.31] * 99) == 99
    # A dataset with random labels is never held to learning.
    guard, progress = _guard()
    guard.judge_learning = False
    assert _train(guard, progress, [2.31] * 200) == 200


def test_the_guard_checks_at_epoch_ends_when_rounds_are_timed():
    from hvdtrain.training.callbacks import TrainingDiverged

    guard, progress = _guard()
    guard.at_epoch_ends = True
    with pytest.raises(TrainingDiverged, match="last 30 steps"):
        _train(guard, progress, _decreasing(30) + [9.0] * 30, steps_per_epoch=30)
    assert progress.steps == 60  # not at step 40: the workers meet at epoch ends only
