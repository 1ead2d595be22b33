"""How and when local SGD's workers average, as one frozen value, and the rules that tie
its choices together, each written once.

`RoundSpec` holds every choice of a round, under the names of `hvdtrain.keras.LocalSGD`'s
arguments: when (the period in steps or an adaptive rule, or rounds every T seconds;
rounds at epoch ends; the warm start), how (overlapped behind the next steps as in async
mode, in fragments, rescaled, across hosts only, sent in float16, int8, int4, int2, int1
or top-k) and what (BatchNorm statistics and optimizer slots besides the weights, and the
outer step that takes the average). A choice whose default depends on more than the spec
(rescaled rounds follow the optimizer) is None, "not decided", until whoever knows decides
it.

Each choice is checked on its own when a spec is made (`RoundFieldError`, naming the
field: the layer's argument). `RULES` says which combinations cannot be;
`RoundSpec.check(name)` raises `RoundRuleError` for the first that is broken, in the words
of whoever asked: the CLI names its flags (`--mode async`, `--sync-seconds 2.0`), the Keras
layer its arguments (`LocalSGD(overlap=True)`, `sync_seconds=2.0`). Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable

from hvdtrain.errors import ArgumentError
from hvdtrain.rounds.payload import CODED
from hvdtrain.rounds.periods import PeriodError, is_rule, parse_period
from hvdtrain.rounds.rules import (OUTER_OPTIMIZERS, ROUND_COMPRESSIONS, WARM_STARTS,
                                   rounds_compression)


class RoundRuleError(ArgumentError):
    """A combination of round choices that cannot be, in the asker's words."""


class RoundFieldError(RoundRuleError):
    """One round choice that cannot be whatever the others are: `field`, and `problem`,
    what is wrong with its value without naming who gave it, so that each asker names the
    choice its own way (the message names the field, which is the layer's argument)."""

    def __init__(self, field: str, problem: str):
        self.field, self.problem = field, problem
        super().__init__(f"{field} {problem}")


@dataclass(frozen=True)
class RoundSpec:
    n_sync: Any = None             # the period as given (steps, N/workers, auto, qsr, link), or None
    sync_seconds: float | None = None
    overlap: bool = False          # each round's allreduce behind the next steps (async mode)
    merge_after: int | None = None  # an overlapped round's mean taken this many steps after it
                                    # starts (Streaming DiLoCo's tau); None: at the next round
    round_fragments: int = 1
    rescale_rounds: bool | None = None  # None: not decided (on for LAMB, decided at attach)
    outer_optimizer: Any = "none"  # the outer step's name ("none": the plain average), or an optimizer
    hierarchical: bool = False
    warm_start_steps: int = 0
    warm_start: str = "sync"
    epoch_rounds: bool = True
    round_compression: str = "none"  # none (float32), fp16, int8, int4, int2, int1, topk
    fp16_allreduce: bool = False   # another name for round_compression="fp16"
    average_bn_stats: bool = True  # BatchNorm's moving statistics averaged with the weights
    average_optimizer_state: bool = False  # the optimizer's slots averaged too (momentum shared)
    outer_lr: float = 1.0          # the outer step's rate and momentum (SlowMo, Nesterov)
    outer_momentum: float = 0.0

    def __post_init__(self):
        for field, problem in FIELD_CHECKS:
            said = problem(getattr(self, field))
            if said:
                raise RoundFieldError(field, said)

    @property
    def compression(self) -> str:
        """How rounds travel: `round_compression`, or float16 where `fp16_allreduce` asks."""
        return rounds_compression(self.round_compression, self.fp16_allreduce)

    @property
    def adaptive_period(self) -> bool:
        """A period that a rule sets anew at rounds (auto, qsr, link), not a number of steps."""
        return self.n_sync is not None and is_rule(self.n_sync)

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
    return not (isinstance(spec.outer_optimizer, str) and spec.outer_optimizer == "none")


def _timed(spec: RoundSpec) -> bool:
    return spec.sync_seconds is not None


