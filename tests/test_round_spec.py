"""The round rules (hvdtrain.rounds.spec), each written once: one test a rule, in the
CLI's words and the Keras layer's."""

import inspect

import pytest

from hvdtrain import comm
from hvdtrain.config import load_config
from hvdtrain.errors import ArgumentError, ConfigError
from hvdtrain.rounds.spec import FIELD_CHECKS, ROUND_FIELDS, RULES, RoundRuleError, RoundSpec

# For each rule, a choice of flags that breaks it, the CLI's line (None where no flags
# can), LocalSGD's arguments that break it, and the layer's line.
BROKEN = {
    "outer_optimizer": (dict(mode="local", outer_momentum=0.9),
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
    # The CLI refuses --merge-after outside async mode before the rules are asked.
    "merge_after": (None, None, dict(n_sync=3, merge_after=1),
                    "LocalSGD(merge_after=1) merges overlapped rounds, got overlap=False"),
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
    "rescale_rounds": (dict(mode="local", rescale_rounds=True, round_fragments=2),
                "--rescale-rounds needs blocking flat rounds of the whole model, got "
                "--round-fragments 2",
                dict(n_sync=2, rescale_rounds=True, hierarchical=True, overlap=True),
                "LocalSGD(rescale_rounds=True) needs blocking flat rounds of the whole model, "
                "got overlap=True and hierarchical=True"),
    "round_fragments": (dict(mode="local", round_fragments=4, sync_seconds=2.0),
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
    # --fp16-allreduce beside coded rounds sends the warm start's gradients as float16, and
    # the CLI's spec takes the compression it leaves the rounds.
    "fp16_allreduce": (None, None,
                       dict(n_sync=2, fp16_allreduce=True, round_compression="int8"),
                       "LocalSGD(fp16_allreduce=True) sends rounds as float16, "
                       "round_compression='int8' codes them: give one"),
}


def test_every_rule_has_a_case_here():
    assert [rule.subject for rule in RULES] == list(BROKEN)


@pytest.mark.parametrize("subject", list(BROKEN))
def test_a_broken_rule_is_one_line_in_the_clis_words_and_in_the_layers(subject):
    from hvdtrain.keras import LocalSGD

    flags, cli_line, arguments, layer_line = BROKEN[subject]
    if flags is not None:
        with pytest.raises(ConfigError) as cli:
            load_config(None, flags)
        assert str(cli.value) == cli_line
    with pytest.raises(ArgumentError) as layer:
        LocalSGD(**arguments)
    assert str(layer.value) == layer_line


def test_choices_that_break_no_rule_pass_and_a_spec_is_one_value():
    spec = RoundSpec(n_sync=2, overlap=True, round_fragments=4, hierarchical=True)
    assert spec.check(lambda field, value, subject: field) is spec
    with pytest.raises(RoundRuleError):
        RoundSpec(n_sync="qsr", sync_seconds=1.0).check(lambda f, v, s: f)
    with pytest.raises(Exception):
        spec.round_fragments = 2  # frozen


# For each choice checked on its own, a bad value and what is wrong with it, whoever asks.
BAD = {
    "n_sync": ("2x", "must be a positive integer, got '2x' (or N/workers"),
    "round_fragments": (0, "must be a positive integer, got 0"),
    "merge_after": (0, "must be a positive integer, got 0"),
    "warm_start_steps": (-1, "must be a non-negative integer, got -1"),
    "warm_start": ("solo", "must be one of sync, single, got 'solo'"),
    "round_compression": ("int3", "must be one of none, fp16, int8, int4, int2, int1, topk, got 'int3'"),
    "outer_optimizer": ("adam", "must be one of none, slowmo, nesterov, got 'adam'"),
}


def test_every_choice_checked_on_its_own_has_a_case_here():
    assert [field for field, _ in FIELD_CHECKS] == list(BAD)


@pytest.mark.parametrize("field", list(BAD))
def test_a_bad_choice_is_refused_when_a_spec_is_made_in_the_layers_words_and_the_clis(field):
    from hvdtrain.keras import LocalSGD

    value, problem = BAD[field]
    given = {field: value, **({} if field == "n_sync" else {"n_sync": 2})}
    for make in (RoundSpec, LocalSGD):
        with pytest.raises(ArgumentError) as layer:
            make(**given)
        assert str(layer.value).startswith(f"{field} {problem}")
    with pytest.raises(ConfigError) as cli:
        load_config(None, {"mode": "local", field: value})
    assert str(cli.value).startswith(f"--{field.replace('_', '-')} {problem}")


def test_the_clis_spec_says_a_bad_choice_by_its_flag():
    # The CLI's own range checks come first; the spec's, met by a config that skipped
    # them, still name the flag.
    from hvdtrain.config import TrainConfig, round_spec

    cfg = TrainConfig(mode="local", n_sync=2, round_fragments=0)
    with pytest.raises(ConfigError, match=r"^--round-fragments must be a positive integer, "
                                          r"got 0$"):
        round_spec(cfg)


def test_every_round_choice_has_one_default_the_spec_holds():
    from hvdtrain.keras import LocalSGD

    comm.init()
    # The layer names no round choice of its own, so it has no default to differ from the
    # spec's: a choice not given is the spec's.
    assert not set(inspect.signature(LocalSGD.__init__).parameters) & set(ROUND_FIELDS)
    made = LocalSGD(n_sync=2).spec
    for field in ROUND_FIELDS:
        if field != "n_sync":
            assert getattr(made, field) == getattr(RoundSpec(), field), field
    assert made == RoundSpec(n_sync=2) and RoundSpec().rescale_rounds is None


def test_local_sgd_names_at_most_ten_parameters_of_its_own():
    from hvdtrain.keras import LocalSGD

    named = [p for name, p in inspect.signature(LocalSGD.__init__).parameters.items()
             if name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD]
    assert len(named) <= 10, [p.name for p in named]


def test_local_sgd_from_a_spec_is_local_sgd_from_the_same_keywords():
    from hvdtrain.keras import LocalSGD

    comm.init()  # a world of one worker: a period per worker resolves for it
    options = dict(n_sync="6/workers", overlap=True, round_fragments=2, warm_start_steps=4,
                   round_compression="int8", average_bn_stats=False,
                   average_optimizer_state=True)
    made = LocalSGD(RoundSpec(**options))
    given = LocalSGD(**options)
    assert made.spec == given.spec == RoundSpec(**options)
    for attribute in ("overlap", "hierarchical", "warm_start", "period"):
        assert getattr(made, attribute) == getattr(given, attribute)
    assert made.warm.steps == given.warm.steps == 4
    assert made._averager_for.keywords == given._averager_for.keywords
    assert made._averager_for.keywords["compression"] == "int8"
    with pytest.raises(ArgumentError, match=r"^LocalSGD\(overlap=True\) takes the plain"):
        LocalSGD(RoundSpec(n_sync=2, overlap=True, outer_optimizer="slowmo"))


def test_a_spec_and_round_keywords_together_are_refused_in_one_line():
    from hvdtrain.keras import LocalSGD

    with pytest.raises(ArgumentError, match=r"^LocalSGD takes the round choices as "
                                            r"rounds=RoundSpec\(\.\.\.\) or as keywords, "
                                            r"not both: got a RoundSpec and n_sync$"):
        LocalSGD(RoundSpec(n_sync=2), n_sync=3)


def test_a_keyword_that_is_no_round_choice_is_refused_naming_it():
    from hvdtrain.keras import LocalSGD

    with pytest.raises(ArgumentError, match=r"^LocalSGD has no argument 'compression' "
                                            r"\(did you mean round_compression\?\)$"):
        LocalSGD(n_sync=2, compression="int8")
    with pytest.raises(ArgumentError, match=r"^LocalSGD has no argument 'zzz'$"):
        LocalSGD(n_sync=2, zzz=1)


def test_a_period_given_where_the_spec_goes_is_refused_in_one_line():
    from hvdtrain.keras import LocalSGD

    with pytest.raises(ArgumentError, match=r"^LocalSGD's first argument is a RoundSpec of "
                                            r"the round choices, got 10 \(a period of steps "
                                            r"is n_sync=10\)$"):
        LocalSGD(10)
