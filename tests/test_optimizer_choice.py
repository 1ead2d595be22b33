"""`--optimizer auto`, the default: LAMB for sync from a global batch of 1,024, else SGD,
fixed when a run first starts and kept when it resumes (hvdtrain.optimizer_choice)."""

import pytest

from fake_comm import FakeComm
from hvdtrain.config import TrainConfig, load_config
from hvdtrain.errors import ConfigError
from hvdtrain.optimizer_choice import LAMB_FROM_GLOBAL_BATCH, auto_optimizer
from hvdtrain.plan import Job, settle
from hvdtrain.training.saved_run import SavedRun


def settled(cfg, workers, resumed=None):
    """`cfg` as the plan settles it for `workers`, resuming a run that took `resumed`."""
    return settle(cfg, Job(workers), SavedRun(source_optimizer=resumed)).config


@pytest.mark.parametrize("mode, global_batch, elastic, nesterov, hierarchical, chosen", [
    ("sync", 1024, False, False, False, "lamb"),
    ("sync", 2048, False, False, False, "lamb"),
    ("sync", 512, False, False, False, "sgd"),    # level with LAMB there: SGD's recipe stays
    ("local", 1024, False, False, False, "lamb"),
    ("local", 512, False, False, False, "sgd"),
    ("local", 2048, False, False, True, "sgd"),   # hierarchical: LAMB not measured
    ("async", 2048, False, False, False, "sgd"),  # nor in async mode
    ("sync", 2048, True, False, False, "sgd"),    # elastic: the global batch moves
    ("sync", 2048, False, True, False, "sgd"),    # --nesterov is SGD's
])
def test_auto_takes_lamb_for_sync_and_flat_local_from_a_global_batch_of_1024(
        mode, global_batch, elastic, nesterov, hierarchical, chosen):
    assert LAMB_FROM_GLOBAL_BATCH == 1024
    assert auto_optimizer(mode, global_batch, elastic, nesterov, hierarchical) == chosen


def test_a_settled_config_names_the_optimizer_and_takes_its_cap():
    cfg = load_config(None, {}).resolved()
    assert cfg.optimizer == "auto" and cfg.max_lr is None  # the cap waits for the choice
    assert (settled(cfg, 16).optimizer, settled(cfg, 16).max_lr) == ("lamb", 0.03)  # 16 x 64
    assert (settled(cfg, 8).optimizer, settled(cfg, 8).max_lr) == ("sgd", 0.1)
    # Flat local mode's LAMB rescales its rounds, which give the steps their length back:
    # sync's cap. Without rescaling, twice it: a round's mean of one-batch steps is shorter.
    local = load_config(None, {"mode": "local"}).resolved()
    assert (settled(local, 16).optimizer, settled(local, 16).max_lr) == ("lamb", 0.03)
    assert settled(local, 16).rescale_rounds and not settled(local, 8).rescale_rounds
    # Rescaled rounds travel in int4, the others in int8, unless told.
    assert local.round_compression is None  # it waits for the choice too
    assert (settled(local, 16).round_compression, settled(local, 8).round_compression) == \
        ("int4", "int8")
    plain = load_config(None, {"mode": "local", "rescale_rounds": False}).resolved()
    assert (settled(plain, 16).optimizer, settled(plain, 16).max_lr) == ("lamb", 0.06)
    assert settled(plain, 16).round_compression == "int8"
    told = load_config(None, {"mode": "local", "round_compression": "int8"}).resolved()
    assert settled(told, 16).round_compression == "int8" and settled(told, 16).rescale_rounds
    # Not when the momentum is averaged in rounds: shared, it keeps the steps' length.
    shared = load_config(None, {"mode": "local", "average_optimizer_state": True}).resolved()
    assert (settled(shared, 16).optimizer, settled(shared, 16).max_lr) == ("lamb", 0.03)
    assert not settled(shared, 16).rescale_rounds
    assert settled(shared, 16).round_compression == "int8"
    hierarchical = load_config(None, {"mode": "local", "hierarchical_sgd": True,
                                      "optimizer": "lamb"}).resolved()
    assert hierarchical.max_lr == 0.03  # not measured there: sync's cap
    capped = load_config(None, {"max_lr": 0.05}).resolved()
    assert settled(capped, 16).max_lr == 0.05  # a cap given is kept
    # A resumed run keeps what it took, whatever its workers now.
    assert settled(cfg, 8, resumed="lamb").optimizer == "lamb"
    assert settled(cfg, 16, resumed="sgd").optimizer == "sgd"
    given = load_config(None, {"optimizer": "sgd"}).resolved()
    assert settled(given, 16) == given.resolved()


def test_rank_0_says_in_one_line_when_a_new_run_takes_lamb(capsys):
    from hvdtrain.training.runner import _announced_plan

    cfg = load_config(None, {}).resolved()
    for rank in (0, 1):
        with FakeComm(16, rank):
            assert _announced_plan(cfg, SavedRun()).config.optimizer == "lamb"
            resumed = SavedRun(source_optimizer="sgd")  # resumed: no line
            assert _announced_plan(cfg, resumed).config.optimizer == "sgd"
    lines = [line for line in capsys.readouterr().out.splitlines()
             if not line.startswith("hvdtrain: plan: ")]  # rank 0's plan, twice
    assert lines == ["hvdtrain: --optimizer auto took lamb: --mode sync at a global batch of "
                     "1024 (from 1024, SGD's defaults ended lower at every seed measured); "
                     "give --optimizer sgd to keep SGD"]


def test_auto_resumes_a_run_on_either_optimizer_and_a_given_one_must_match():
    job = Job(workers=8, hosts=1)
    auto = load_config(None, {}).resolved()
    for saved_optimizer in ("lamb", "sgd"):
        saved = SavedRun(config=settled(auto, 16, resumed=saved_optimizer))
        # No error: auto keeps the saved one.
        assert settle(auto, job, saved).config.optimizer == saved_optimizer
    saved = SavedRun(config=settled(auto, 16))
    with pytest.raises(ConfigError, match="--optimizer is 'sgd' but the run was started "
                                          "with 'lamb'"):
        settle(load_config(None, {"optimizer": "sgd"}).resolved(), job, saved)


def test_the_default_is_auto_and_help_says_what_it_takes():
    field = TrainConfig.__dataclass_fields__["optimizer"]
    assert field.default == "auto"
    assert "lamb in sync mode from a global batch of 1024" in field.metadata["help"]
