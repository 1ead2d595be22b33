"""docs/configuration.md states every default of `hvdtrain train`: each option's declared
default in its first table, and what the job-dependent ones settle on (the optimizer
`--optimizer auto` takes, the rate's cap, the period, the round form) in its second. Both
are checked here against the code, `TrainConfig`'s fields and `hvdtrain.plan.settle`, so a
changed default fails this test until the page says the new one."""

import dataclasses
import os
import re

import pytest

from hvdtrain.config import TrainConfig
from hvdtrain.plan import Job, settle

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "configuration.md")
OPTION_TABLE = "## Every option"
JOB_TABLE = "## Defaults that depend on the job"
JOB_ANCHOR = "#defaults-that-depend-on-the-job"
UNUSED = "–"  # a job-table cell for an option the row's mode does not use

FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}

# The job table's rows, by their first cell: the options and jobs each row stands for.
# Every one of them must settle on the row's values. Below 1,024: 8 x 64 and 8 x 32;
# from 1,024: 16 x 64, 32 x 32 and 32 x 64; "any": both sides.
BELOW = [(Job(8), 64), (Job(8), 32)]
FROM_1024 = [(Job(16), 64), (Job(32), 32), (Job(32), 64)]
HOSTS = [(Job(8, 4), 64), (Job(16, 4), 64), (Job(32, 8), 64)]
JOB_ROWS = {
    "`--mode sync`, global batch below 1,024": ({"mode": "sync"}, BELOW),
    "`--mode sync`, global batch of 1,024 or more": ({"mode": "sync"}, FROM_1024),
    "`--mode local`, global batch below 1,024": ({"mode": "local"}, BELOW),
    "`--mode local`, global batch of 1,024 or more": ({"mode": "local"}, FROM_1024),
    "`--mode local --no-rescale-rounds`, global batch of 1,024 or more": (
        {"mode": "local", "rescale_rounds": False}, FROM_1024),
    "`--mode local --average-optimizer-state`, global batch of 1,024 or more": (
        {"mode": "local", "average_optimizer_state": True}, FROM_1024),
    "`--mode local --hierarchical-sgd`, any global batch": (
        {"mode": "local", "hierarchical_sgd": True}, HOSTS),
    "`--mode async`, fewer than 10 workers": ({"mode": "async"}, BELOW),
    "`--mode async`, 10 workers or more": ({"mode": "async"}, FROM_1024),
    "`--mode async --hierarchical-sgd`, fewer than 10 hosts": (
        {"mode": "async", "hierarchical_sgd": True}, HOSTS),
    "`--mode sync --elastic` or `--nesterov`, any global batch": (
        [{"mode": "sync", "elastic": True, "out": "runs/x"}, {"mode": "sync", "nesterov": True}],
        BELOW + FROM_1024),
}


