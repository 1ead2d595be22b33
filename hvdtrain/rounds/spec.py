"""How and when local SGD's workers average, as one frozen value, and the rules that tie
its choices together, each written once.

`RoundSpec` holds every choice of a round: when (the period in steps or an adaptive rule,
or rounds every T seconds; rounds at epoch ends; the warm start), how (overlapped behind
the next steps as in async mode, in fragments, rescaled, across hosts only, sent in float16,
int8 or int4) and what (BatchNorm statistics and optimizer slots besides the weights, and
the outer step that takes the average).
`RULES` says which combinations cannot be; `RoundSpec.check(name)` raises
`RoundRuleError` for the first that is broken, in the words of whoever asked: the CLI
names its flags (`--mode async`, `--sync-seconds 2.0`), the Keras layer its arguments
(`LocalSGD(overlap=True)`, `sync_seconds=2.0`). Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from hvdtrain.rounds.periods import AutoPeriod, LinkPeriod, QuadraticPeriod, parse_period


class RoundRuleError(ValueError):
    """A combination of round choices that cannot be, in the asker's words."""


@dataclass(frozen=True)
class RoundSpec:
    n_sync: Any = None             # the period as given (steps, N/workers, auto, qsr, link), or None
    sync_seconds: float | None = None
    overlap: bool = False          # each round's allreduce behind the next steps (async mode)
    fragments: int = 1
    rescale: bool = False
    outer: str = "none"            # the outer step's name ("none": the plain average)
    hierarchical: bool = False
    warm_start_steps: int = 0
    warm_start: str = "sync"
    epoch_rounds: bool = True
    compression: str = "none"      # how a round travels: none (float32), fp16, int8, int4
    statistics: bool = True        # BatchNorm's moving statistics averaged with the weights
    optimizer_state: bool = False  # the optimizer's slots averaged too (momentum shared)
    outer_lr: float = 1.0          # the outer step's rate and momentum (SlowMo, Nesterov)
    outer_momentum: float = 0.0

    @property
    def adaptive_period(self) -> bool:
        """A period that a rule sets anew at rounds (auto, qsr, link), not a number of steps."""
        return self.n_sync is not None and isinstance(
            parse_period(self.n_sync), (AutoPeriod, QuadraticPeriod, LinkPeriod))

    def check(self, name: Callable[[str, Any, bool], str]) -> "RoundSpec":
        """Raise RoundRuleError for the first broken rule; `name(field, value, subject)`
        says a choice as the asker's user gave it (`subject`: as what the rule is about)."""
        for rule in RULES:
            problem = rule.problem(self, name)
            if problem:
                raise RoundRuleError(problem)
        return self


@dataclass(frozen=True)
class Rule:
    """When `subject` holds, none of `conflicts` may: `says` joins the subject's name and
    those of the conflicts that hold ({subject}, {given})."""

    subject: str
    holds: Callable[[RoundSpec], bool]
    conflicts: tuple[tuple[str, Callable[[RoundSpec], bool]], ...]
    says: str

    def problem(self, spec: RoundSpec, name: Callable[[str, Any, bool], str]) -> str | None:
        if not self.holds(spec):
            return None
        given = [name(field, getattr(spec, field), False) for field, broken in self.conflicts
                 if broken(spec)]
        if not given:
            return None
        return self.says.format(subject=name(self.subject, getattr(spec, self.subject), True),
                                given=" and ".join(given))


def _outer_step(spec: RoundSpec) -> bool:
    return spec.outer != "none"


def _timed(spec: RoundSpec) -> bool:
    return spec.sync_seconds is not None


RULES = (
    # The plain average takes no step of its own: an outer rate or momentum would be ignored.
    Rule("outer", lambda s: not _outer_step(s),
         (("outer_lr", lambda s: s.outer_lr != 1.0),
          ("outer_momentum", lambda s: s.outer_momentum != 0.0)),
         "{subject} takes the plain average, which has no {given}"),
    # Overlapped rounds land behind the next steps: an outer step needs every worker at the
    # round's result.
    Rule("overlap", lambda s: s.overlap, (("outer", _outer_step),),
         "{subject} takes the plain average: {given} needs every worker at a round's result"),
    # An adaptive period is a number of steps set at rounds; rounds by time have none.
    Rule("n_sync", lambda s: s.adaptive_period, (("sync_seconds", _timed),),
         "{subject} adapts a period of steps; {given} sets rounds by time instead: give one "
         "of them"),
    # Without epoch rounds a save or an evaluation waits for a blocking round of the period.
    Rule("epoch_rounds", lambda s: not s.epoch_rounds,
         (("overlap", lambda s: s.overlap), ("sync_seconds", _timed)),
         "{subject} needs blocking rounds every n_sync steps, got {given}"),
    # A rescaled round stretches a blocking round's mean of every worker's whole model.
    Rule("rescale", lambda s: s.rescale,
         (("overlap", lambda s: s.overlap), ("hierarchical", lambda s: s.hierarchical),
          ("fragments", lambda s: s.fragments > 1)),
         "{subject} needs blocking flat rounds of the whole model, got {given}"),
    # A fragment's round averages part of the state: an outer step needs every fragment's
    # x0 at once, and timed rounds end epochs at rounds that must average all of them.
    Rule("fragments", lambda s: s.fragments > 1,
         (("outer", _outer_step), ("sync_seconds", _timed)),
         "{subject} does not work with {given} yet"),
    Rule("hierarchical", lambda s: s.hierarchical,
         (("sync_seconds", _timed), ("warm_start_steps", lambda s: s.warm_start_steps > 0)),
         "{subject} does not work with {given} yet"),
    # One worker's warm start hands its state over at its end: it needs steps to have one.
    Rule("warm_start", lambda s: s.warm_start == "single",
         (("warm_start_steps", lambda s: s.warm_start_steps == 0),),
         "{subject} needs warm-start steps, got {given}"),
)
