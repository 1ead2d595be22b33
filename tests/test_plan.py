"""A run's settled plan (hvdtrain.plan) and `hvdtrain plan`: what a job will do, decided
once from the options and the job's shape, before any worker starts."""

import json
import subprocess
import sys

import pytest

from hvdtrain.cli import main
from hvdtrain.config import load_config
from hvdtrain.plan import Job, settle
from hvdtrain.training.saved_run import SavedRun


def sound_checkpoint(folder, step, examples=None):
    """A checkpoint folder that verifies (`CheckpointStore.verify`), holding no state:
    what `hvdtrain plan` reads of one, without TensorFlow."""
    import hashlib

    path = folder / f"step-{step:09d}"
    path.mkdir(parents=True)
    (path / "state.index").write_bytes(b"index")
    progress = {"epoch_examples": 640, "examples": examples or 64 * step, "steps": step,
                "workers": 8, "batch_size": 8}
    (path / "meta.json").write_text(json.dumps({"progress": progress, "files": {
        "state.index": hashlib.sha256(b"index").hexdigest()}}))
    return str(path)


def plan_of(workers, hosts=1, **options):
    return settle(load_config(None, options), Job(workers, hosts))


def test_auto_takes_lamb_from_a_global_batch_of_1024_and_says_why():
    plan = plan_of(16, batch_size=64)
    assert plan.config.optimizer == "lamb" and plan.global_batch == 1024
    assert "from a global batch of 1024" in plan.optimizer_reason
    assert (plan.peak_lr, plan.config.max_lr) == (0.03, 0.03)
    sgd = plan_of(8, batch_size=64)
    assert sgd.config.optimizer == "sgd" and "below a global batch of 1024" in \
        sgd.optimizer_reason
    assert sgd.peak_lr == 0.1  # linear 0.2, capped


@pytest.mark.parametrize("workers, period, compression, rescaled", [
    (8, 2, "int8", False),    # SGD: int8 every 2 steps
    (16, 1, "int4", True),    # LAMB: rescaled int4 rounds every step
])
def test_local_modes_round_form_follows_the_optimizer_auto_takes(workers, period, compression,
                                                                 rescaled):
    plan = plan_of(workers, mode="local", batch_size=64)
    assert plan.period == period
    assert plan.to_dict()["round_compression"] == compression
    assert plan.config.rescale_rounds is rescaled
    # A round of int8 or int4 codes with their scales, every `period` steps.
    share = {"int8": 1.0, "int4": 0.5}[compression] / 4 / period
    assert plan.send_share == pytest.approx(share, rel=0.02)


def test_coarse_rounds_count_batch_norm_statistics_in_float32_and_finer_ones_coded():
    """ResNet-20's statistics are 0.51% of its values: coded in an int8 round, in float32 in
    an int1 one, where they add 0.0051 of a float32 copy to int1's 1/32 of one (a sixth)."""
    def share(model, compression):
        return plan_of(4, mode="local", model=model, n_sync=1,
                       round_compression=compression).send_share
    assert share("resnet20", "int8") == pytest.approx(share("lenet", "int8") * 1.0051, rel=1e-3)
    assert share("resnet20", "int1") == pytest.approx(share("lenet", "int1") + 0.0051, rel=1e-2)
    assert "statistics in float32" not in plan_of(4, mode="local", model="lenet",
                                                  round_compression="int1").round_form


def test_a_resumed_run_keeps_its_optimizer_and_the_options_it_saved():
    saved = load_config(None, {"mode": "local", "optimizer": "sgd", "n_sync": 5}).resolved()
    plan = settle(load_config(None, {"mode": "local"}), Job(32, 1), SavedRun(config=saved))
    assert (plan.config.optimizer, plan.period, plan.kept) == ("sgd", 5, {"n_sync": 5})
    assert "keeps what the saved run took" in plan.optimizer_reason
    assert "kept from the saved run: n_sync=5" in plan.lines()


def test_the_hierarchy_sends_a_host_shard_of_flat_rounds_across_hosts():
    flat = plan_of(8, mode="local")
    hierarchy = plan_of(8, hosts=4, mode="local", hierarchical_sgd=True)
    assert hierarchy.send_share == pytest.approx(flat.send_share / 2, rel=0.02)


