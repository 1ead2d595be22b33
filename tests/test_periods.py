"""hvdtrain.rounds.periods: the period grammar, what it resolves to on a job, and its errors."""

import subprocess
import sys

import pytest

from hvdtrain.errors import ConfigError
from hvdtrain.rounds.periods import (AutoPeriod, PeriodError, job_size, parse_period, period_name,
                                     resolve_period)


@pytest.mark.parametrize("spec, workers, hosts, steps", [
    ("40/workers", 8, 1, 5),
    ("40/workers", 16, 4, 3),      # per worker: the hosts do not count
    ("40/hosts", 16, 4, 10),       # per host: the workers do not count
    ("40/hosts", 16, 1, 40),
    ("40/workers:5", 16, 1, 5),    # the minimum holds where 40/16 would give 3
    ("40/hosts:5", 32, 16, 5),
    ("40/workers:5", 2, 1, 20),    # and leaves a longer period alone
    (12, 64, 8, 12),               # a fixed period is the same on any job
    ("12", 64, 8, 12),
])
def test_a_period_resolves_to_steps_for_the_workers_or_the_hosts_it_counts(spec, workers, hosts,
                                                                             steps):
    assert resolve_period(spec, workers, hosts) == steps


@pytest.mark.parametrize("spec, period", [
    ("auto", AutoPeriod(32, 2)), ("auto:48", AutoPeriod(48, 2)), ("auto:1", AutoPeriod(1, 1)),
])
def test_an_adaptive_period_stays_adaptive_on_any_job(spec, period):
    assert resolve_period(spec, 8, 1) == resolve_period(spec, 64, 8) == period


@pytest.mark.parametrize("spec", [0, "40/workers:00", "auto:0", "40/racks", True, 2.5])
def test_a_bad_period_raises_its_own_error_which_names_no_flag(spec):
    with pytest.raises(PeriodError) as bad:
        resolve_period(spec, 8, 1)
    assert isinstance(bad.value, ConfigError) and isinstance(bad.value, ValueError)
    assert str(bad.value).startswith(f"a period must be a positive integer, got {spec!r}")
    assert "--" not in str(bad.value)


SPELLINGS = ["10", "auto", "auto:32", "auto:48", "qsr", "qsr:2", "qsr:1", "qsr:1:1.5",
             "qsr:1:15", "qsr:11:5", "qsr:4:.5", "link", "link:15", "link:15:8", "link:1:5",
             "link:15:4", "link:20", "40/workers", "40/workers:5", "40/hosts", "4/workers"]


def test_a_period_has_one_name_and_a_name_one_period():
    """Run folders are named by period: two periods with one name would share a folder."""
    names = {}
    for spec in SPELLINGS:
        names.setdefault(period_name(spec), set()).add(parse_period(spec))
    assert all(len(periods) == 1 for periods in names.values()), names
    assert len(names) == len({parse_period(spec) for spec in SPELLINGS})
    assert [period_name(s) for s in ("link:15", "link:1:5", "qsr:1:15", "qsr:11:5")] == [
        "link", "link1-5", "qsr1-15", "qsr11-5"]
    assert [period_name(s) for s in (10, "auto", "auto:48", "qsr:1", "link:20")] == [
        "10", "auto", "auto48", "qsr1", "link20"]  # the names sweeps have always given them


def test_messages_name_the_job_a_period_was_resolved_for():
    assert job_size(1, 1) == "1 worker"
    assert job_size(8, 1) == "8 workers"
    assert job_size(8, 4) == "8 workers on 4 hosts"


@pytest.mark.parametrize("module", ["hvdtrain.rounds.periods", "hvdtrain.benchmarks.costmodel"])
def test_periods_and_the_cost_model_come_without_the_trainers_options(module):
    code = f"import sys, {module}\nprint('hvdtrain.config' in sys.modules)\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
