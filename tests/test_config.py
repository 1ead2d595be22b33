import subprocess
import sys

import pytest
import yaml

from hvdtrain.config import TrainConfig, load_config
from hvdtrain.errors import ConfigError


def test_defaults_are_valid_and_sync():
    cfg = load_config()
    assert cfg == TrainConfig()
    assert cfg.mode == "sync" and cfg.model == "lenet" and cfg.dataset == "fashion-mnist"


def test_cli_overrides_beat_yaml_which_beats_defaults(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("epochs: 7\nbatch-size: 32\nbase_lr: 0.2\n")
    cfg = load_config(str(path), {"batch_size": 16, "momentum": None})
    assert (cfg.epochs, cfg.batch_size, cfg.base_lr, cfg.momentum) == (7, 16, 0.2, 0.9)


def test_saved_config_loads_back_identically(tmp_path):
    cfg = load_config(None, {"mode": "local", "n_sync": 25, "outer_optimizer": "slowmo",
                             "outer_momentum": 0.5, "out": "runs/x"})
    cfg.save_yaml(str(tmp_path / "config.yaml"))
    assert load_config(str(tmp_path / "config.yaml")) == cfg


@pytest.mark.parametrize("overrides, message", [
    ({"batch_size": 0}, "--batch-size must be a positive integer, got 0"),
    ({"epochs": -1}, "--epochs must be a positive integer, got -1"),
    ({"n_sync": 0}, "--n-sync must be a positive integer, got 0"),
    ({"n_sync": 2.5}, "--n-sync must be a positive integer, got 2.5"),
    ({"steps_per_epoch": 0}, "--steps-per-epoch must be a positive integer, got 0"),
    ({"base_lr": 0.0}, "--base-lr must be positive, got 0.0"),
    ({"momentum": 1.0}, "--momentum must be in [0, 1), got 1.0"),
    ({"warmup_epochs": -1.0}, "--warmup-epochs must be zero or positive, got -1.0"),
    ({"mode": "asynchronous"}, "--mode must be one of sync, local, async, got 'asynchronous'"),
    ({"optimizer": "rmsprop"}, "--optimizer must be one of auto, sgd, adam, lars, lamb, got 'rmsprop'"),
    ({"synthetic_shape": "32x32"}, "--synthetic-shape must look like 32x32x3, got '32x32'"),
    ({"outer_momentum": 0.5}, "--outer-momentum needs --mode local"),
    ({"warm_start_steps": 10}, "--warm-start-steps needs --mode local"),
    ({"warm_start": "single"}, "--warm-start needs --mode local or async, got --warm-start single"),
    ({"mode": "local", "warm_start": "solo"}, "--warm-start must be one of sync, single, got 'solo'"),
    ({"mode": "local", "warm_start": "single"},
     "--warm-start single needs warm-start steps, got --warm-start-steps 0"),
    ({"mode": "local", "outer_lr": 0.5},
     "--outer-optimizer none takes the plain average, which has no --outer-lr 0.5"),
    ({"nesterov": True, "momentum": 0.0}, "--nesterov needs --optimizer sgd with --momentum > 0"),
    ({"lr_scaling": "quadratic"}, "--lr-scaling must be one of linear, sqrt, none, got "
                                  "'quadratic'"),
    ({"max_lr": -0.1}, "--max-lr must be zero or positive, got -0.1"),
    ({"optimizer": "lars", "lars_eta": 0.0}, "--lars-eta must be positive, got 0.0"),
    ({"lars_eta": 0.01}, "--lars-eta needs --optimizer lars, got --lars-eta 0.01 with "
                         "--optimizer auto"),
    ({"validate": "yes"}, "--validate must be true or false, got 'yes'"),
    ({"base_lr": "fast"}, "--base-lr must be a number, got 'fast'"),
    ({"model_parallel": 4}, "--model-parallel must be 1 or 2, got 4"),
    ({"model_parallel": 2}, "--model-parallel 2 needs --model alexnet-2col, got --model lenet"),
    ({"checkpoint_every": "soon"}, "--checkpoint-every must be a positive number of steps"),
    ({"keep_checkpoints": 0}, "--keep-checkpoints must be a positive integer, got 0"),
    ({"step_timeout": -1.0}, "--step-timeout must be zero or positive, got -1.0"),
    ({"log_every": -5.0}, "--log-every must be zero or positive, got -5.0"),
    ({"elastic": True}, "--elastic needs --out"),
    ({"mode": "local", "n_sync": "auto:16", "sync_seconds": 2.0},
     "--n-sync auto:16 adapts a period of steps; --sync-seconds 2.0 sets rounds by time "
     "instead: give one of them"),
    ({"mode": "local", "epoch_rounds": False, "sync_seconds": 2.0},
     "--no-epoch-rounds needs blocking rounds every n_sync steps, got --sync-seconds 2.0"),
    ({"mode": "async", "epoch_rounds": False}, "--epoch-rounds needs --mode local, got"),
    ({"mode": "local", "round_compression": "int3"},
     "--round-compression must be one of none, fp16, int8, int4, int2, int1, topk, got 'int3'"),
    ({"round_compression": "int8"},
     "--round-compression needs --mode local or async, got --round-compression int8 with "
     "--mode sync"),
    ({"n_sync": 4}, "--n-sync needs --mode local or async, got --n-sync 4 with --mode sync"),
    ({"local_lr_workers": 4},
     "--local-lr-workers needs --mode local or async, got --local-lr-workers 4 with --mode sync"),
    ({"average_optimizer_state": True}, "--average-optimizer-state needs --mode local or async, "
                                        "got --average-optimizer-state with --mode sync"),
    ({"n_sync": "link"},
     "--n-sync needs --mode local or async, got --n-sync link with --mode sync"),
    ({"model": "nosuch"}, "--model must be one of alexnet, alexnet-lrn, alexnet-2col, lenet, "
                          "resnet50, resnet20, resnet32, resnet56, got 'nosuch'"),
    ({"dataset": "mnist"}, "--dataset must be one of fashion-mnist, cifar10, imagenet, "
                           "image-folder, synthetic, synthetic-device, got 'mnist'"),
])
def test_bad_values_get_one_line_naming_option_and_value(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_yaml_errors_name_the_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=f"config file not found: {missing}"):
        load_config(str(missing))
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("epochs: 2\nbatchsize: 3\n")
    with pytest.raises(ConfigError, match=f"config file {unknown}: unknown option 'batchsize'"):
        load_config(str(unknown))
    broken = tmp_path / "broken.yaml"
    broken.write_text("epochs: [2\n")
    with pytest.raises(ConfigError, match=f"config file {broken} is not valid YAML"):
        load_config(str(broken))
    with pytest.raises(ConfigError, match=f"config file {tmp_path} cannot be read: Is a directory"):
        load_config(str(tmp_path))
    binary = tmp_path / "weights.h5"
    binary.write_bytes(b"\x89HDF\r\n\x1a\n\xff\xfe")
    with pytest.raises(ConfigError, match=f"config file {binary} is not UTF-8 text"):
        load_config(str(binary))
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(str(listed))


def test_yaml_round_trip_is_plain_yaml(tmp_path):
    TrainConfig().save_yaml(str(tmp_path / "c.yaml"))
    data = yaml.safe_load((tmp_path / "c.yaml").read_text())
    assert data["batch_size"] == 64 and data["mode"] == "sync"


def test_validating_a_config_does_not_import_tensorflow():
    """Model and dataset names are checked from hvdtrain.config alone, before TensorFlow loads."""
    code = ("import sys\n"
            "from hvdtrain.config import load_config\n"
            "from hvdtrain.errors import ConfigError\n"
            "load_config(None, {'model': 'resnet50', 'dataset': 'imagenet'})\n"
            "try:\n"
            "    load_config(None, {'model': 'nosuch'})\n"
            "except ConfigError:\n"
            "    pass\n"
            "else:\n"
            "    raise SystemExit('unknown model accepted')\n"
            "assert not {'tensorflow', 'keras'} & set(sys.modules), 'TensorFlow was imported'\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def _write_saved(folder, values: dict, missing=()) -> None:
    """A run's config.yaml as an older hvdtrain saved it (no schema version): every option
    of today's but `missing`, at its declared default unless `values` names it."""
    saved = {name: value for name, value in dict(TrainConfig().to_dict(), **values).items()
             if name not in missing}
    (folder / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))


def plan_resume(cfg, job):
    """What `hvdtrain train` settles for `cfg` on `job`: rank 0's read of its run folder,
    then the plan (the checkpoint resumed, the options kept, the optimizer and config)."""
    import types

    from hvdtrain.plan import settle
    from hvdtrain.training.saved_run import read_saved_run

    saved = read_saved_run(cfg)
    plan = settle(cfg, job, saved)
    return types.SimpleNamespace(checkpoint=saved.checkpoint, kept=plan.kept,
                                 optimizer=plan.config.optimizer, config=plan.config)


def test_a_run_saved_before_a_mode_dependent_default_was_written_resumes_under_it(tmp_path):
    from hvdtrain.plan import Job

    # A config.yaml that leaves --average-optimizer-state out (hand-written, or older).
    _write_saved(tmp_path, {"mode": "async"})
    cfg = load_config(None, {"mode": "async", "out": str(tmp_path)}).resolved()
    assert plan_resume(cfg, Job(1, 1)).checkpoint is None  # nothing saved yet, and no refusal
    with pytest.raises(ConfigError, match="--average-optimizer-state is True but the run was "
                                          "started with False"):
        plan_resume(load_config(None, {"mode": "async", "out": str(tmp_path),
                                       "average_optimizer_state": True}).resolved(), Job(1, 1))


def test_a_sync_run_resumes_whatever_period_its_config_saved(tmp_path):
    from hvdtrain.plan import Job

    # Sync runs used to save the local period's default (10); sync mode never reads it.
    _write_saved(tmp_path, {"n_sync": 10})
    cfg = load_config(None, {"out": str(tmp_path)}).resolved()
    assert cfg.n_sync is None and plan_resume(cfg, Job(1, 1)).kept == {}
    # A local run's period is what it trains by: the command's default keeps the saved one,
    # a period given otherwise is refused in one line.
    _write_saved(tmp_path, {"mode": "local", "n_sync": 10})
    cfg = load_config(None, {"mode": "local", "out": str(tmp_path)}).resolved()
    assert plan_resume(cfg, Job(1, 1)).kept == {"n_sync": 10}
    with pytest.raises(ConfigError, match="^cannot resume .*: --n-sync is 5 but the run was "
                                          "started with 10$"):
        plan_resume(load_config(None, {"mode": "local", "n_sync": 5,
                                       "out": str(tmp_path)}).resolved(), Job(1, 1))


@pytest.mark.parametrize("saved, overrides, workers, hosts, kept", [
    ("16/workers", {}, 8, 1, False),                        # 2 steps under either
    ("40/workers:2", {"batch_size": 16}, 32, 1, False),     # 2 under either (SGD at 512)
    ("40/hosts", {"hierarchical_sgd": True}, 80, 20, False),  # 2 steps under either
    ("40/workers:5", {}, 8, 1, True),                       # 5 steps against today's 2
    ("40/hosts", {"hierarchical_sgd": True}, 32, 16, True),   # 3 steps against 2
    (6, {}, 8, 1, True),
])
def test_a_local_run_saved_under_an_old_default_period_resumes_under_it(
        tmp_path, saved, overrides, workers, hosts, kept):
    from hvdtrain.plan import Job

    # Local mode's default was 40/workers, then 40/workers:5, now 2 (hierarchical: 40/hosts,
    # then 40/hosts:5, now 2). Where the steps agree, the run goes on under today's default.
    _write_saved(tmp_path, dict(overrides, mode="local", n_sync=saved))
    cfg = load_config(None, dict(overrides, mode="local", out=str(tmp_path))).resolved()
    assert plan_resume(cfg, Job(workers, hosts)).kept == ({"n_sync": saved} if kept else {})


def test_a_period_given_as_steps_resumes_a_run_saved_with_a_rule_of_the_same_steps(tmp_path):
    from hvdtrain.plan import Job

    _write_saved(tmp_path, {"mode": "local", "n_sync": "16/workers"})
    cfg = load_config(None, {"mode": "local", "n_sync": "2", "out": str(tmp_path)}).resolved()
    assert plan_resume(cfg, Job(8, 1)).kept == {}  # 2 steps at 8 workers under either


@pytest.mark.parametrize("optimizer, workers, batch, hierarchical, period", [
    ("sgd", 32, 64, False, 2),
    ("lamb", 2, 16, False, 1),       # LAMB given: every step whatever the batch
    ("auto", 16, 32, False, 2),      # 512: auto takes SGD
    ("auto", 16, 64, False, 1),      # 1,024: LAMB, every step
    ("auto", 32, 32, False, 1),
    ("lamb", 16, 64, True, 2),       # the hierarchy keeps its own default
])
def test_flat_local_mode_rounds_every_step_on_lamb_and_every_2_otherwise(
        optimizer, workers, batch, hierarchical, period):
    from hvdtrain.plan import Job, settle

    def settled(cfg, workers):
        return settle(cfg, Job(workers)).config

    cfg = load_config(None, {"mode": "local", "optimizer": optimizer, "batch_size": batch,
                             "hierarchical_sgd": hierarchical}).resolved()
    assert (cfg.n_sync is None) == (optimizer == "auto")  # set once auto has chosen
    assert settled(cfg, workers).n_sync == period
    given = load_config(None, {"mode": "local", "optimizer": optimizer, "n_sync": 5,
                               "batch_size": batch}).resolved()
    assert settled(given, workers).n_sync == 5


def test_a_lamb_local_run_saved_with_rounds_every_2_steps_goes_on_with_them(tmp_path):
    from hvdtrain.plan import Job

    _write_saved(tmp_path, {"mode": "local", "optimizer": "lamb", "batch_size": 32,
                            "n_sync": 2, "rescale_rounds": True})
    cfg = load_config(None, {"mode": "local", "batch_size": 32, "out": str(tmp_path)})
    plan = plan_resume(cfg.resolved(), Job(32, 1))
    assert (plan.optimizer, plan.kept) == ("lamb", {"n_sync": 2})  # auto keeps LAMB, and 2
    cfg = load_config(None, {"mode": "local", "batch_size": 32, "n_sync": 2,
                             "out": str(tmp_path)})
    assert plan_resume(cfg.resolved(), Job(32, 1)).kept == {}


@pytest.mark.parametrize("mode", ["local", "async", "sync"])
def test_a_run_saved_before_rescaled_rounds_existed_goes_on_without_them(tmp_path, mode):
    from hvdtrain.plan import Job
    from hvdtrain.training.saved_run import kept_notice

    # Saved with the cap and the compression of the time, before --rescale-rounds.
    _write_saved(tmp_path, {"mode": mode, "optimizer": "lamb", "batch_size": 32, "n_sync": 1,
                            "max_lr": 0.06 if mode == "local" else 0.03,
                            "round_compression": "int8" if mode == "local" else "none"},
                 missing=("rescale_rounds",))
    cfg = load_config(None, {"mode": mode, "batch_size": 32, "out": str(tmp_path)})
    plan = plan_resume(cfg.resolved(), Job(32, 1))
    # A local run kept its LAMB cap of the time too, which rescaled rounds lower to sync's,
    # and its int8 rounds, where rescaled rounds travel in int4.
    # An async run every step at 32 workers keeps its float32 rounds, where a new one
    # would take int8.
    assert plan.kept == ({"rescale_rounds": False, "max_lr": 0.06, "round_compression": "int8"}
                         if mode == "local" else
                         {"round_compression": "none"} if mode == "async" else {})
    if mode == "local":  # the cap and int8 follow from --no-rescale-rounds: not named apart
        assert "as it was started: --no-rescale-rounds (this command" in \
            kept_notice(plan.config, plan.kept)


@pytest.mark.parametrize("saved, given, message", [
    ({"mode": "local", "n_sync": "40/workers:5"}, {"mode": "local", "elastic": True},
     "--n-sync is 2 but the run was started with '40/workers:5' (give --n-sync 40/workers:5 "
     "to go on)"),
    ({"mode": "local", "hierarchical_sgd": True}, {"mode": "local"},
     "--hierarchical-sgd is False but the run was started with True (give "
     "--hierarchical-sgd to go on)"),
    ({"epochs": 3}, {"epochs": 4}, "--epochs is 4 but the run was started with 3"),
])
def test_an_option_given_otherwise_fixed_at_start_or_of_an_elastic_run_is_refused_naming_it(
        tmp_path, saved, given, message):
    from hvdtrain.plan import Job

    # An elastic run's workers do not all see the resume plan, and Horovod's process sets
    # are made before the run folder is read: neither can take the saved value instead.
    _write_saved(tmp_path, saved)
    with pytest.raises(ConfigError) as refused:
        plan_resume(load_config(None, dict(given, out=str(tmp_path))).resolved(), Job(8, 4))
    assert str(refused.value) == f"cannot resume {tmp_path}: {message}"


def test_a_run_saved_under_other_defaults_resumes_as_it_was_started(tmp_path):
    from hvdtrain.plan import Job
    from hvdtrain.training.saved_run import kept_notice

    # Every option the command leaves at its default takes the run's: the mode too, and
    # with it the mode's own defaults.
    _write_saved(tmp_path, {"mode": "local", "n_sync": 7, "epochs": 3,
                            "round_compression": "fp16", "average_optimizer_state": True})
    cfg = load_config(None, {"out": str(tmp_path), "log_every": 5}).resolved()
    plan = plan_resume(cfg, Job(4, 1))
    assert plan.kept == {"epochs": 3, "local_lr_workers": 8, "mode": "local", "n_sync": 7,
                         "average_optimizer_state": True, "round_compression": "fp16"}
    # The line leaves out --local-lr-workers 8: local mode's own default, kept with it.
    assert kept_notice(plan.config, plan.kept) == (
        f"hvdtrain: resuming {tmp_path} as it was started: --epochs 3, --mode local, "
        "--n-sync 7, --average-optimizer-state, --round-compression fp16 (this command gave "
        "the defaults, which differ)")


def test_a_period_given_other_than_the_default_must_be_the_one_saved(tmp_path):
    from hvdtrain.plan import Job

    _write_saved(tmp_path, {"mode": "local", "n_sync": "40/workers"})
    cfg = load_config(None, {"mode": "local", "n_sync": "5", "out": str(tmp_path)}).resolved()
    with pytest.raises(ConfigError, match="^cannot resume .*: --n-sync is 5 but the run was "
                                          "started with '40/workers'$"):
        plan_resume(cfg, Job(4, 1))  # 10 steps against 5


# The options every run folder's config.yaml has named since the oldest hvdtrain whose runs
# resume today: an option outside this list must declare what runs did before it existed.
OPTIONS_OF_THE_FIRST_SCHEMA = frozenset((
    "model", "dataset", "data_dir", "train_examples", "synthetic_shape", "image_size", "epochs",
    "steps_per_epoch", "batch_size", "optimizer", "base_lr", "warmup_epochs",
    "local_lr_workers", "lr_decay", "momentum", "nesterov", "weight_decay", "seed", "mode",
    "n_sync", "sync_seconds", "warm_start_steps", "warm_start", "epoch_rounds",
    "init_weights", "average_bn_stats", "average_optimizer_state", "outer_optimizer",
    "outer_lr", "outer_momentum", "hierarchical_sgd", "pin_cores", "model_parallel",
    "deterministic", "mixed_precision", "xla", "fp16_allreduce", "bucket_mb", "out",
    "validate", "eval_every", "eval_examples", "checkpoint_every", "keep_checkpoints",
    "resume", "elastic", "elastic_commit_every", "log_every", "step_timeout"))


def test_every_option_added_since_the_first_schema_declares_what_older_runs_did():
    import dataclasses

    from hvdtrain.config import UNDECLARED

    undeclared = [f.name for f in dataclasses.fields(TrainConfig)
                  if f.name not in OPTIONS_OF_THE_FIRST_SCHEMA
                  and f.metadata["before"] is UNDECLARED and not f.metadata["resumable"]]
    assert undeclared == [], ("declare _opt(before=...) for these: what a run saved before "
                              "the option existed trained with")


def test_a_local_run_saved_before_compressed_rounds_and_the_cap_goes_on_without_them(tmp_path):
    from hvdtrain.plan import Job
    from hvdtrain.training.saved_run import kept_notice

    # Rounds travelled as float32 and the linear rule had no cap: today's int8 rounds and
    # cap of 0.1 would otherwise pass for what the run did.
    _write_saved(tmp_path, {"mode": "local", "optimizer": "sgd", "n_sync": 2},
                 missing=("round_compression", "max_lr", "round_fragments", "lr_scaling",
                          "lars_eta", "rescale_rounds", "divergence_guard"))
    cfg = load_config(None, {"mode": "local", "optimizer": "sgd", "out": str(tmp_path)})
    plan = plan_resume(cfg.resolved(), Job(8, 1))
    assert plan.kept == {"max_lr": 0.0, "round_compression": "none"}
    assert "--max-lr 0.0, --round-compression none" in kept_notice(plan.config, plan.kept)


def test_a_saved_config_missing_an_option_of_the_first_schema_is_refused_naming_it(tmp_path):
    from hvdtrain.plan import Job

    _write_saved(tmp_path, {"mode": "local"}, missing=("warm_start",))
    cfg = load_config(None, {"mode": "local", "out": str(tmp_path)}).resolved()
    with pytest.raises(ConfigError, match=r"^\S+config.yaml names no --warm-start: it was "
                                          r"saved by a version of hvdtrain without"):
        plan_resume(cfg, Job(2, 1))


def test_config_yaml_carries_its_schema_and_a_newer_one_is_refused(tmp_path):
    from hvdtrain.config import CONFIG_SCHEMA

    path = tmp_path / "config.yaml"
    TrainConfig().save_yaml(str(path))
    assert yaml.safe_load(path.read_text())["schema"] == CONFIG_SCHEMA
    assert load_config(str(path)) == TrainConfig()
    path.write_text(f"schema: {CONFIG_SCHEMA + 1}\nepochs: 2\n")
    with pytest.raises(ConfigError, match="written by a newer hvdtrain"):
        load_config(str(path))
