"""One settler: `hvdtrain plan` prints the plan `hvdtrain train` settles and writes to
plan.json, from the same reading of the run folder, and an elastic job's every worker
settles that plan (and refuses what it refuses) on its own, before its loop."""

import json

import pytest
import yaml

from fake_comm import FakeComm
from hvdtrain.cli import build_parser, main
from hvdtrain.config import TrainConfig, load_config
from hvdtrain.config_options import config_of
from hvdtrain.errors import ConfigError
from hvdtrain.plan import Job, settle
from hvdtrain.training import runner
from hvdtrain.training.saved_run import read_saved_config, read_saved_run
from test_plan import sound_checkpoint


def _lamb_run(folder, **options):
    """A run folder whose run took LAMB, with a checkpoint at step 100."""
    checkpoint = sound_checkpoint(folder / "checkpoints", 100)
    saved = dict(TrainConfig().to_dict(), optimizer="lamb", out=str(folder), **options)
    (folder / "config.yaml").write_text(yaml.safe_dump(saved))
    return checkpoint


def _plan_json(job: Job, options: list[str], capsys) -> dict:
    assert main(["plan", "--workers", str(job.workers), "--hosts", str(job.hosts), *options,
                 "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _trains_by(job: Job, options: list[str], monkeypatch) -> dict:
    """What `hvdtrain train` with these options writes to plan.json on rank 0 of `job`:
    its reading of the run folder, then its settled plan."""
    monkeypatch.setattr(runner, "_job", lambda: job)
    cfg = config_of(build_parser().parse_args(["train", *options])).resolved()
    cfg, saved, _ = runner._run_folder_and_saved_run(cfg, 0.0)
    return runner._announced_plan(cfg, saved).to_dict()


def _jobs(tmp_path):
    source = tmp_path / "lamb-run"
    checkpoint = _lamb_run(source)
    resumed = tmp_path / "resumed"
    _lamb_run(resumed, mode="local", n_sync=5, round_compression="none")
    new = str(tmp_path / "new")
    return {
        "a new sync run taking LAMB": (Job(16), ["--batch-size", "64", "--out", new]),
        "hierarchical local rounds": (Job(8, 4), ["--mode", "local", "--hierarchical-sgd",
                                                  "--out", new]),
        "a run folder resumed, keeping its options": (Job(8), ["--out", str(resumed)]),
        "another run's checkpoint": (Job(8), ["--resume", checkpoint, "--out", new]),
        "elastic, from another run's checkpoint": (Job(4), ["--elastic", "--resume",
                                                            checkpoint, "--out", new]),
    }


@pytest.mark.parametrize("name", ["a new sync run taking LAMB", "hierarchical local rounds",
                                  "a run folder resumed, keeping its options",
                                  "another run's checkpoint",
                                  "elastic, from another run's checkpoint"])
def test_hvdtrain_plan_prints_the_plan_train_writes_to_plan_json(name, tmp_path, capsys,
                                                                   monkeypatch):
    from hvdtrain import comm

    comm.init()  # a world of one worker: rank 0, whose plan.json it is
    job, options = _jobs(tmp_path)[name]
    assert _plan_json(job, options, capsys) == _trains_by(job, options, monkeypatch)


def test_an_elastic_job_resuming_a_lamb_runs_checkpoint_takes_lamb_on_every_worker(
        tmp_path, capsys, monkeypatch):
    # --optimizer auto keeps what the checkpoint's run took, LAMB, though an elastic job's
    # own choice would be SGD: the plan says so, and every worker trains so, rank 0 (which
    # reads the checkpoint) and the others (which read only what settles the plan).
    checkpoint = _lamb_run(tmp_path / "lamb-run")
    options = ["--mode", "sync", "--elastic", "--resume", checkpoint,
               "--out", str(tmp_path / "new")]
    assert _plan_json(Job(4), options, capsys)["optimizer"] == "lamb"
    monkeypatch.setattr(runner, "_job", lambda: Job(4))
    cfg = config_of(build_parser().parse_args(["train", *options])).resolved()
    for rank in (0, 1):
        with FakeComm(4, rank):
            _, saved, _ = runner._run_folder_and_saved_run(cfg, 0.0)
            assert runner._announced_plan(cfg, saved).config.optimizer == "lamb"


@pytest.mark.parametrize("rank", [0, 1, 3])
def test_an_elastic_job_given_another_optimizer_than_the_checkpoints_is_refused_on_every_rank(
        rank, tmp_path, monkeypatch):
    checkpoint = _lamb_run(tmp_path / "lamb-run")
    cfg = load_config(None, dict(mode="sync", elastic=True, optimizer="sgd", resume=checkpoint,
                                 out=str(tmp_path / "new"))).resolved()
    monkeypatch.setattr(runner, "_job", lambda: Job(4))
    with FakeComm(4, rank), pytest.raises(ConfigError, match=(
            r"^--resume \S+: the checkpoint was written with --optimizer lamb \(\S+\), not "
            r"sgd: give --optimizer lamb or auto$")):
        _, saved, _ = runner._run_folder_and_saved_run(cfg, 0.0)
        runner._announced_plan(cfg, saved)


def test_an_elastic_run_folder_of_a_lamb_run_goes_on_with_lamb_on_every_rank(tmp_path):
    # `--resume auto` of an elastic run that took LAMB (given then): auto keeps it, on the
    # rank that reads the checkpoint and on those that read the config alone.
    folder = tmp_path / "run"
    _lamb_run(folder, elastic=True)
    cfg = load_config(None, dict(elastic=True, out=str(folder))).resolved()
    chief = settle(cfg, Job(4), read_saved_run(cfg))
    others = settle(cfg, Job(4), read_saved_config(cfg))
    assert chief.config.optimizer == others.config.optimizer == "lamb"
    assert chief.to_dict() == others.to_dict()


def test_a_worker_that_joins_later_settles_the_plan_the_run_folder_holds(tmp_path):
    # The first rank 0 wrote config.yaml (the settled config) and a checkpoint; a worker
    # that joins now runs `train` from the top with the same command: it settles as the
    # others did, though the folder now holds a run.
    cfg = load_config(None, dict(mode="sync", elastic=True, batch_size=64,
                                 out=str(tmp_path / "run"))).resolved()
    first = settle(cfg, Job(16), read_saved_config(cfg))
    (tmp_path / "run").mkdir()
    first.config.save_yaml(str(tmp_path / "run" / "config.yaml"))
    sound_checkpoint(tmp_path / "run" / "checkpoints", 50)
    joined = settle(cfg, Job(16), read_saved_config(cfg))
    assert (first.config, first.peak_lr, first.period) == \
        (joined.config, joined.peak_lr, joined.period)
