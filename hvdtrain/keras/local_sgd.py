"""Local SGD as a Keras callback: the GPU A-SGD approximation of Paine et al. (2013).

Every worker trains on its own shard without exchanging gradients; every `n_sync`
steps the workers' state is averaged in one grouped allreduce (Paine's
n_fetch = n_push = n_sync). Use it with any `model.fit`:

    import keras
    import hvdtrain.keras as hk

    hk.init()
    model = ...                                  # any built Keras 3 model
    optimizer = hk.with_gradient_averaging(      # only needed for warm_start_steps > 0
        keras.optimizers.SGD(0.05, momentum=0.9), averaging=False)
    model.compile(optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(dataset_shard, epochs=5, callbacks=[
        hk.LocalSGD(n_sync=100, warm_start_steps=500),   # first: it syncs before evaluation
        hk.MetricAverage(),                              # then metrics are averaged
        # rank 0 only: checkpoints, TensorBoard, ...
    ], verbose=1 if hk.rank() == 0 else 0)

What is averaged: trainable weights always; BatchNorm moving statistics by default
(workers' statistics drift apart like their weights do, and the consensus model
needs both); optimizer slots only when asked (see docs/training-modes.md, "What local SGD
averages", for the measurement behind that default).
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import time
from typing import Callable

import keras

from hvdtrain import comm
from hvdtrain.errors import ArgumentError
from hvdtrain.keras import round_kinds
from hvdtrain.keras.adaptive_rounds import AdaptiveRounds
from hvdtrain.keras.gradient_averaging import averaging_optimizer
from hvdtrain.keras.fragmented_rounds import FragmentedAverager, FragmentedOverlap
from hvdtrain.keras.initial_state import InitialState
from hvdtrain.keras.link_rounds import LinkRounds
from hvdtrain.keras.overlap import OverlappedRounds
from hvdtrain.keras.rate_rounds import RateRounds
from hvdtrain.keras.kept_schedule import KeptSchedule
from hvdtrain.keras.reported_schedule import ReportedSchedule
from hvdtrain.keras.round_reports import CountReport, NoReport, SummedReport
from hvdtrain.keras.round_runner import RoundRunner
from hvdtrain.keras.state import (ModelStateAverager, OuterOptimizer, build_optimizer,
                                  learning_rate_at, optimizer_step,
                                  set_optimizer_step)
from hvdtrain.keras.timed_epochs import TimedEpochs
from hvdtrain.rounds.periods import (AutoPeriod, LinkPeriod, PerWorkerPeriod, Period,
                                     QuadraticPeriod, parse_period)
from hvdtrain.progress import TrainingProgress, executed_steps
from hvdtrain.rounds.policy import Act, RoundPolicy
from hvdtrain.rounds.spec import ROUND_FIELDS, RoundRuleError, RoundSpec
from hvdtrain.rounds.rules import rescales_by_default
from hvdtrain.rounds.triggers import (AdaptivePeriod, ConsensusWanted, EveryNSteps,
                                     EveryTSeconds, LinkFollowingPeriod, RateFollowingPeriod,
                                     WarmStartEnd)
from hvdtrain.rounds.save_plan import SavePlan
from hvdtrain.rounds.timed import RoundTimer


class LocalSGD(keras.callbacks.Callback):
    """Average the workers' weights every `n_sync` steps instead of every step.

    The round choices come as one `RoundSpec` (`hvdtrain.rounds.spec`, as the trainer
    builds it from its flags), `LocalSGD(RoundSpec(n_sync=2, round_compression="int8"))`, or
    as keywords of the same names, `LocalSGD(n_sync=2, round_compression="int8")`, which
    make that same spec; not both. A choice not given takes the spec's default.

    Args:
      rounds: the round choices as one RoundSpec. Its fields are the arguments below but
        `broadcast_initial_state`, `batch_size`, `epoch_examples`, `saves`, `run_epochs`,
        `progress` and `clock`, which are keywords of their own.
      n_sync: local steps between two averaging rounds (or give `sync_seconds`);
        "N/workers" gives ceil(N / workers) steps for the workers of each fit; "auto"
        (or "auto:N") sets the period anew at every round from the workers' averaged
        training loss since the last one, by AdaComm's rule ⌈√(F / F₀) · τ₀⌉ with τ₀ = 32
        (or N) and F₀ the first period's loss, never below 2 (`adaptive_rounds`);
        "qsr:B:G" (or "qsr:B", G = 1; "qsr", B = 2) sets it at every round from the
        workers' mean learning rate η (each reads its optimizer's; the round sums them)
        by the quadratic synchronization rule, max(B, ⌊(G · peak / η)²⌋) with peak the
        highest such rate so far (Gu et al. 2024; `hvdtrain.keras.rate_rounds`);
        "link:S:M" (or "link:S", M = 8; "link", S = 15) sets it at every round from the
        workers' timed steps and rounds, the fewest steps, up to M, for which rounds take
        at most S% of a worker's time (`hvdtrain.keras.link_rounds`).
      warm_start_steps: steps trained before going local, as `warm_start` says.
      warm_start: "sync": gradients are averaged every step of the warm start
        (post-local SGD, Lin et al. 2018); needs an optimizer made by
        `with_gradient_averaging`. "single": Paine et al.'s one-worker warm start:
        only rank 0's progress counts, and at its end (and at any epoch end within
        it) every worker takes rank 0's state. The other workers train meanwhile
        but their steps are discarded, so the phase costs the wall time of one
        worker and no communication per step.
      average_bn_stats: also average non-trainable float variables.
      average_optimizer_state: also average optimizer slots. Compressed rounds send
        Adam's and LAMB's running squares in float32, since coded against a chunk's
        largest change the small ones come back coarse; and LAMB with shared momentum
        wants sync's rate, not a higher one (BENCHMARKS.md, "LAMB's state averaged in
        rounds").
      outer_optimizer: "none" (plain averaging), "slowmo" or "nesterov"; or a Keras
        optimizer of your own, which steps on the averaged pseudo-gradient x0 − x̄ with its
        own rate (as torchft's DiLoCo; `keras.optimizers.SGD(alpha, beta, nesterov=...)`
        is SlowMo or Nesterov at a fixed inner rate, `hvdtrain.keras.state.OuterOptimizer`).
      outer_lr, outer_momentum: alpha and beta of the named outer updates.
      broadcast_initial_state: start every worker from rank 0's state.
      fp16_allreduce: another name for `round_compression="fp16"` (rounds only: gradients
        travel as the optimizer's `with_gradient_averaging(fp16_allreduce=...)` says). Not
        with a coded `round_compression` (int8, int4, int2, int1, topk).
      round_compression: "none", or "fp16", "int8", "int4", "int2", "int1" or "topk": rounds
        send each worker's change since the last round plus what its last round's encoding
        cut off (error feedback), through an alltoall and an allgather, so every worker
        ends a round with the same bits (`hvdtrain.keras.compressed_rounds`). fp16 moves
        half of float32's bytes, int8 about a quarter, int4 about an eighth, int2 (each
        value's sign times its chunk's mean magnitude, or 0) about a sixteenth, int1 (its
        sign times that) about a thirty-second, topk (the 8 largest of every 256 values,
        each a code and its place) about a fifty-first.
      round_fragments: F > 1 cuts the averaged state by layer, in order, into F fragments of
        about equal bytes (`hvdtrain.keras.fragmented_rounds`); a period's round averages
        one fragment in turn (blocking, or with `overlap` behind the next steps), so a
        round's burst is about 1/F of the state and each fragment is averaged every F
        rounds, every F·n_sync steps. Rounds that must leave the workers agreeing (epoch
        ends and evaluations with `epoch_rounds`, the warm start's hand-over, the run's
        end) average every fragment, and so does the period's first round after a save
        of `saves` fell due where they did not agree. Each fragment keeps its own
        compressed reference and residual. Not with an outer optimizer or `sync_seconds`.
      rescale_rounds: stretch each weight's mean step in a round to the workers' mean
        length of their own steps (at most by sqrt(workers); `ModelStateAverager(rescale=
        True)`): with LAMB or LARS, which set each layer's step length, the mean of noisy
        steps otherwise moves less than sync mode's step. Blocking flat rounds only.
        None (the default) leaves it to the optimizer, as the CLI does: decided at
        `attach`, on for a `keras.optimizers.Lamb` with blocking flat rounds of the whole
        model that leave the optimizer's slots alone.
      overlap: run each round's allreduce behind the next `n_sync` steps (CoCoD-SGD,
        `hvdtrain.keras.overlap`): a worker takes the round's average plus its own
        progress since the round began, and waits only when a round outlasts the
        steps between rounds. Needs `outer_optimizer="none"`. Rounds at epoch ends,
        before evaluation and at the end of training still block, so the model
        evaluated and saved is the consensus model.
      merge_after: with `overlap`, take each round's mean this many steps after the round
        started (Streaming DiLoCo's tau), instead of when the next round starts: a mean
        less stale, behind fewer steps. None (the default): at the next round.
      sync_seconds: start a round every this many seconds of this worker's wall time
        instead of every `n_sync` steps (after the warm start), so a faster worker takes
        more steps between rounds (`hvdtrain.rounds.timed`). An epoch then ends when all
        workers together have trained `epoch_examples` more examples: the callback stops
        `fit` at the round that finds so, on every worker at once. Call `fit` once per
        epoch, on endless data (`dataset.repeat()`) without `steps_per_epoch`. The
        optimizer's step count follows the job's (examples / global batch) at each round,
        so a faster worker does not run ahead on the learning-rate schedule.
      batch_size: examples per step of one worker; needed with `sync_seconds`.
      epoch_examples: examples of all workers together in one epoch; needed with
        `sync_seconds` unless `progress` knows it.
      saves: when callbacks after this one save or commit the model
        (`hvdtrain.rounds.save_plan.SavePlan`: step or epoch checkpoints, elastic commits), where
        every worker must hold the model training goes on from. A save waits for the
        workers to agree (`progress.in_consensus`): an epoch end's round with
        `epoch_rounds`, or the period's next round, which it makes whole (every fragment;
        with `overlap` blocking, landing the round in flight first), so it waits at most
        a period. A wait outlives the end of a `fit`; only a new set of workers (an
        elastic reset) cancels it. A callback of your own that saves must be in `saves`
        and save at the first batch end or epoch end where `progress.in_consensus` holds
        once its save fell due, as hvdtrain's `Checkpointer` does
        (`hvdtrain.training.callbacks.SavePoints`); elsewhere it saves its worker's own
        state.
      hierarchical: hierarchical local SGD (Lin et al. 2018) for hosts of several workers:
        the optimizer averages gradients among this host's workers every step
        (`with_gradient_averaging(..., within_host=True)` after
        `init(host_groups=True)`), so a host holds one model, and rounds average the
        hosts' models; "N/hosts" periods count hosts. No warm start yet.
      epoch_rounds: hold a round at each epoch end and before each evaluation, so every
        worker goes on from the consensus model (the default). False: rounds come every
        `n_sync` steps, as in Paine et al., whose epochs and evaluations did not touch the
        clients, and besides only where the run ends and at each elastic commit of
        `saves` (at its step and at every epoch end, with the outer step). A checkpoint,
        of steps or of an epoch, holds no round of its own: it waits for the period's next
        round, which is whole (`saves`), so it holds the model training goes on from and a
        resumed run is the run that went on (compressed rounds' error feedback is not
        saved: a resume loses what the last round's encoding still owed). An evaluation
        sees the workers' average (one allreduce, no round) and each worker then takes its
        own state back. Needs blocking rounds by steps (not `overlap`, not
        `sync_seconds`).
      run_epochs: the epochs after which the run ends, when it calls `fit` more than once
        (hvdtrain's trainer calls it once per run of equal-length epochs); by default
        every fit's end is the run's. The end's round comes there only: with
        `epoch_rounds=False` the workers go from one fit into the next each with its own
        state.
      progress: the run's `TrainingProgress`, when another callback placed before
        this one advances it and sets the optimizer's step from it at every fit's start
        (hvdtrain's trainer does); by default this callback keeps its own step count,
        which starts where the optimizer's (rank 0's) stands at the first fit. Either way
        the count is the progress's: the optimizer's step follows it at every fit's start
        and at every round, so a mixed-precision step skipped for overflow on one worker
        cannot move that worker's rounds.
      clock: the seconds that rounds every T seconds and the link's period time steps by
        (`time.monotonic`; a test gives its own).

    Epoch logs gain `averaging_rounds` (rounds so far), `n_sync` (the period in force, unless
    rounds come every T seconds) and `divergence` (mean L2
    distance of a worker's weights from the average just before each local round
    this epoch; an overlapped round gives this worker's own distance, which
    `MetricAverage` then averages). Batch logs gain `round_seconds`: this worker's
    seconds in rounds so far (`TrainingProgress.round_seconds`), for callbacks that
    time what rounds cost. When else rounds come (evaluations, epoch ends, saves, the
    run's end) is `hvdtrain.rounds.policy`'s rule.

    With `steps_per_execution` > 1 Keras reports several steps per batch callback:
    they are all counted, and a round falls due at the end of the execution in which
    its step falls. The warm start's end must then fall on an execution boundary.
    """

    def __init__(self, rounds: RoundSpec | None = None, *,
                 progress: TrainingProgress | None = None, saves: SavePlan | None = None,
                 batch_size: int | None = None, epoch_examples: int | None = None,
                 run_epochs: int | None = None, broadcast_initial_state: bool = True,
                 clock: Callable[[], float] = time.monotonic, **round_options):
        super().__init__()
        self.spec = spec = _round_spec(rounds, round_options)
        period = _checked_period(spec.n_sync, spec.sync_seconds)
        _check_rules(spec)
        if spec.sync_seconds is not None:
            _check_timed(batch_size, epoch_examples or (progress and progress.epoch_examples))
        self.hierarchical = spec.hierarchical
        self.warm_start = spec.warm_start
        self.broadcast_initial_state = broadcast_initial_state
        self.batch_size = batch_size
        self.overlap = spec.overlap
        outer = _outer(spec.outer_optimizer, spec.outer_lr, spec.outer_momentum)
        # What a round averages, made by `attach` once the model is known.
        averager = ModelStateAverager if spec.round_fragments == 1 else functools.partial(
            FragmentedAverager, count=spec.round_fragments)
        self._averager_for = functools.partial(
            averager, trainable=True, statistics=spec.average_bn_stats,
            optimizer_state=spec.average_optimizer_state, outer=outer,
            compression=spec.compression, across_hosts=spec.hierarchical)
        self.counts_steps = progress is None  # nobody else advances the progress then
        self.progress = progress or TrainingProgress(epoch_examples or 0)
        self.policy = RoundPolicy(spec.epoch_rounds, saves or SavePlan(), run_epochs)
        self._make_schedule(spec.n_sync, period, spec.warm_start_steps, spec.sync_seconds, clock)
        self.initial_state = InitialState()
        self.averager: ModelStateAverager | FragmentedAverager | None = None
        self._begin = 0
        self._fits = 0
        self._world: int | None = None  # the set of workers of the last fit (comm.world_id)
        self._epochs_done = 0           # of the run, as Keras counts them, in this fit
        self._validation = contextlib.ExitStack()  # the average shown while Keras validates

    def _make_schedule(self, n_sync, period, warm_start_steps: int, sync_seconds, clock) -> None:
        """When the period's rounds fall due, one object per kind (hvdtrain.rounds.triggers;
        the other events' rounds are the policy's), how one is held (chosen once,
        hvdtrain.keras.round_kinds), and the runner that holds them all."""
        self.n_sync = n_sync
        # "N/workers" is resolved for the workers of each fit (an elastic job may resize);
        # rounds every T seconds have no step period to resolve.
        self.per_worker = period if isinstance(period, PerWorkerPeriod) and \
            sync_seconds is None else None
        if self.per_worker is not None:
            period = self.per_worker.steps(comm.size(), comm.host_group().hosts)
        self.warm = WarmStartEnd(warm_start_steps)
        self.timed = TimedEpochs(self.progress, self.batch_size) \
            if sync_seconds is not None else None
        self.reported = _reported_schedule(period, warm_start_steps, clock, self._rate)
        self.trigger = self._make_trigger(period, sync_seconds, clock)
        self.consensus = ConsensusWanted(self.policy.saves)
        self.report = self._make_report()
        self.runner = RoundRunner(self.progress, self.report, self.trigger,
                                  self.warm_start == "single")
        self.kind = self._make_kind(self.overlap, sync_seconds)

    @property
    def warm_start_steps(self) -> int:
        return self.warm.steps

    @property
    def rounds(self) -> int:
        """Averaging rounds so far (the warm start's hand-over and epoch ends included)."""
        return self.progress.averaging_rounds

    def _make_trigger(self, period, sync_seconds, clock):
        if self.reported is not None:
            return self.reported.trigger
        if sync_seconds is not None:
            return EveryTSeconds(RoundTimer(sync_seconds, clock), self.progress)
        return EveryNSteps(period, self.warm.steps)

    def _make_report(self) -> NoReport:
        if self.reported is not None:
            return SummedReport(self.reported)
        if self.timed is not None:
            return CountReport(self.timed, self._follow_job_step)
        return NoReport()

    def _make_kind(self, overlap: bool, sync_seconds: float | None):
        if sync_seconds is not None:
            return round_kinds.Timed(self.runner, self.timed, self.stop_epoch, overlap)
        if overlap:
            return round_kinds.Overlapped(self.runner, self.consensus)
        return round_kinds.Blocking(self.runner, self.consensus)

    @property
    def period(self) -> int | None:
        """Local steps between two rounds now (None when rounds come every T seconds)."""
        return getattr(self.trigger, "n_sync", None)

    @property
    def kept_state(self) -> dict[str, list]:
        """State beyond the model's and the optimizer's that a checkpoint and an elastic
        commit must keep, by name (after `attach`): the outer optimizer's momentum buffers,
        and the adaptive or rate-following period's schedule. (SlowMo's x0 is not among
        them: every save is a round, after which x0 is the model itself.)"""
        kept = {}
        if self.averager is not None and self.averager.outer_state:
            kept["outer_momentum"] = self.averager.outer_state
        if self._schedule is not None:
            kept["round_schedule"] = [self._schedule.kept]
        return kept

    def attach(self, model: keras.Model) -> ModelStateAverager | FragmentedAverager:
        """Create the averaging state now (it is created at train begin otherwise), e.g. to
        restore its outer-optimizer buffers from a checkpoint before `fit`."""
        if self.averager is None:
            build_optimizer(model)  # the slots must exist before we can average them
            self.averager = self._averager_for(model,
                                               rescale=_rescales(self.spec, model.optimizer))
            overlapped = self._overlapped_rounds() if self.overlap else None
            self.runner.attach(model, self.averager, overlapped)
        return self.averager

    def _overlapped_rounds(self) -> OverlappedRounds | FragmentedOverlap:
        length = self.report.length if self.report.carries else None
        if isinstance(self.averager, FragmentedAverager):
            return FragmentedOverlap(self.averager, self.runner.next_fragment, length)
        return OverlappedRounds(self.averager, length)

    # --- Keras hooks ---

    def on_train_begin(self, logs=None):
        averaging = self._checked_averaging()
        _check_steps_per_execution(self.model, self.warm.steps)
        if self.per_worker is not None:
            self.trigger.n_sync = self.per_worker.steps(comm.size(), comm.host_group().hosts)
        self.attach(self.model)
        self._start_together()
        set_optimizer_step(self.model.optimizer, self.progress.steps)
        if self._schedule is not None:
            self._schedule.take_kept()
        warming = self.warm.warming(self.progress.steps)
        self.runner.trace(warming)
        if averaging is not None:  # hierarchical: a host's workers average every step
            averaging.averaging_enabled.assign(
                self.hierarchical or (self._averages_gradients and warming))
        if self.timed is not None:
            self.timed.begin(self.progress.steps, in_step=warming)
        self.trigger.restart()
        self._epochs_done = 0

    def on_epoch_begin(self, epoch, logs=None):
        if self.timed is not None:
            _check_one_epoch_per_fit(epoch, self.params.get("epochs", epoch + 1))
            self.timed.begin_epoch()
        if self.reported is not None:
            self.reported.begin_epoch()

    def on_train_batch_begin(self, batch, logs=None):
        self._begin = batch
        if self.reported is not None:
            self.reported.batch_begun()

    def on_train_batch_end(self, batch, logs=None):
        steps = executed_steps(self._begin, batch)
        if self.counts_steps:
            self.progress.advance(steps, self.batch_size or 0, comm.size())
        done = range(self.progress.steps - steps + 1, self.progress.steps + 1)
        self.consensus.note(done)
        if self.spec.merge_after is not None and self.runner.merge_due(self.spec.merge_after):
            with self.runner.timing():
                self.runner.finish_in_flight()
        if self.reported is not None:
            self.reported.batch_ended(batch, steps, logs)
        if self.warm.due(done):
            self._end_warm_start()
        elif self.trigger.due(done):
            with self.runner.timing():
                self.kind.hold()
            if self.reported is not None:
                self.reported.round_took(self.runner.last_seconds)
        self._do(self.policy.at_step_end(self.progress.in_consensus, done))
        self.consensus.note_agreement(self.progress.in_consensus)  # the savers write here
        if self.timed is not None and self.timed.in_step_past_end():
            self.stop_epoch()  # in step, every worker gets here at the same step
        if logs is not None:
            logs["round_seconds"] = self.progress.round_seconds

    def on_test_begin(self, logs=None):
        self._validation.enter_context(self.evaluating())

    def on_test_end(self, logs=None):
        self._validation.close()

    def on_epoch_end(self, epoch, logs=None):
        if self.timed is not None and not self.timed.stopped:
            raise _ended_on_own_data(epoch, self.progress.examples, self.timed.epoch_end)
        self._epochs_done = epoch + 1
        self._do(self.policy.at_epoch_end(self._agree(), epoch + 1, self.params.get("epochs")))
        # An epoch's checkpoint where the workers end apart makes the next round whole.
        self.consensus.note_epoch_end(epoch + 1, self.progress.in_consensus)
        divergence = self.runner.take_divergence()
        if logs is not None:
            logs["averaging_rounds"] = self.rounds
            logs["divergence"] = divergence
            if self.period is not None:
                logs["n_sync"] = self.period  # in force now: it changes with n_sync="auto"

    def on_train_end(self, logs=None):
        try:
            self._validation.close()
            self._do(self.policy.at_fit_end(self._agree(), self._epochs_done))
        finally:
            self.abandon_rounds()

    def abandon_rounds(self) -> None:
        """Stop the overlapped rounds' thread, dropping a round in flight: for a fit that
        raised, which Keras ends without `on_train_end`."""
        self.runner.abandon()

    # --- what the policy asks for ---

    def evaluating(self) -> contextlib.AbstractContextManager:
        """Make every worker hold the model to evaluate, until the returned context closes:
        the consensus (after a round unless the workers agree), or with `epoch_rounds=False`
        the workers' average, shown while the context is open. A collective call;
        hvdtrain's evaluations within epochs use it, Keras's validation `on_test_begin`."""
        act = self.policy.at_evaluation(self._agree(), self._warming)
        if act is Act.VIEW:
            return self.runner.view()
        self._do(act)
        return contextlib.nullcontext()

    @property
    def _schedule(self) -> KeptSchedule | None:
        """The period's schedule kept with the model (auto's, qsr's or link's), if it has one."""
        return self.reported

    def _rate(self) -> float:
        """This worker's learning rate at the job's step now, which a rate-following period
        reports: its optimizer's schedule read at the job's count, whatever steps the
        optimizer counted."""
        return float(learning_rate_at(self.model.optimizer, self.progress.steps))

    @property
    def _warming(self) -> bool:
        return self.warm.warming(self.progress.steps)

    @property
    def _averages_gradients(self) -> bool:
        return self.warm_start == "sync" and self.warm.steps > 0

    def _agree(self) -> bool:
        """Whether every worker holds the same state, once a round in flight has landed."""
        with self.runner.timing():
            self.runner.finish_in_flight()
        return self.progress.in_consensus

    def _do(self, act: Act) -> None:
        if act is Act.ROUND:
            # Blocking in overlapped mode too: the caller needs the consensus model now.
            with self.runner.timing():
                self.runner.blocking_round(warm_start=self._warming)

    def _end_warm_start(self) -> None:
        if self.warm_start == "sync":
            averaging_optimizer(self.model.optimizer).averaging_enabled.assign(False)
        with self.runner.timing():
            self.runner.blocking_round(warm_start=True)
        if self.reported is not None:
            self.reported.warm_start_ended()  # auto's F₀ is the first local period's loss
        if self.timed is not None:
            self.timed.begin(self.progress.steps, in_step=False)
        self.trigger.restart()

    # --- the fit's start, the schedule and the fit's end ---

    def _checked_averaging(self):
        """The optimizer's gradient averaging, if it has one; refused in one line where the
        warm start or hierarchical mode needs one and it has not."""
        averaging = averaging_optimizer(self.model.optimizer)
        if self._averages_gradients and averaging is None:
            raise ArgumentError("LocalSGD(warm_start_steps>0) needs an optimizer made by "
                                "hvdtrain.keras.with_gradient_averaging")
        if self.hierarchical and not (averaging is not None and averaging.within_host):
            raise ArgumentError("LocalSGD(hierarchical=True) needs an optimizer made by "
                                "hvdtrain.keras.with_gradient_averaging(..., within_host=True)")
        return averaging

    def _start_together(self) -> None:
        """At the first fit, and after an elastic reset brought another set of workers,
        every worker takes rank 0's state (a view a raising fit left open is dropped: the
        reset brought the last commit). A later fit of the same workers goes on from where
        the last one left them: in consensus, or (`epoch_rounds=False`, before the run's
        end) each worker from its own state and SlowMo's x0 from the last round."""
        new_world = self._world != comm.world_id()
        self._world = comm.world_id()
        self.consensus.begin_fit(self._world)  # a save still waiting is void in a new world
        if new_world:
            self._validation.pop_all()
        else:
            self._validation.close()
        if self.broadcast_initial_state:  # once per set of workers, not once per fit
            kept = [v for variables in self.kept_state.values() for v in variables]
            self.progress.broadcast_bytes += self.initial_state.give(
                self.model, kept, name="local_sgd_state")
        if self.counts_steps and self._fits == 0:
            # Our own count starts where the optimizer stands (rank 0's, after the
            # broadcast), so a user's resumed model continues its schedule.
            self.progress.restore({"steps": optimizer_step(self.model.optimizer)})
        self._fits += 1
        if new_world or self.progress.in_consensus:
            self.averager.reset_anchor(new_world)
            self.progress.consensus_step = self.progress.steps

    def _follow_job_step(self, job_step: int) -> None:
        """After a timed round: the count, and with it the optimizer's step, follows the
        job's, so the learning-rate schedule follows the job's progress, not this
        worker's speed."""
        self.progress.take_job_step(job_step)
        set_optimizer_step(self.model.optimizer, job_step)

    def stop_epoch(self) -> None:
        self.model.stop_training = True
        self.timed.stopped = True


def _reported_schedule(period, warm_start_steps: int, clock: Callable[[], float],
                       rate: Callable[[], float]) -> ReportedSchedule | None:
    """The schedule of a period that the workers' reports set (auto, qsr, link), if it is
    one: each reads what it reports from this worker (`rate`: its learning rate now;
    `clock`: its time)."""
    if isinstance(period, AutoPeriod):
        return AdaptiveRounds(AdaptivePeriod(period.initial, period.minimum, warm_start_steps))
    if isinstance(period, QuadraticPeriod):
        return RateRounds(RateFollowingPeriod(period.base, period.growth, warm_start_steps), rate)
    if isinstance(period, LinkPeriod):
        return LinkRounds(LinkFollowingPeriod(period.share, period.maximum, period.initial,
                                              warm_start_steps), clock)
    return None


def _checked_period(n_sync, sync_seconds) -> Period | None:
    """The period of steps (None when only `sync_seconds` sets rounds), refused in one line
    where it cannot be."""
    if n_sync is None and sync_seconds is None:
        raise ArgumentError("LocalSGD needs n_sync (steps between rounds) or sync_seconds")
    return parse_period(n_sync) if n_sync is not None else None  # the spec has checked it


def _round_spec(rounds, options: dict) -> RoundSpec:
    """The round choices, given as one RoundSpec or as keywords naming its fields; refused
    in one line where they are both, or a keyword is no round choice."""
    if rounds is not None and not isinstance(rounds, RoundSpec):
        raise ArgumentError(f"LocalSGD's first argument is a RoundSpec of the round choices, "
                            f"got {rounds!r} (a period of steps is n_sync={rounds!r})")
    if rounds is not None and options:
        raise ArgumentError(f"LocalSGD takes the round choices as rounds=RoundSpec(...) or as "
                            f"keywords, not both: got a RoundSpec and {', '.join(options)}")
    for name in options:
        if name not in ROUND_FIELDS:
            close = difflib.get_close_matches(name, ROUND_FIELDS, n=1)
            raise ArgumentError(f"LocalSGD has no argument {name!r}"
                                + (f" (did you mean {close[0]}?)" if close else ""))
    return rounds if rounds is not None else RoundSpec(**options)


def _check_rules(spec: RoundSpec) -> None:
    """The round rules (`hvdtrain.rounds.spec`), in the layer's own words."""
    try:
        spec.check(_as_argument)
    except RoundRuleError as exc:
        raise ArgumentError(str(exc)) from None


def _as_argument(field: str, value, subject: bool) -> str:
    """A round choice as the layer's user gave it: `overlap=True`, or as a rule's subject
    `LocalSGD(overlap=True)`."""
    given = f"{field}={_outer_name(value)!r}" if field == "outer_optimizer" \
        else f"{field}={value!r}"
    return f"LocalSGD({given})" if subject else given


def _outer_name(outer_optimizer) -> str:
    """The outer step's name for the rules: a Keras optimizer is one too."""
    if isinstance(outer_optimizer, keras.optimizers.Optimizer):
        return type(outer_optimizer).__name__
    return outer_optimizer


def _rescales(spec: RoundSpec, optimizer) -> bool:
    """`rescale_rounds` decided for the model's optimizer, where the spec leaves it
    undecided (None): as the CLI's default, on for LAMB (the innermost optimizer, under a
    loss scale)."""
    if spec.rescale_rounds is not None:
        return spec.rescale_rounds
    while getattr(optimizer, "inner_optimizer", None) is not None:
        optimizer = optimizer.inner_optimizer
    name = "lamb" if isinstance(optimizer, keras.optimizers.Lamb) else type(optimizer).__name__
    return not spec.overlap and rescales_by_default(
        name, spec.hierarchical, spec.round_fragments, spec.average_optimizer_state)


def _ended_on_own_data(epoch: int, examples: int, epoch_end: int) -> ArgumentError:
    """Timed rounds: the fit ran out of this worker's data while the other workers are
    still in timed rounds, which this one cannot join."""
    return ArgumentError(
        f"LocalSGD(sync_seconds=...): epoch {epoch + 1} ended on this worker's data after "
        f"{examples} of the {epoch_end} examples that end it for the job; give fit endless "
        "data (dataset.repeat()) and no steps_per_epoch")


def _outer(outer_optimizer, outer_lr: float, outer_momentum: float):
    """The outer step: None (plain averaging), SlowMo's or Nesterov's, or a Keras optimizer."""
    if isinstance(outer_optimizer, keras.optimizers.Optimizer):
        return outer_optimizer
    if outer_optimizer == "none":
        return None
    return OuterOptimizer(outer_lr, outer_momentum, nesterov=outer_optimizer == "nesterov")


def _check_timed(batch_size, epoch_examples) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ArgumentError(f"LocalSGD(sync_seconds=...) needs batch_size, the examples of one "
                         f"worker's step, got {batch_size!r}")
    if not epoch_examples:
        raise ArgumentError("LocalSGD(sync_seconds=...) needs epoch_examples: an epoch ends when "
                         "the workers together have trained that many examples")


def _check_one_epoch_per_fit(epoch: int, epochs: int) -> None:
    """Timed rounds end an epoch by stopping the fit, so the fit's later epochs would never run."""
    if epochs - epoch > 1:
        raise ArgumentError(f"LocalSGD(sync_seconds=...) ends each epoch by stopping fit, so fit "
                         f"must train one epoch: call it once per epoch with "
                         f"initial_epoch=e, epochs=e + 1 (got {epochs - epoch} epochs from "
                         f"epoch {epoch + 1})")


def _check_steps_per_execution(model: keras.Model, warm_start_steps: int) -> None:
    """The warm start's gradient averaging is switched off between executions only."""
    per_execution = int(getattr(model, "steps_per_execution", 1) or 1)
    if per_execution > 1 and warm_start_steps % per_execution:
        raise ArgumentError(f"LocalSGD(warm_start_steps={warm_start_steps}) needs a multiple of the "
                         f"model's steps_per_execution ({per_execution})")