def test_a_period_as_costly_as_sync_is_a_warning_of_the_plan():
    plan = plan_of(4, mode="local", n_sync=1, round_compression="none")
    assert plan.warnings and "as many as --mode sync" in plan.warnings[0]
    assert plan_of(4, mode="local").warnings == ()


@pytest.mark.parametrize("workers, hosts", [(2, 1), (4, 1), (8, 1), (10, 1), (16, 1),
                                            (32, 1), (64, 1), (16, 16), (32, 16)])
def test_no_default_period_of_a_local_mode_is_one_its_plan_warns_against(workers, hosts):
    for mode in ("local", "async"):
        for hierarchical in (False, True) if hosts > 1 else (False,):
            plan = plan_of(workers, hosts=hosts, mode=mode, hierarchical_sgd=hierarchical)
            assert not any("as many as --mode sync" in w for w in plan.warnings), plan.warnings


def test_async_rounds_every_step_travel_in_int8_and_longer_periods_in_float32():
    assert plan_of(16, mode="async").config.round_compression == "int8"
    assert plan_of(8, mode="async").config.round_compression == "none"      # every 2 steps
    assert plan_of(16, mode="async", n_sync=3).config.round_compression == "none"
    assert plan_of(16, mode="async", round_compression="int4").config.round_compression == "int4"
    # --fp16-allreduce sends float32 rounds as fp16: a choice the job's size does not undo
    assert plan_of(16, mode="async", fp16_allreduce=True).round_form.endswith(
        "(fp16 values); optimizer state kept on each worker")


def test_a_global_batch_past_the_largest_measured_is_a_warning_of_the_plan():
    assert plan_of(32, batch_size=64).warnings == ()              # 2,048: measured
    past = plan_of(64, hosts=8, batch_size=256).warnings
    assert len(past) == 1 and past[0].startswith("a global batch of 16384 (64 x 256) is past")


