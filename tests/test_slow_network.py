"""`hvdtrain plan --hosts H --link-rate RATE`: which side of the slow-network rule a job is
on (the network binds where sync spends SLOW_NETWORK_SHARE of its step or more
communicating), from the cost model's estimate of sync's share."""

import json

import pytest

from hvdtrain.benchmarks.slow_network import (MEASURED_STEPS, SLOW_NETWORK_SHARE,
                                              network_note, sync_communication_share)
from hvdtrain.cli import main
from hvdtrain.cluster.links import parse_rate
from hvdtrain.config import TrainConfig


def test_the_estimate_puts_the_measured_links_on_the_sides_they_were_measured_on():
    # ResNet-20 on 4 emulated hosts: sync ran at 0.19x independent workers' images/sec at
    # 10 Mbit/s (local mode took a third of its time) and at 0.81x at 100 Mbit/s (level).
    resnet20 = TrainConfig(model="resnet20")
    assert sync_communication_share(resnet20, 4, 4, parse_rate("10mbit")) >= SLOW_NETWORK_SHARE
    assert sync_communication_share(resnet20, 4, 4, parse_rate("100mbit")) < SLOW_NETWORK_SHARE


def test_a_slower_link_a_smaller_batch_and_more_workers_a_host_raise_syncs_share():
    cfg, rate = TrainConfig(model="resnet20"), parse_rate("100mbit")
    share = sync_communication_share(cfg, 4, 4, rate)
    assert sync_communication_share(cfg, 4, 4, rate / 10) > share
    assert sync_communication_share(TrainConfig(model="resnet20", batch_size=16), 4, 4,
                                    rate) > share
    assert sync_communication_share(cfg, 8, 4, rate) > share  # two workers share a link
    assert sync_communication_share(TrainConfig(model="resnet20", fp16_allreduce=True), 4, 4,
                                    rate) < share


def test_a_job_past_the_threshold_is_told_the_network_binds_and_what_local_mode_gained(capsys):
    assert main(["plan", "--hosts", "4", "--slots", "1", "--model", "resnet20", "--mode",
                 "local", "--link-rate", "10mbit"]) == 0
    note = [line for line in capsys.readouterr().out.splitlines() if "network" in line]
    assert len(note) == 1 and note[0].startswith("hvdtrain plan: note: the network binds: at "
                                                 "10mbit between 4 hosts sync would spend about")
    assert "it binds from 50% of its step or more (`hvdtrain bench --modes sync,independent`" \
           in note[0]
    assert "local mode reached sync's accuracy less a point in a third of sync's time" in note[0]
    assert "estimated by the cost model from a step of resnet20" in note[0]


def test_a_job_below_the_threshold_is_told_no_gain_is_established():
    note = network_note(TrainConfig(model="resnet20"), 4, 4, "1gbit")
    assert note.startswith("the network does not bind: at 1gbit between 4 hosts")
    assert note.endswith("below it no time gain of local mode is established")


def test_a_model_without_a_measured_step_is_told_the_rule_and_how_to_measure_it():
    assert "resnet50" not in MEASURED_STEPS
    note = network_note(TrainConfig(model="resnet50"), 8, 2, "10gbit")
    assert "the plan has no measured step of --model resnet50" in note
    assert "`hvdtrain bench --modes sync,independent` measures it" in note


def test_the_note_is_in_the_plans_json(capsys):
    assert main(["plan", "--hosts", "2", "--slots", "2", "--link-rate", "1gbit", "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any(note.startswith("the network") for note in notes)


@pytest.mark.parametrize("argv, message", [
    (["--workers", "4", "--link-rate", "10mbit"],
     "--link-rate 10mbit is the link between hosts: give --hosts 2 or more"),
    (["--hosts", "2", "--slots", "2", "--link-rate", "fast"],
     "--link-rate must be a rate in tc's units (10gbit, 1gbit, 100mbit), got 'fast'"),
])
def test_a_link_rate_the_plan_cannot_use_is_one_line(argv, message, capsys):
    assert main(["plan", *argv]) == 2
    assert capsys.readouterr().err == f"hvdtrain: error: {message}\n"