def section_table(heading: str) -> list[list[str]]:
    """The cells of the first table under `heading`, header row first."""
    with open(PAGE, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    start = lines.index(heading)
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("## ") and rows:
            break
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            break
    assert rows, f"docs/configuration.md has no table under {heading!r}"
    return [row for row in rows if not set("".join(row)) <= set("-: ")]


def field_name(cell: str) -> str:
    options = re.findall(r"`--([a-z0-9-]+)", cell)
    assert len(options) == 1, f"expected one option in {cell!r}"
    return options[0].replace("-", "_")


def literal(cell: str):
    """A cell's value as the code holds it: on/off as booleans, numbers as floats."""
    text = cell.replace("`", "").strip()
    if text in ("on", "off"):
        return text == "on"
    try:
        return float(text)
    except ValueError:
        return text


def same(stated, actual) -> bool:
    if isinstance(stated, bool) or isinstance(actual, bool):
        return stated is actual or stated == actual and type(stated) is type(actual)
    if isinstance(stated, float):
        try:
            return float(actual) == stated
        except (TypeError, ValueError):
            return False
    return str(actual) == stated


def job_dependent() -> set[str]:
    """Options declared None whose value a job settles (per mode, or by the optimizer)."""
    settled = [settle(TrainConfig(mode=mode), Job(8)).config for mode in ("sync", "local", "async")]
    return {name for name, f in FIELDS.items()
            if f.default is None and any(getattr(cfg, name) is not None for cfg in settled)}


def test_the_option_table_names_every_option_once():
    named = [field_name(row[0]) for row in section_table(OPTION_TABLE)[1:]]
    assert sorted(named) == sorted(FIELDS), "rows missing or extra"
    assert len(named) == len(set(named))


@pytest.mark.parametrize("row", section_table(OPTION_TABLE)[1:], ids=lambda row: row[0])
def test_each_stated_default_is_the_codes(row):
    name, cell = field_name(row[0]), row[1]
    default = FIELDS[name].default
    if name in job_dependent():
        assert JOB_ANCHOR in cell, f"--{name}'s default depends on the job: link the job table"
        return
    assert JOB_ANCHOR not in cell, f"--{name} has one default, {default!r}: state it"
    if default is None:  # a missing value, said in words ("all", "off", "none", ...)
        assert not isinstance(literal(cell), float) and literal(cell) is not True, cell
        return
    assert same(literal(cell), default), f"--{name}: the page says {cell}, the code {default!r}"


def test_the_job_table_has_every_row_this_test_knows():
    rows = [row[0] for row in section_table(JOB_TABLE)[1:]]
    assert sorted(rows) == sorted(JOB_ROWS), (
        "a row of docs/configuration.md's job table is new or gone: say in JOB_ROWS here "
        "which options and jobs it stands for")


def job_table_cases():
    header, *rows = section_table(JOB_TABLE)
    columns = [field_name(cell) for cell in header[1:]]
    for row in rows:
        options, jobs = JOB_ROWS.get(row[0], ([], []))
        for kwargs in options if isinstance(options, list) else [options]:
            for job, batch in jobs:
                for name, cell in zip(columns, row[1:]):
                    yield pytest.param(kwargs, job, batch, name, cell,
                                       id=f"{row[0]}-{job.workers}x{batch}-{name}")


@pytest.mark.parametrize("kwargs, job, batch, name, cell", list(job_table_cases()))
def test_each_job_default_is_what_the_plan_settles(kwargs, job, batch, name, cell):
    cfg = settle(TrainConfig(batch_size=batch, **kwargs), job).config
    if cell == UNUSED:
        assert cfg.mode not in FIELDS[name].metadata["modes"], (
            f"--{name} is used in {cfg.mode} mode: give its value ({getattr(cfg, name)!r})")
        return
    assert same(literal(cell), getattr(cfg, name)), (
        f"{kwargs} at {job.workers} x {batch}: the page says --{name} {cell}, the plan "
        f"settles on {getattr(cfg, name)!r}")


def test_a_given_lamb_and_fragments_settle_as_the_page_says():
    """The notes under the job table."""
    local_lamb = settle(TrainConfig(mode="local"), Job(16)).config
    given = settle(TrainConfig(mode="local", optimizer="lamb"), Job(2)).config
    for name in ("max_lr", "n_sync", "round_compression", "rescale_rounds"):
        assert getattr(given, name) == getattr(local_lamb, name), name
    assert settle(TrainConfig(mode="sync", optimizer="lamb"), Job(2)).config.max_lr == \
        settle(TrainConfig(mode="sync"), Job(16)).config.max_lr
    fragments = settle(TrainConfig(mode="local", round_fragments=4), Job(16)).config
    unrescaled = settle(TrainConfig(mode="local", rescale_rounds=False), Job(16)).config
    assert fragments.rescale_rounds is False
    assert (fragments.max_lr, fragments.round_compression) == (
        unrescaled.max_lr, unrescaled.round_compression)