RULES = (
    # The plain average takes no step of its own: an outer rate or momentum would be ignored.
    Rule("outer_optimizer", lambda s: not _outer_step(s),
         (("outer_lr", lambda s: s.outer_lr != 1.0),
          ("outer_momentum", lambda s: s.outer_momentum != 0.0)),
         "{subject} takes the plain average, which has no {given}"),
    # Overlapped rounds land behind the next steps: an outer step needs every worker at the
    # round's result.
    Rule("overlap", lambda s: s.overlap, (("outer_optimizer", _outer_step),),
         "{subject} takes the plain average: {given} needs every worker at a round's result"),
    # Only an overlapped round is in flight to be merged later.
    Rule("merge_after", lambda s: s.merge_after is not None,
         (("overlap", lambda s: not s.overlap),),
         "{subject} merges overlapped rounds, got {given}"),
    # An adaptive period is a number of steps set at rounds; rounds by time have none.
    Rule("n_sync", lambda s: s.adaptive_period, (("sync_seconds", _timed),),
         "{subject} adapts a period of steps; {given} sets rounds by time instead: give one "
         "of them"),
    # Without epoch rounds a save or an evaluation waits for a blocking round of the period.
    Rule("epoch_rounds", lambda s: not s.epoch_rounds,
         (("overlap", lambda s: s.overlap), ("sync_seconds", _timed)),
         "{subject} needs blocking rounds every n_sync steps, got {given}"),
    # A rescaled round stretches a blocking round's mean of every worker's whole model
    # (left undecided, it is decided on only where it can be).
    Rule("rescale_rounds", lambda s: s.rescale_rounds is True,
         (("overlap", lambda s: s.overlap), ("hierarchical", lambda s: s.hierarchical),
          ("round_fragments", lambda s: s.round_fragments > 1)),
         "{subject} needs blocking flat rounds of the whole model, got {given}"),
    # A fragment's round averages part of the state: an outer step needs every fragment's
    # x0 at once, and timed rounds end epochs at rounds that must average all of them.
    Rule("round_fragments", lambda s: s.round_fragments > 1,
         (("outer_optimizer", _outer_step), ("sync_seconds", _timed)),
         "{subject} does not work with {given} yet"),
    Rule("hierarchical", lambda s: s.hierarchical,
         (("sync_seconds", _timed), ("warm_start_steps", lambda s: s.warm_start_steps > 0)),
         "{subject} does not work with {given} yet"),
    # One worker's warm start hands its state over at its end: it needs steps to have one.
    Rule("warm_start", lambda s: s.warm_start == "single",
         (("warm_start_steps", lambda s: s.warm_start_steps == 0),),
         "{subject} needs warm-start steps, got {given}"),
    # float16 and a coded compression are two ways for one round to travel.
    Rule("fp16_allreduce", lambda s: s.fp16_allreduce,
         (("round_compression", lambda s: s.round_compression in CODED),),
         "{subject} sends rounds as float16, {given} codes them: give one"),
)


def _integer(value, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _period_problem(n_sync) -> str | None:
    try:
        parse_period(n_sync)
    except PeriodError as exc:  # its words list every form a period may take
        return exc.problem
    return None


def _one_of(choices: tuple[str, ...], value) -> str | None:
    return None if value in choices else f"must be one of {', '.join(choices)}, got {value!r}"


def _outer_problem(value) -> str | None:
    if not isinstance(value, str) and callable(getattr(value, "apply", None)):
        return None  # an optimizer of the caller's own, which steps on the pseudo-gradient
    return _one_of(OUTER_OPTIMIZERS, value)


# Each choice on its own, checked when a spec is made: (field, what is wrong with a value).
FIELD_CHECKS: tuple[tuple[str, Callable[[Any], str | None]], ...] = (
    ("n_sync", lambda v: None if v is None else _period_problem(v)),
    ("round_fragments", lambda v: None if _integer(v, 1) else
     f"must be a positive integer, got {v!r}"),
    ("merge_after", lambda v: None if v is None or _integer(v, 1) else
     f"must be a positive integer, got {v!r}"),
    ("warm_start_steps", lambda v: None if _integer(v, 0) else
     f"must be a non-negative integer, got {v!r}"),
    ("warm_start", lambda v: _one_of(WARM_STARTS, v)),
    ("round_compression", lambda v: _one_of(ROUND_COMPRESSIONS, v)),
    ("outer_optimizer", _outer_problem),
)

# The round choices by name: a spec's fields, and the Keras layer's round arguments.
ROUND_FIELDS = tuple(f.name for f in fields(RoundSpec))
