"""`hvdtrain train --help` and `hvdtrain plan --help` for people: options in groups, each
in at most two lines at 80 columns with its default read from the code, the whole under
200 lines; plan's own options first, train's taken but listed once, by train's help."""

import dataclasses
import os
import re

import pytest

from hvdtrain.cli import main
from hvdtrain.config import TrainConfig
from hvdtrain.config_options import OPTION_GROUPS
from hvdtrain.plan import Job, settle
from hvdtrain.training import run_folder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def help_of(command, capsys, monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    return capsys.readouterr().out


def option_entries(text: str) -> dict[str, list[str]]:
    """Each option's invocation line -> the help lines under it (HelpLayout's layout)."""
    entries, current = {}, None
    for line in text.splitlines():
        if line.startswith("  -"):
            current = line.strip()
            entries[current] = []
        elif line.startswith("    ") and current:
            entries[current].append(line.strip())
        else:
            current = None
    return entries


def test_train_help_is_under_200_lines_each_option_in_two_at_80_columns(capsys, monkeypatch):
    text = help_of("train", capsys, monkeypatch)
    lines = text.splitlines()
    assert len(lines) <= 200
    assert max(len(line) for line in lines) <= 80
    entries = option_entries(text)
    assert len(entries) == len(dataclasses.fields(TrainConfig)) + 3  # -h, --config, --verbose
    assert {flag: help for flag, help in entries.items() if not 1 <= len(help) <= 2} == {}


def test_every_option_is_in_one_group_and_each_group_is_a_heading(capsys, monkeypatch):
    grouped = [name for _, names in OPTION_GROUPS for name in names]
    assert sorted(grouped) == sorted(TrainConfig.field_names())
    text = help_of("train", capsys, monkeypatch)
    headings = [line[:-1] for line in text.splitlines() if re.fullmatch(r"[a-z][a-z ,]+:", line)]
    assert headings == ["options"] + [title for title, _ in OPTION_GROUPS]


def tag_of(text: str, flag: str) -> str:
    entry = next(help for line, help in option_entries(text).items()
                 if line.split()[0] in (flag, flag + ","))
    return re.search(r"\(default: (.*)\)$", " ".join(entry)).group(1)


def test_the_default_tags_of_job_settled_options_say_what_the_plan_settles(capsys,
                                                                           monkeypatch):
    text = help_of("train", capsys, monkeypatch)
    sgd = settle(TrainConfig(mode="local"), Job(8)).config
    lamb = settle(TrainConfig(mode="local"), Job(16)).config
    unrescaled = settle(TrainConfig(mode="local", rescale_rounds=False), Job(16)).config
    async_one_step = settle(TrainConfig(mode="async"), Job(16)).config
    async_few = settle(TrainConfig(mode="async"), Job(4)).config
    assert lamb.optimizer == "lamb" and lamb.n_sync == 1 and lamb.rescale_rounds
    assert tag_of(text, "--n-sync") == (f"{sgd.n_sync} in local mode, {lamb.n_sync} on LAMB; "
                                        f"{async_few.n_sync} in async mode")
    assert tag_of(text, "--round-compression") == (
        f"{sgd.round_compression} in local mode, {lamb.round_compression} on LAMB; "
        f"{async_few.round_compression} in async mode, {async_one_step.round_compression} "
        f"at a period of 1 step")
    sync = settle(TrainConfig(), Job(8)).config
    assert tag_of(text, "--max-lr") == (f"{sync.max_lr:g}; {lamb.max_lr:g} on LAMB, "
                                        f"{unrescaled.max_lr:g} in flat local mode with "
                                        f"--no-rescale-rounds")
    assert tag_of(text, "--local-lr-workers") == (f"{sgd.local_lr_workers} in local mode, "
                                                  f"{async_few.local_lr_workers} in async mode")


def test_train_help_names_the_long_page_and_every_file_of_the_run_folder(capsys, monkeypatch):
    text = " ".join(help_of("train", capsys, monkeypatch).split())
    assert "docs/configuration.md" in text
    for name in (run_folder.CONFIG, run_folder.PLAN, run_folder.METRICS, run_folder.STEPS,
                 run_folder.SUMMARY, run_folder.TENSORBOARD, run_folder.CHECKPOINTS,
                 run_folder.FINAL_WEIGHTS):
        assert name in text


def test_plan_help_says_what_plan_does_first_and_points_to_train_for_train_options(
        capsys, monkeypatch):
    text = help_of("plan", capsys, monkeypatch)
    description = text.split("\n\n")[1]
    assert description.startswith("Show what `hvdtrain train` with these options will do")
    assert "without starting it" in description
    assert len(text.splitlines()) < 50
    assert "--mode" not in text and "--n-sync" not in text and "--batch-size" not in text
    assert "every option of hvdtrain train: see hvdtrain train --help" in text
    for own in ("--workers", "--hosts", "--slots", "--host-sizes", "--json"):
        assert f"  {own} " in text


def exit_code(argv) -> int:
    try:
        return main(argv)
    except SystemExit as exited:  # argparse's own refusals
        return exited.code


@pytest.mark.parametrize("argv", [["--sync-seconds", "abc"], ["--epochs"],
                                  ["--mode", "nosuch"], ["--mode", "sync", "--n-sync", "4"]])
def test_plan_refuses_a_bad_train_option_in_trains_own_line(argv, capsys):
    assert exit_code(["train", *argv]) == 2
    said_by_train = capsys.readouterr().err
    assert exit_code(["plan", "--workers", "2", *argv]) == 2
    assert capsys.readouterr().err == said_by_train
    assert said_by_train.count("\n") == 1 and said_by_train.startswith("hvdtrain: error: ")


def test_the_page_the_help_names_holds_each_groups_long_texts_and_the_numbers_in_code():
    from hvdtrain.benchmarks.slow_network import SLOW_NETWORK_SHARE
    from hvdtrain.rounds.periods import LINK_SHARE_RANGE

    page, modes = (open(os.path.join(ROOT, "docs", name), encoding="utf-8").read()
                   for name in ("configuration.md", "training-modes.md"))
    at_length = page.split("## Options at length\n")[1].split("\n## ")[0]
    headings = [line[4:] for line in at_length.splitlines() if line.startswith("### ")]
    assert [h.lower() for h in headings] == [title for title, _ in OPTION_GROUPS]
    low, high = LINK_SHARE_RANGE
    assert f"S is a whole percent from {low} to {high}" in at_length
    assert "P ≥ r (100 − S) / (S t)" in at_length  # S as the percent the option takes
    assert f"S a whole percent from {low} to {high}" in modes and "r (100 − S) / (S t)" in modes
    assert "SLOW_NETWORK_SHARE" in page and f"below {SLOW_NETWORK_SHARE:g}× independent" in page
