"""What local SGD does at each event besides its period's rounds (hvdtrain.rounds.policy),
and when a run saves (hvdtrain.rounds.save_plan): each on its own."""

import pytest

from hvdtrain.rounds.policy import Act, RoundPolicy
from hvdtrain.rounds.save_plan import SavePlan

NOTHING, VIEW, ROUND = Act.NOTHING, Act.VIEW, Act.ROUND
PAINE = RoundPolicy(epoch_rounds=False, run_epochs=4)  # --no-epoch-rounds, a run of 4 epochs


def test_workers_that_agree_need_nothing_whatever_the_event():
    for policy in (RoundPolicy(), PAINE, RoundPolicy(False, SavePlan("steps", 1))):
        assert policy.at_evaluation(True, warming=True) is NOTHING
        assert policy.at_step_end(True, range(1, 2)) is NOTHING
        assert policy.at_epoch_end(True, 4, 4) is NOTHING
        assert policy.at_fit_end(True, 4) is NOTHING


def test_an_evaluation_sees_a_round_with_epoch_rounds_and_the_average_without():
    assert RoundPolicy().at_evaluation(False, warming=False) is ROUND
    assert PAINE.at_evaluation(False, warming=False) is VIEW
    assert PAINE.at_evaluation(False, warming=True) is ROUND  # the warm start's kind of round


def test_without_epoch_rounds_only_the_runs_last_epoch_end_and_commits_hold_rounds():
    assert [PAINE.at_epoch_end(False, e, fit_epochs=e) for e in (1, 2, 3, 4)] == \
        [NOTHING, NOTHING, NOTHING, ROUND]  # each epoch in a fit of its own: only the run's end
    # An epoch's checkpoint waits for the period's next round, as a step checkpoint does.
    saving = RoundPolicy(False, SavePlan("epochs", 2), run_epochs=4)
    assert [saving.at_epoch_end(False, e, 4) for e in (1, 2, 3, 4)] == \
        [NOTHING, NOTHING, NOTHING, ROUND]
    elastic = RoundPolicy(False, SavePlan(commit_every=50), run_epochs=4)
    assert elastic.at_epoch_end(False, 1, 4) is ROUND  # a commit at every epoch end
    assert [RoundPolicy().at_epoch_end(False, e, 4) for e in (1, 4)] == [ROUND, ROUND]


def test_a_fit_ends_in_a_round_where_the_run_ends_or_by_default_at_every_fit():
    assert [PAINE.at_fit_end(False, e) for e in (1, 3, 4)] == [NOTHING, NOTHING, ROUND]
    assert RoundPolicy(epoch_rounds=False).at_fit_end(False, 1) is ROUND  # a user's own fit
    assert RoundPolicy(run_epochs=4).at_fit_end(False, 1) is ROUND  # consensus at every end


def test_a_commit_holds_a_round_at_its_step_without_epoch_rounds_and_checkpoints_wait():
    saves = SavePlan("steps", 5, commit_every=3)
    without = RoundPolicy(False, saves)
    # The commits' steps; a checkpoint (every 5) waits for the next round, whichever.
    assert [s for s in range(1, 16) if without.at_step_end(False, range(s, s + 1)) is ROUND] \
        == [3, 6, 9, 12, 15]
    assert without.at_step_end(False, range(5, 7)) is ROUND  # two steps per execution
    assert RoundPolicy(False, SavePlan("steps", 5)).at_step_end(False, range(5, 6)) is NOTHING
    # With epoch rounds the next round (of the period, or an epoch end's) serves the save.
    assert RoundPolicy(True, saves).at_step_end(False, range(3, 4)) is NOTHING


@pytest.mark.parametrize("plan, epochs, steps", [
    (SavePlan("epochs", 2), [False, True, False, True], ()),
    (SavePlan("steps", 500), [False] * 4, (500,)),
    (SavePlan("steps", 500, commit_every=30), [True] * 4, (500, 30)),
    (SavePlan(), [False] * 4, ()),
])
def test_a_save_plan_tells_which_epoch_ends_and_step_intervals_save(plan, epochs, steps):
    assert [plan.saves_at_epoch_end(e) for e in (1, 2, 3, 4)] == epochs
    assert plan.step_intervals == steps
    assert plan.checkpoints_at_epoch_end(2) is (plan.checkpoint_unit == "epochs"
                                                and plan.checkpoint_every == 2)
