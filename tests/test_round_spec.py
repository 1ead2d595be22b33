"""The round rules (hvdtrain.rounds.spec), each written once: one test a rule, in the
CLI's words and the Keras layer's."""

import pytest

from hvdtrain.config import load_config
from hvdtrain.errors import ArgumentError, ConfigError
from hvdtrain.rounds.spec import RULES, RoundRuleError, RoundSpec

# For each rule, a choice of flags that breaks it, the CLI's line, LocalSGD's arguments
# that break it, and the layer's line.
BROKEN = {
    "outer": (dict(mode="local", outer_momentum=0.9),
              "--outer-optimizer none takes the plain average, which has no "
              "--outer-momentum 0.9",
              dict(n_sync=2, outer_lr=0.5, outer_momentum=0.9),
              "LocalSGD(outer_optimizer='none') takes the plain average, which has no "
              "outer_lr=0.5 and outer_momentum=0.9"),
    "overlap": (dict(mode="async", outer_optimizer="slowmo"),
                "--mode async takes the plain average: --outer-optimizer slowmo needs every "
                "worker at a round's result",
                dict(n_sync=2, overlap=True, outer_optimizer="slowmo"),
                "LocalSGD(overlap=True) takes the plain average: outer_optimizer='slowmo' needs "
                "every worker at a round's result"),
    "n_sync": (dict(mode="local", n_sync="auto", sync_seconds=2.0),
               "--n-sync auto adapts a period of steps; --sync-seconds 2.0 sets rounds by time "
               "instead: give one of them",
               dict(n_sync="auto", sync_seconds=2.0, batch_size=4, epoch_examples=8),
               "LocalSGD(n_sync='auto') adapts a period of steps; sync_seconds=2.0 sets rounds "
               "by time instead: give one of them"),
    "epoch_rounds": (dict(mode="local", epoch_rounds=False, sync_seconds=2.0),
                     "--no-epoch-rounds needs blocking rounds every n_sync steps, got "
                     "--sync-seconds 2.0",
                     dict(n_sync=2, epoch_rounds=False, overlap=True),
                     "LocalSGD(epoch_rounds=False) needs blocking rounds every n_sync steps, "
                     "got overlap=True"),
    "rescale": (dict(mode="local", rescale_rounds=True, round_fragments=2),
                "--rescale-rounds needs blocking flat rounds of the whole model, got "
                "--round-fragments 2",
                dict(n_sync=2, rescale_rounds=True, hierarchical=True, overlap=True),
                "LocalSGD(rescale_rounds=True) needs blocking flat rounds of the whole model, "
                "got overlap=True and hierarchical=True"),
    "fragments": (dict(mode="local", round_fragments=4, sync_seconds=2.0),
                  "--round-fragments 4 does not work with --sync-seconds 2.0 yet",
                  dict(n_sync=2, round_fragments=4, outer_optimizer="nesterov"),
                  "LocalSGD(round_fragments=4) does not work with outer_optimizer='nesterov' yet"),
    "hierarchical": (dict(mode="local", hierarchical_sgd=True, warm_start_steps=10),
                     "--hierarchical-sgd does not work with --warm-start-steps 10 yet",
                     dict(n_sync=2, hierarchical=True, sync_seconds=2.0, batch_size=4,
                          epoch_examples=8),
                     "LocalSGD(hierarchical=True) does not work with sync_seconds=2.0 yet"),
    "warm_start": (dict(mode="local", warm_start="single"),
                   "--warm-start single needs warm-start steps, got --warm-start-steps 0",
                   dict(n_sync=2, warm_start="single"),
                   "LocalSGD(warm_start='single') needs warm-start steps, got "
                   "warm_start_steps=0"),
}


def test_every_rule_has_a_case_here():
    assert [rule.subject for rule in RULES] == list(BROKEN)


@pytest.mark.parametrize("subject", list(BROKEN))
def test_a_broken_rule_is_one_line_in_the_clis_words_and_in_the_layers(subject):
    from hvdtrain.keras import LocalSGD

    flags, cli_line, arguments, layer_line = BROKEN[subject]
    with pytest.raises(ConfigError) as cli:
        load_config(None, flags)
    assert str(cli.value) == cli_line
    with pytest.raises(ArgumentError) as layer:
        LocalSGD(**arguments)
    assert str(layer.value) == layer_line


def test_choices_that_break_no_rule_pass_and_a_spec_is_one_value():
    spec = RoundSpec(n_sync=2, overlap=True, fragments=4, hierarchical=True)
    assert spec.check(lambda field, value, subject: field) is spec
    with pytest.raises(RoundRuleError):
        RoundSpec(n_sync="qsr", sync_seconds=1.0).check(lambda f, v, s: f)
    with pytest.raises(Exception):
        spec.fragments = 2  # frozen


def test_local_sgd_from_a_spec_is_local_sgd_from_the_same_keywords():
    from hvdtrain import comm
    from hvdtrain.keras import LocalSGD

    comm.init()  # a world of one worker: a period per worker resolves for it
    spec = RoundSpec(n_sync="6/workers", overlap=True, fragments=2, warm_start_steps=4,
                     compression="int8", statistics=False, optimizer_state=True)
    made = LocalSGD.from_spec(spec)
    given = LocalSGD(n_sync="6/workers", overlap=True, round_fragments=2, warm_start_steps=4,
                     round_compression="int8", average_bn_stats=False,
                     average_optimizer_state=True)
    for attribute in ("overlap", "hierarchical", "warm_start", "period"):
        assert getattr(made, attribute) == getattr(given, attribute)
    assert made.warm.steps == given.warm.steps == 4
    assert made._averager_for.keywords == given._averager_for.keywords
    assert made._averager_for.keywords["compression"] == "int8"
    with pytest.raises(ArgumentError, match=r"^LocalSGD\(overlap=True\) takes the plain"):
        LocalSGD.from_spec(RoundSpec(n_sync=2, overlap=True, outer="slowmo"))
