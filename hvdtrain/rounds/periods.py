"""How often local rounds come: the period grammar and what it resolves to.

A period is a number of local steps between two averaging rounds, given as a fixed
number (100), per worker (40/workers, 40/workers:5), per host for hierarchical local
SGD (40/hosts), adaptive to the loss (auto, auto:48), following the learning rate
(qsr, qsr:1, qsr:1:1.5) or following the link (link, link:15, link:15:8). Pure: the trainer's options
(`hvdtrain.config`), the Keras layer and the cost model all read periods here, and each
names its own flag or argument when one is wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from hvdtrain.errors import ConfigError

# The modes that average the workers' state every period instead of gradients every step.
LOCAL_MODES = ("local", "async")
# auto: AdaComm's rule (hvdtrain.rounds.averaging.adacomm_period) from this first period down to
# this minimum; "auto:N" starts from N. Why these values: docs/choosing-a-mode.md, and the
# first time-to-accuracy measurements in docs/benchmarks/history.md.
AUTO_INITIAL_PERIOD = 32
AUTO_MIN_PERIOD = 2

# qsr: the quadratic synchronization rule (hvdtrain.rounds.averaging.quadratic_period) from this
# base period, its growth 1 (the period grows as soon as the rate falls below the peak
# over √(base + 1)); "qsr:B" and "qsr:B:G" set them.
QSR_BASE = 2
QSR_GROWTH = 1.0

# link: the period that holds the rounds to at most this share (percent) of a worker's time
# (`hvdtrain.rounds.averaging.link_period`), measured at every round: 15% asks for local
# mode to keep at least 0.85x of independent workers' images/sec, the bar its time
# measurements were held to. It starts at local's default period under SGD, and never exceeds four times it: a
# guard on the workers' drift, since longer periods were not measured with today's rounds.
# "link:S" and "link:S:M" set the share and the longest period.
LINK_SHARE_PERCENT = 15
# S, in whole percent: at 100% a round could take all of a worker's time.
LINK_SHARE_RANGE = (1, 90)
LINK_INITIAL_PERIOD = 2
LINK_MAX_PERIOD = 8

# `hvdtrain sweep` and `hvdtrain bench`: "--n-sync default" measures the period that
# `hvdtrain train` settles for each job (`hvdtrain.plan.settle`), not a period of its own.
TRAINS_DEFAULT = "default"

_GRAMMAR = re.compile(r"(\d+)|auto(?::(\d+))?|(\d+)/(workers?|hosts?)(?::(\d+))?")
_QSR = re.compile(r"qsr(?::(\d+)(?::(\d+(?:\.\d*)?|\.\d+))?)?")
_LINK = re.compile(r"link(?::(\d+)(?::(\d+))?)?")


class PeriodError(ConfigError, ValueError):
    """A period that is none of the forms `parse_period` reads. `problem` says what is wrong
    without naming where the period came from, so each caller names its own flag or
    argument. A ValueError to code that uses this module as a library; a ConfigError so
    that one let through still ends in one line at the CLI."""

    def __init__(self, spec: Any):
        self.spec = spec
        self.problem = (f"must be a positive integer, got {spec!r} (or N/workers, N/hosts, "
                        "N/workers:M for at least M steps, auto, auto:N to start the "
                        "adaptive period at N, qsr, qsr:B or qsr:B:G for a period of at "
                        "least B steps that grows as the learning rate decays, or link, "
                        "link:S or link:S:M for the period that holds rounds to S% of the "
                        f"time ({LINK_SHARE_RANGE[0]} to {LINK_SHARE_RANGE[1]}), at most M "
                        "steps)")
        super().__init__(f"a period {self.problem}")


@dataclass(frozen=True)
class AutoPeriod:
    """auto: the period adapts to the training loss, from `initial` to `minimum`."""

    initial: int = AUTO_INITIAL_PERIOD
    minimum: int = AUTO_MIN_PERIOD


@dataclass(frozen=True)
class PerWorkerPeriod:
    """40/workers: a period that shrinks as workers are added, so that the local steps
    taken between two rounds, summed over the workers, stay about `worker_steps`. More
    workers drift apart faster (each local step moves one worker's copy only), so a fixed
    period that suits 4 workers left 8 more than a point behind sync."""

    worker_steps: int
    # "hosts" (N/hosts): hierarchical local SGD, whose replicas are hosts, since the
    # workers of a host average every step and hold one model.
    per: str = "workers"
    # N/workers:M: never fewer steps than M (a round of weights and momentum every 2
    # steps moves as many bytes as sync mode's gradients every step).
    minimum: int = 1

    def steps(self, workers: int, hosts: int) -> int:
        """ceil(worker_steps / workers), at least `minimum`: 40/workers gives 20, 10, 5 and
        3 steps at 2, 4, 8 and 16 workers, 40/workers:5 gives 5 at 16; N/hosts divides by
        the hosts instead."""
        count = hosts if self.per == "hosts" else workers
        return max(self.minimum, -(-self.worker_steps // max(1, count)))


@dataclass(frozen=True)
class QuadraticPeriod:
    """qsr:B:G: a period of at least `base` steps that grows as (G × peak rate / rate)²
    as the learning rate decays (`hvdtrain.rounds.averaging.quadratic_period`)."""

    base: int = QSR_BASE
    growth: float = QSR_GROWTH


@dataclass(frozen=True)
class LinkPeriod:
    """link:S:M: the period set at every round so that the rounds take at most S% of a
    worker's time, from 1 to `maximum` steps (`hvdtrain.rounds.averaging.link_period`)."""

    share_percent: int = LINK_SHARE_PERCENT
    maximum: int = LINK_MAX_PERIOD
    initial: int = LINK_INITIAL_PERIOD

    @property
    def share(self) -> float:
        return self.share_percent / 100.0


Period = int | AutoPeriod | PerWorkerPeriod | QuadraticPeriod | LinkPeriod


def parse_period(spec: Any) -> Period:
    """100, "100" -> 100; "auto" -> AutoPeriod(); "auto:48" -> AutoPeriod(48);
    "40/workers" -> PerWorkerPeriod(40); "40/workers:5" -> PerWorkerPeriod(40, minimum=5);
    "qsr:1:1.5" -> QuadraticPeriod(1, 1.5); anything else raises PeriodError."""
    text = "" if isinstance(spec, bool) else str(spec).strip().lower().replace(" ", "")
    qsr, link = _QSR.fullmatch(text), _LINK.fullmatch(text)
    if qsr:
        period = _quadratic(*qsr.groups())
    elif link:
        period = _link(*link.groups())
    else:
        match = _GRAMMAR.fullmatch(text)
        period = _period_of(*match.groups()) if match else None
    if period is None:
        raise PeriodError(spec)
    return period


def _quadratic(base: str | None, growth: str | None) -> QuadraticPeriod | None:
    """qsr's period, or None for a base or growth of zero."""
    period = QuadraticPeriod(int(base) if base else QSR_BASE,
                             float(growth) if growth else QSR_GROWTH)
    return period if period.base > 0 and period.growth > 0 else None


def _link(share: str | None, maximum: str | None) -> LinkPeriod | None:
    """link's period, or None for a share outside `LINK_SHARE_RANGE` or a longest period of
    zero."""
    percent = int(share) if share else LINK_SHARE_PERCENT
    longest = int(maximum) if maximum else LINK_MAX_PERIOD
    if not LINK_SHARE_RANGE[0] <= percent <= LINK_SHARE_RANGE[1] or longest < 1:
        return None
    return LinkPeriod(percent, longest, min(LINK_INITIAL_PERIOD, longest))


def _period_of(steps: str | None, auto_initial: str | None, worker_steps: str | None,
               per: str | None, minimum: str | None) -> int | AutoPeriod | PerWorkerPeriod | None:
    """The period one match of the grammar names, or None for a count of zero."""
    if steps is not None:
        return int(steps) or None
    if worker_steps is not None:
        if int(worker_steps) == 0 or minimum is not None and int(minimum) == 0:
            return None
        return PerWorkerPeriod(int(worker_steps), "hosts" if per.startswith("host") else "workers",
                               int(minimum or 1))
    initial = int(auto_initial) if auto_initial is not None else AUTO_INITIAL_PERIOD
    return AutoPeriod(initial, min(AUTO_MIN_PERIOD, initial)) if initial > 0 else None


def is_rule(spec: Any) -> bool:
    """Whether `spec` is a period that a rule sets anew at rounds (auto, qsr, link), not a
    number of steps; False for anything `parse_period` refuses."""
    try:
        return isinstance(parse_period(spec), (AutoPeriod, QuadraticPeriod, LinkPeriod))
    except PeriodError:
        return False


def resolve_period(spec: Any, workers: int,
                   hosts: int) -> int | AutoPeriod | QuadraticPeriod | LinkPeriod:
    """The period a job of `workers` workers on `hosts` hosts uses: N/workers and N/hosts
    come to their steps, anything else is as `parse_period` reads it."""
    period = parse_period(spec)
    return period.steps(workers, hosts) if isinstance(period, PerWorkerPeriod) else period


def period_label(spec: Any, workers: int, hosts: int) -> int | str:
    """How tables name a period at `workers` workers on `hosts` hosts: its steps (N/workers
    and N/hosts resolved), or the word it was given (auto, auto:48, qsr:1, link)."""
    period = resolve_period(spec, workers, hosts)
    return period if isinstance(period, int) else str(spec)


def period_name(spec: Any) -> str:
    """How a run folder's name says a period: one name per period, and one period per name.
    Its shortest spelling, with the word and its first number run together and "-"
    between numbers: 10, auto, auto48, qsr1, qsr1-1.5, link20, link1-5, 40workers-5.
    "link:1:5" is link1-5 and "link:15" is link (15% is the default share), so the two
    never meet in one name; "auto" and "auto:32" are one period, and one name."""
    period = parse_period(spec)
    if isinstance(period, int):
        return str(period)
    if isinstance(period, PerWorkerPeriod):
        return _named(f"{period.worker_steps}{period.per}", (period.minimum,), (1,), first="-")
    if isinstance(period, AutoPeriod):
        return _named("auto", (period.initial,), (AUTO_INITIAL_PERIOD,))
    if isinstance(period, QuadraticPeriod):
        return _named("qsr", (period.base, period.growth), (QSR_BASE, QSR_GROWTH))
    return _named("link", (period.share_percent, period.maximum),
                  (LINK_SHARE_PERCENT, LINK_MAX_PERIOD))


def _named(word: str, values: tuple, defaults: tuple, first: str = "") -> str:
    """`word` and `values` but the trailing ones at their defaults, as `period_name` says."""
    kept = list(values)
    while kept and kept[-1] == defaults[len(kept) - 1]:
        kept.pop()
    numbers = [str(int(v)) if float(v).is_integer() else repr(float(v)) for v in kept]
    return word + (first + "-".join(numbers) if numbers else "")


def job_size(workers: int, hosts: int) -> str:
    """What a period was resolved for, as messages say it: "1 worker", "8 workers on 4 hosts"."""
    return f"{workers} worker{'s' * (workers != 1)}" + (f" on {hosts} hosts" if hosts > 1 else "")
