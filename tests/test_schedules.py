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


@pytest.mark.parametrize("scaling, peak_1024, peak_64", [
    ("linear", 0.4, 0.025), ("sqrt", 0.2, 0.05), ("none", 0.1, 0.1)])
def test_the_peak_follows_the_global_batch_by_the_chosen_rule(scaling, peak_1024, peak_64):
    assert scaled_lr(0.1, 256, scaling) == pytest.approx(0.1)  # the reference batch
    assert scaled_lr(0.1, 1024, scaling) == pytest.approx(peak_1024)
    assert scaled_lr(0.1, 64, scaling) == pytest.approx(peak_64)
    with pytest.raises(ValueError, match="quadratic"):
        scaled_lr(0.1, 1024, "quadratic")


def test_max_lr_caps_the_peak_after_scaling_and_zero_means_no_cap():
    assert scaled_lr(0.1, 1024, "linear", max_lr=0.1) == pytest.approx(0.1)
    assert scaled_lr(0.1, 1024, "sqrt", max_lr=0.15) == pytest.approx(0.15)
    assert scaled_lr(0.1, 512, "linear", max_lr=0.5) == pytest.approx(0.2)  # under the cap
    assert scaled_lr(0.1, 1024, "linear", max_lr=0.0) == pytest.approx(0.4)


@pytest.mark.parametrize("scaling, max_lr, initial, peak", [
    ("linear", 0.0, 0.0125, 0.4),   # 32 workers of 32: one worker's 32 / 256
    ("sqrt", 0.0, 0.1 * math.sqrt(32 / 256), 0.2),
    ("none", 0.0, 0.1, 0.1),        # no ramp: the one-worker rate is the peak
    ("linear", 0.1, 0.0125, 0.1),
    ("none", 0.05, 0.05, 0.05),     # the cap holds the warmup's start too
])
def test_warmup_starts_from_one_workers_rate_under_the_same_rule(scaling, max_lr, initial,
                                                                   peak):
    spec = ScheduleSpec(0.1, 32, 32, 29, 117, "cosine", lr_scaling=scaling, max_lr=max_lr)
    assert (spec.initial_lr, spec.peak_lr) == pytest.approx((initial, peak))
    assert learning_rate_at(0, spec) == pytest.approx(initial)
    assert learning_rate_at(29, spec) == pytest.approx(peak)


@pytest.mark.parametrize("scaling", ["linear", "sqrt", "none"])
def test_warmup_never_starts_above_the_peak(scaling):
    for batch, workers, lr_workers, max_lr in [(512, 8, 1, 0.12), (32, 1, 0, 0.0),
                                               (16, 64, 0, 0.3), (300, 3, 2, 0.0)]:
        spec = ScheduleSpec(0.1, batch, workers, 10, 100, lr_workers=lr_workers,
                            lr_scaling=scaling, max_lr=max_lr)
        assert spec.initial_lr <= spec.peak_lr
        assert max(learning_rate_at(s, spec) for s in range(100)) == pytest.approx(spec.peak_lr)


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


def test_a_hierarchical_step_counts_its_host_but_never_fewer_than_flat_local_sgd():
    assert lr_scaling_workers(8, local_steps=True, cap=4, host_workers=2) == 4  # flat's count
    assert lr_scaling_workers(8, local_steps=True, cap=4, host_workers=1) == \
        lr_scaling_workers(8, local_steps=True, cap=4)                         # hosts of one
    assert lr_scaling_workers(64, local_steps=True, cap=4, host_workers=8) == 8  # a host's batch
    assert lr_scaling_workers(8, local_steps=True, cap=0, host_workers=2) == 8
    assert lr_scaling_workers(8, local_steps=False, cap=4, host_workers=2) == 8  # sync: all
    # 8 workers of 64 that count as 4: the rate of a batch of 256, over the steps of 8.
    spec = schedule_in_examples(0.1, 64, 8, 5120, 51200, "cosine", 0, 0, lr_workers=4)
    assert (spec.peak_lr, spec.initial_lr) == pytest.approx((0.1, 0.025))
    assert (spec.warmup_steps, spec.total_steps) == (10, 100)