def test_hvdtrain_plan_prints_the_plan_and_its_json(capsys):
    assert main(["plan", "--workers", "16", "--batch-size", "64"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("hvdtrain plan: sync mode, 16 workers, global batch 1024 (16 x 64)")
    assert "hvdtrain plan: optimizer lamb: --optimizer auto takes LAMB" in out
    assert main(["plan", "--hosts", "4", "--slots", "2", "--mode", "local", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert (plan["workers"], plan["hosts"], plan["optimizer"], plan["period"]) == \
        (8, 4, "sgd", 2)


@pytest.mark.parametrize("argv, message", [
    ([], "hvdtrain plan needs --workers N, or --hosts H and --slots S"),
    (["--workers", "0"], "--workers must be a positive number, got 0"),
    (["--workers", "6", "--hosts", "2", "--slots", "2"],
     "--workers 6 but --hosts 2 x --slots 2 is 4"),
    (["--workers", "2", "--hosts", "3"], "--hosts 3 is more than the 2 workers"),
    (["--workers", "2", "--mode", "nosuch"], "--mode"),
])
def test_a_bad_plan_request_is_one_line(argv, message, capsys):
    assert main(["plan", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_hvdtrain_plan_starts_nothing_and_loads_no_tensorflow():
    code = ("import sys\n"
            "from hvdtrain.cli import main\n"
            "assert main(['plan', '--workers', '8']) == 0\n"
            "assert 'tensorflow' not in sys.modules and 'horovod' not in sys.modules\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert "optimizer sgd" in result.stdout


def test_hvdtrain_plan_of_a_run_folder_names_what_the_resumed_run_keeps(tmp_path, capsys):
    import yaml

    from hvdtrain.config import TrainConfig

    # A local run saved with float32 rounds every 5 steps and LAMB, then a command that
    # leaves those options at their defaults: the plan is the run's as it goes on.
    saved = dict(TrainConfig().to_dict(), mode="local", n_sync=5, optimizer="lamb",
                 round_compression="none", out=str(tmp_path))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved))
    assert main(["plan", "--workers", "8", "--out", str(tmp_path), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert (plan["optimizer"], plan["period"], plan["round_compression"]) == \
        ("lamb", 5, "none")
    assert plan["kept"]["mode"] == "local" and plan["kept"]["n_sync"] == 5
    assert main(["plan", "--workers", "8", "--out", str(tmp_path), "--mode", "local",
                 "--n-sync", "3"]) == 2
    assert "cannot resume" in capsys.readouterr().err


def test_hvdtrain_plan_resuming_another_runs_checkpoint_keeps_that_runs_optimizer(
        tmp_path, capsys):
    import yaml

    from hvdtrain.config import TrainConfig

    # A run of 16 workers took LAMB; its checkpoint, resumed into a new folder by 8 workers
    # (where `auto` alone would take SGD), holds LAMB's slots: train keeps LAMB, so must plan.
    source = tmp_path / "source"
    checkpoint = sound_checkpoint(source / "checkpoints", 100)
    saved = dict(TrainConfig().to_dict(), optimizer="lamb", out=str(source))
    (source / "config.yaml").write_text(yaml.safe_dump(saved))
    new = ["plan", "--workers", "8", "--out", str(tmp_path / "new"), "--resume", checkpoint]
    assert main(new + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["optimizer"] == "lamb"
    assert main(new + ["--optimizer", "sgd"]) == 2
    assert "written with --optimizer lamb" in capsys.readouterr().err


def test_local_mode_on_one_host_notes_that_sync_suits_it():
    one_host = plan_of(2, mode="local")
    assert one_host.notes and "sync suits one host" in one_host.notes[0]
    assert any(line.startswith("note: on one host") for line in one_host.lines())
    assert plan_of(4, hosts=2, mode="local").notes == ()   # rounds cross hosts
    assert plan_of(4, mode="sync").notes == ()


def test_uncompressed_rounds_are_said_to_send_float32_values():
    assert "(float32 values)" in plan_of(4, hosts=4, mode="async").round_form
    assert "(int8 values)" in plan_of(4, hosts=4, mode="local").round_form


def test_a_period_that_follows_the_link_is_said_in_words():
    form = plan_of(4, hosts=4, mode="local", n_sync="link:20:6").round_form
    assert form.startswith("as the link allows (link:20:6: every 1 to 6 steps, the fewest that "
                           "hold rounds to 20% of a worker's time")
    assert plan_of(4, hosts=4, mode="local", n_sync="auto").round_form.startswith(
        "by the rule auto;")


def _train_refuses(cfg_options) -> str:
    """The one line `hvdtrain train`'s rank 0 refuses these options with, before any
    worker builds anything (its reading of the run folder, then its plan)."""
    from hvdtrain.errors import ConfigError
    from hvdtrain.training.saved_run import read_saved_run

    cfg = load_config(None, cfg_options).resolved()
    with pytest.raises(ConfigError) as refused:
        settle(cfg, Job(4), read_saved_run(cfg))
    return str(refused.value)


def _plan_refuses(argv, capsys) -> str:
    assert main(["plan", "--workers", "4", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    return err.removeprefix("hvdtrain: error: ").strip()


def test_hvdtrain_plan_refuses_a_finished_run_folder_as_train_does(tmp_path, capsys):
    load_config(None, dict(mode="local", optimizer="sgd", n_sync=5)).resolved().save_yaml(
        str(tmp_path / "config.yaml"))
    (tmp_path / "summary.json").write_text(json.dumps({"test_accuracy": 0.9}))
    refused = _plan_refuses(["--mode", "local", "--out", str(tmp_path)], capsys)
    assert refused == f"run folder {tmp_path} holds a finished run; choose a new --out"
    assert refused == _train_refuses(dict(mode="local", out=str(tmp_path)))


@pytest.mark.parametrize("damage", ["missing", "checksum", "no meta"])
def test_hvdtrain_plan_refuses_a_resume_path_missing_or_damaged_as_train_does(
        damage, tmp_path, capsys):
    checkpoint = sound_checkpoint(tmp_path / "source" / "checkpoints", 100)
    if damage == "missing":
        checkpoint = str(tmp_path / "nonexistent" / "step-000000100")
    elif damage == "checksum":
        (tmp_path / "source" / "checkpoints" / "step-000000100" / "state.index").write_bytes(
            b"changed")
    else:
        (tmp_path / "source" / "checkpoints" / "step-000000100" / "meta.json").unlink()
    new = str(tmp_path / "new")
    refused = _plan_refuses(["--resume", checkpoint, "--out", new], capsys)
    assert refused.startswith(f"--resume {checkpoint}: ")
    assert refused == _train_refuses(dict(resume=checkpoint, out=new))


def test_hvdtrain_plan_refuses_a_run_folder_that_holds_a_run_under_resume_never(tmp_path,
                                                                              capsys):
    load_config(None, {}).resolved().save_yaml(str(tmp_path / "config.yaml"))
    refused = _plan_refuses(["--resume", "never", "--out", str(tmp_path)], capsys)
    assert refused == f"run folder {tmp_path} already holds a run; choose a new --out"


def test_hierarchical_hosts_of_unequal_size_each_get_their_own_rate_in_the_plan(capsys):
    # Hosts of 6 and 2 workers at batch 32 in async mode: each host scales the rate for its
    # own workers, so they train at different peaks; the plan names both, and the first
    # host's (rank 0's) as its peak.
    plan = settle(load_config(None, dict(mode="async", hierarchical_sgd=True, batch_size=32,
                                         lr_decay="step")), Job(8, 2, (6, 2)))
    (big, big_peak), (small, small_peak) = plan.host_peak_lrs
    assert (big, small) == (6, 2) and big_peak > small_peak and plan.peak_lr == big_peak
    assert any("a host of 6" in line and "a host of 2" in line for line in plan.lines())
    assert main(["plan", "--host-sizes", "6,2", "--mode", "async", "--hierarchical-sgd",
                 "--batch-size", "32", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["workers"], printed["hosts"], printed["host_peak_lrs"]) == \
        (8, 2, [[6, big_peak], [2, small_peak]])
    # Hosts of one size train at one rate.
    assert settle(load_config(None, dict(mode="async", hierarchical_sgd=True)),
                  Job(8, 2)).host_peak_lrs == ()


def test_the_train_side_job_names_unequal_hosts_from_horovodruns_host_sizes():
    from hvdtrain.training.runner import _unequal_host_sizes

    assert _unequal_host_sizes({"HVDTRAIN_HOST_SIZES": "6,2"}, 8, 2) == (6, 2)
    assert _unequal_host_sizes({"HVDTRAIN_HOST_SIZES": "4,4"}, 8, 2) == ()
    assert _unequal_host_sizes({"HVDTRAIN_HOST_SIZES": "6,2"}, 7, 2) == ()  # resized since
    assert _unequal_host_sizes({}, 8, 2) == ()


@pytest.mark.parametrize("argv, message", [
    (["--host-sizes", "6,2", "--workers", "7"], "--workers 7 but --host-sizes 6,2 makes 8"),
    (["--host-sizes", "6,2", "--slots", "3"], "--host-sizes gives each host's workers"),
    (["--host-sizes", "6,x"], "--host-sizes must be positive integers"),
])
def test_a_bad_host_sizes_request_is_one_line(argv, message, capsys):
    assert main(["plan", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("command", ["plan", "train"])
def test_a_period_given_in_sync_mode_is_refused_in_one_line_as_other_round_options_are(
        command):
    job = []  # plan refuses the option before it asks for the job's size
    said = {}
    for option in (["--n-sync", "4"], ["--round-compression", "int8"]):
        result = subprocess.run([sys.executable, "-m", "hvdtrain", command, *job, "--mode",
                                 "sync", *option], capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
        said[option[0]] = result.stderr
    assert said["--n-sync"] == ("hvdtrain: error: --n-sync needs --mode local or async, got "
                                "--n-sync 4 with --mode sync\n")
    assert said["--round-compression"].startswith("hvdtrain: error: --round-compression needs "
                                                  "--mode local or async")


def test_link_on_rescaled_rounds_is_a_warning_of_the_plan_and_elsewhere_is_not():
    stretched = plan_of(16, hosts=2, mode="local", n_sync="link").warnings
    assert stretched == ("--n-sync link stretches rescaled rounds from every step to up to 8 "
                         "steps: rescaled rounds every 2 steps ended 1.97 +- 1.68 points below "
                         "sync at 32 x 64 (LeNet-5, 3 seeds), where every step, the default on "
                         "LAMB, ended level; link is not measured for time to accuracy",)
    assert "up to 4 steps" in plan_of(16, hosts=2, mode="local", n_sync="link:15:4").warnings[0]
    for quiet in (dict(n_sync="link"),                              # SGD: not rescaled
                  dict(n_sync="link", batch_size=64, rescale_rounds=False, optimizer="lamb"),
                  dict(n_sync="link:15:1", optimizer="lamb"),       # never past every step
                  dict(n_sync="auto", optimizer="lamb")):
        assert plan_of(8 if "optimizer" not in quiet else 16, hosts=2, mode="local",
                       **quiet).warnings == (), quiet
