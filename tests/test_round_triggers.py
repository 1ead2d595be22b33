"""When local SGD holds a round: each policy of hvdtrain.rounds.triggers on its own."""

from hvdtrain.progress import TrainingProgress
from hvdtrain.rounds.save_plan import SavePlan
from hvdtrain.rounds.triggers import ConsensusWanted, EveryNSteps, EveryTSeconds, WarmStartEnd
from hvdtrain.rounds.timed import RoundTimer


def _due_steps(trigger, last=20, per_batch=1):
    return [end for end in range(per_batch, last + 1, per_batch)
            if trigger.due(range(end - per_batch + 1, end + 1))]


def test_every_n_steps_counts_local_steps_from_the_warm_starts_end():
    assert _due_steps(EveryNSteps(5)) == [5, 10, 15, 20]
    assert _due_steps(EveryNSteps(5, warm_start_steps=3)) == [8, 13, 18]
    # Several steps per Keras call: due in the call that holds the round's step.
    assert _due_steps(EveryNSteps(5, warm_start_steps=3), per_batch=4) == [8, 16, 20]


def test_the_warm_start_ends_once_after_its_last_step():
    warm = WarmStartEnd(4)
    assert _due_steps(warm) == [4] and _due_steps(WarmStartEnd(0)) == []
    assert warm.warming(3) and not warm.warming(4)


def test_timed_rounds_fall_due_on_this_workers_clock_only_out_of_step():
    now = [0.0]
    progress = TrainingProgress(100)
    trigger = EveryTSeconds(RoundTimer(2.0, lambda: now[0]), progress)
    trigger.restart()
    now[0] = 3.0
    assert not trigger.due(range(1, 2))  # in step (the warm start): steps decide
    progress.workers_in_step = False
    assert trigger.due(range(1, 2))
    trigger.restart()
    assert not trigger.due(range(2, 3))


def test_a_wait_for_consensus_makes_the_next_round_block_once():
    wanted = ConsensusWanted(SavePlan("steps", 4, commit_every=6))  # checkpoints, commits
    rounds = []
    for step in range(1, 13):
        wanted.note(range(step, step + 1))
        if step % 3 == 0:  # a round every 3 steps
            rounds.append((step, wanted.take()))
    # Wanted after 4 (round 6), 6 (round 6), 8 (round 9), 12 (round 12); not at round 3.
    assert rounds == [(3, False), (6, True), (9, True), (12, True)]
    assert not ConsensusWanted().take()