@pytest.mark.parametrize("decay", ["cosine", "step", "constant"])
def test_keras_schedule_matches_pure_function(decay):
    import keras
    import tensorflow as tf

    from hvdtrain.keras.schedule import WarmupDecaySchedule

    spec = ScheduleSpec(0.1, 32, 8, 37.5, 400.25, decay, step_offset=-2.5, lr_workers=6,
                        lr_scaling="sqrt", max_lr=0.15)
    schedule = WarmupDecaySchedule.from_spec(spec)
    for step in (0, 1, 20, 36, 37, 38, 200, 300, 399, 400, 450):
        assert float(schedule(tf.constant(step))) == pytest.approx(
            learning_rate_at(step, spec), rel=1e-5, abs=1e-8), step
    clone = keras.optimizers.schedules.deserialize(
        keras.optimizers.schedules.serialize(schedule))
    assert clone.spec == spec
    assert math.isclose(float(clone(tf.constant(10))), learning_rate_at(10, spec), rel_tol=1e-5)


@pytest.mark.parametrize("mode, cap, peak, options", [
    ("sync", 4, 0.2, {"max_lr": 0}), ("local", 4, 0.1, {}), ("async", 4, 0.1, {}),
    ("local", 0, 0.2, {"max_lr": 0}),
    ("sync", 4, 0.1, {}),  # the default cap: linear's 0.2 at a global batch of 512 broke down
    ("sync", 4, 0.03, {"optimizer": "lamb"}),  # LAMB's own: at 0.1 it sat at chance
    ("sync", 4, 0.05, {"optimizer": "lamb", "max_lr": 0.05}),
    ("sync", 4, 0.1, {"optimizer": "lars"}),
    ("sync", 4, 0.1 * math.sqrt(2), {"lr_scaling": "sqrt", "max_lr": 0}),
    ("sync", 4, 0.15, {"max_lr": 0.15}),
    ("local", 4, 0.1, {"lr_scaling": "none", "max_lr": 0.3}),
    ("local", 8, 0.05, {"lr_scaling": "sqrt", "max_lr": 0.05}),
])
def test_a_runs_world_caps_the_rate_of_local_steps_only(monkeypatch, mode, cap, peak, options):
    from hvdtrain import comm
    from hvdtrain.config import TrainConfig
    from hvdtrain.progress import TrainingProgress
    from hvdtrain.plan import Job, settle
    from hvdtrain.training.world import current_world

    monkeypatch.setattr(comm, "size", lambda: 8)
    monkeypatch.setattr(comm, "rank", lambda: 0)
    cfg = TrainConfig(mode=mode, local_lr_workers=cap, base_lr=0.1, batch_size=64, **options)
    world = current_world(settle(cfg, Job(8, 1)).config, TrainingProgress(epoch_examples=5120))
    assert world.global_batch == 512 and world.schedule.peak_lr == pytest.approx(peak)


@pytest.mark.parametrize("mode, peak", [
    ("local", 0.1),   # counts 8 of 8 workers of 32: sync's 0.1, not 4 workers' 0.05
    ("async", 0.05),  # counts 4: its late rounds were not measured at 8
    ("sync", 0.1),    # counts all 8 (global batch 256), whatever local mode's default
])
def test_local_steps_count_8_workers_by_default_and_async_4(monkeypatch, mode, peak):
    from hvdtrain import comm
    from hvdtrain.config import TrainConfig
    from hvdtrain.progress import TrainingProgress
    from hvdtrain.plan import Job, settle
    from hvdtrain.training.world import current_world

    monkeypatch.setattr(comm, "size", lambda: 8)
    monkeypatch.setattr(comm, "rank", lambda: 0)
    cfg = TrainConfig(mode=mode, base_lr=0.1, batch_size=32)
    world = current_world(settle(cfg, Job(8, 1)).config, TrainingProgress(epoch_examples=5120))
    assert world.schedule.peak_lr == pytest.approx(peak)
    assert cfg.resolved().local_lr_workers == {"local": 8, "async": 4}.get(mode)
