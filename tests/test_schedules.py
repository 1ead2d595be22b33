import math

import pytest

from hvdtrain.schedules import (ScheduleSpec, learning_rate_at, lr_scaling_workers, scaled_lr,
                                schedule_in_examples)

SPEC = ScheduleSpec(base_lr=0.1, per_worker_batch=64, workers=4, warmup_steps=100,
                    total_steps=1100, decay="cosine")


def test_linear_scaling_rule_uses_global_batch_over_256():
    assert scaled_lr(0.1, 256) == pytest.approx(0.1)
    assert scaled_lr(0.1, 8192) == pytest.approx(3.2)
    assert SPEC.peak_lr == pytest.approx(0.1)        # 64 x 4 = 256
    assert SPEC.initial_lr == pytest.approx(0.025)   # one worker's batch of 64


def test_warmup_ramps_linearly_from_one_worker_rate_to_scaled_rate():
    assert learning_rate_at(0, SPEC) == pytest.approx(0.025)
    assert learning_rate_at(50, SPEC) == pytest.approx(0.0625)
    assert learning_rate_at(99, SPEC) == pytest.approx(0.025 + 0.075 * 0.99)
    assert learning_rate_at(100, SPEC) == pytest.approx(0.1)


def test_cosine_decay_halves_midway_and_reaches_zero():
    assert learning_rate_at(600, SPEC) == pytest.approx(0.05)
    assert learning_rate_at(1100, SPEC) == pytest.approx(0.0, abs=1e-12)
    assert learning_rate_at(5000, SPEC) == pytest.approx(0.0, abs=1e-12)


def test_step_decay_drops_tenfold_at_half_and_three_quarters():
    spec = ScheduleSpec(0.1, 64, 4, 100, 1100, "step")
    assert learning_rate_at(599, spec) == pytest.approx(0.1)
    assert learning_rate_at(600, spec) == pytest.approx(0.01)
    assert learning_rate_at(850, spec) == pytest.approx(0.001)


def test_constant_decay_and_no_warmup():
    spec = ScheduleSpec(0.2, 128, 2, 0, 10, "constant")
    assert [learning_rate_at(s, spec) for s in (0, 5, 10)] == pytest.approx([0.2] * 3)


def test_schedule_in_examples_continues_at_the_same_position_after_the_workers_change():
    # 4 workers of 32 ran 30 steps (3840 examples); 2 workers go on from step 30.
    before = schedule_in_examples(0.1, 32, 4, 1280, 12800, "cosine", 0, 0)
    after = schedule_in_examples(0.1, 32, 2, 1280, 12800, "cosine", 3840, 30)
    # The position in the schedule (rate / peak rate) is the same at the hand-over...
    assert learning_rate_at(30, after) / after.peak_lr == pytest.approx(
        learning_rate_at(30, before) / before.peak_lr)
    # ...and the new workers reach the end of the schedule at the same examples.
    assert learning_rate_at(30 + (12800 - 3840) // 64, after) == pytest.approx(0.0, abs=1e-12)
    assert after.peak_lr == before.peak_lr / 2  # linear scaling follows the global batch


def test_local_steps_scale_the_rate_to_at_most_the_capped_workers():
    assert lr_scaling_workers(8, local_steps=False, cap=4) == 8   # sync: the global batch
    assert lr_scaling_workers(8, local_steps=True, cap=4) == 4
    assert lr_scaling_workers(2, local_steps=True, cap=4) == 2
    assert lr_scaling_workers(8, local_steps=True, cap=0) == 8    # 0: no cap
    # 8 workers of 64 that count as 4: the rate of a batch of 256, over the steps of 8.
    spec = schedule_in_examples(0.1, 64, 8, 5120, 51200, "cosine", 0, 0, lr_workers=4)
    assert (spec.peak_lr, spec.initial_lr) == pytest.approx((0.1, 0.025))
    assert (spec.warmup_steps, spec.total_steps) == (10, 100)


@pytest.mark.parametrize("decay", ["cosine", "step", "constant"])
def test_keras_schedule_matches_pure_function(decay):
    import keras
    import tensorflow as tf

    from hvdtrain.keras.schedule import WarmupDecaySchedule

    spec = ScheduleSpec(0.1, 32, 8, 37.5, 400.25, decay, step_offset=-2.5, lr_workers=6)
    schedule = WarmupDecaySchedule.from_spec(spec)
    for step in (0, 1, 20, 36, 37, 38, 200, 300, 399, 400, 450):
        assert float(schedule(tf.constant(step))) == pytest.approx(
            learning_rate_at(step, spec), rel=1e-5, abs=1e-8), step
    clone = keras.optimizers.schedules.deserialize(
        keras.optimizers.schedules.serialize(schedule))
    assert clone.spec == spec
    assert math.isclose(float(clone(tf.constant(10))), learning_rate_at(10, spec), rel_tol=1e-5)


@pytest.mark.parametrize("mode, cap, peak", [("sync", 4, 0.2), ("local", 4, 0.1),
                                             ("async", 4, 0.1), ("local", 0, 0.2)])
def test_a_runs_world_caps_the_rate_of_local_steps_only(monkeypatch, mode, cap, peak):
    from hvdtrain import comm
    from hvdtrain.config import TrainConfig
    from hvdtrain.progress import TrainingProgress
    from hvdtrain.training.world import current_world

    monkeypatch.setattr(comm, "size", lambda: 8)
    monkeypatch.setattr(comm, "rank", lambda: 0)
    cfg = TrainConfig(mode=mode, local_lr_workers=cap, base_lr=0.1, batch_size=64)
    world = current_world(cfg, TrainingProgress(epoch_examples=5120))
    assert world.global_batch == 512 and world.schedule.peak_lr == pytest.approx(peak)
