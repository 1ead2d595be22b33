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
import time
from typing import Callable, Sequence

import keras

from hvdtrain import comm
from hvdtrain.config import OUTER_OPTIMIZERS, WARM_STARTS
from hvdtrain.errors import ArgumentError, ConfigError
from hvdtrain.keras import round_kinds
from hvdtrain.keras.adaptive_rounds import AdaptiveRounds
from hvdtrain.keras.gradient_averaging import averaging_optimizer
from hvdtrain.keras.initial_state import InitialState
from hvdtrain.keras.overlap import OverlappedRounds
from hvdtrain.keras.round_reports import CountReport, LossReport, NoReport
from hvdtrain.keras.state import (ModelStateAverager, OuterOptimizer, assign, build_optimizer,
                                  optimizer_step, set_optimizer_step)
from hvdtrain.keras.timed_epochs import TimedEpochs
from hvdtrain.periods import AutoPeriod, PerWorkerPeriod, parse_period
from hvdtrain.progress import TrainingProgress, executed_steps
from hvdtrain.round_triggers import (AdaptivePeriod, ConsensusWanted, EveryNSteps,
                                     EveryTSeconds, WarmStartEnd)
from hvdtrain.timed_rounds import RoundTimer


class LocalSGD(keras.callbacks.Callback):
    """Average the workers' weights every `n_sync` steps instead of every step.

    Args:
      n_sync: local steps between two averaging rounds (or give `sync_seconds`);
        "N/workers" gives ceil(N / workers) steps for the workers of each fit; "auto"
        (or "auto:N") sets the period anew at every round from the workers' averaged
        training loss since the last one, by AdaComm's rule ⌈√(F / F₀) · τ₀⌉ with τ₀ = 32
        (or N) and F₀ the first period's loss, never below 2 (`adaptive_rounds`).
      warm_start_steps: steps trained before going local, as `warm_start` says.
      warm_start: "sync": gradients are averaged every step of the warm start
        (post-local SGD, Lin et al. 2018); needs an optimizer made by
        `with_gradient_averaging`. "single": Paine et al.'s one-worker warm start:
        only rank 0's progress counts, and at its end (and at any epoch end within
        it) every worker takes rank 0's state. The other workers train meanwhile
        but their steps are discarded, so the phase costs the wall time of one
        worker and no communication per step.
      average_bn_stats: also average non-trainable float variables.
      average_optimizer_state: also average optimizer slots.
      outer_optimizer: "none" (plain averaging), "slowmo" or "nesterov".
      outer_lr, outer_momentum: alpha and beta of the outer update.
      broadcast_initial_state: start every worker from rank 0's state.
      overlap: run each round's allreduce behind the next `n_sync` steps (CoCoD-SGD,
        `hvdtrain.keras.overlap`): a worker takes the round's average plus its own
        progress since the round began, and waits only when a round outlasts the
        steps between rounds. Needs `outer_optimizer="none"`. Rounds at epoch ends,
        before evaluation and at the end of training still block, so the model
        evaluated and saved is the consensus model.
      sync_seconds: start a round every this many seconds of this worker's wall time
        instead of every `n_sync` steps (after the warm start), so a faster worker takes
        more steps between rounds (`hvdtrain.timed_rounds`). An epoch then ends when all
        workers together have trained `epoch_examples` more examples: the callback stops
        `fit` at the round that finds so, on every worker at once. Call `fit` once per
        epoch, on endless data (`dataset.repeat()`) without `steps_per_epoch`. The
        optimizer's step count follows the job's (examples / global batch) at each round,
        so a faster worker does not run ahead on the learning-rate schedule.
      batch_size: examples per step of one worker; needed with `sync_seconds`.
      epoch_examples: examples of all workers together in one epoch; needed with
        `sync_seconds` unless `progress` knows it.
      consensus_every: step intervals after which another callback waits for every
        worker to hold the same state (a step checkpoint, an elastic commit). With
        `overlap`, the first round at or after each such step blocks, landing the round
        in flight first; blocking rounds give consensus anyway.
      hierarchical: hierarchical local SGD (Lin et al. 2018) for hosts of several workers:
        the optimizer averages gradients among this host's workers every step
        (`with_gradient_averaging(..., within_host=True)` after
        `init(host_groups=True)`), so a host holds one model, and rounds average the
        hosts' models; "N/hosts" periods count hosts. No warm start yet.
      epoch_rounds: hold a round at each epoch end and before each evaluation, so every
        worker goes on from the consensus model (the default). False: rounds come only every
        `n_sync` steps, as in Paine et al., whose epochs and evaluations did not touch the
        clients. Epoch ends and evaluations then show every worker the workers' average
        (one allreduce, no outer step) for the callbacks that evaluate and save it, and each
        worker takes its own state back before its next step. Needs blocking rounds by
        steps (not `overlap`, not `sync_seconds`); the end of training is still a round.
      epoch_average_every: with `epoch_rounds=False`, show the average at every this
        many epoch ends, where callbacks after this one save or commit the model (an
        epoch checkpoint, an elastic commit); 0: at none (evaluations still see it).
      progress: the run's `TrainingProgress`, when another callback placed before
        this one advances it and sets the optimizer's step from it at every fit's start
        (hvdtrain's trainer does); by default this callback keeps its own step count,
        which starts where the optimizer's (rank 0's) stands at the first fit. Either way
        the count is the progress's: the optimizer's step follows it at every fit's start
        and at every round, so a mixed-precision step skipped for overflow on one worker
        cannot move that worker's rounds.

    Epoch logs gain `averaging_rounds` (rounds so far), `n_sync` (the period in force, unless
    rounds come every T seconds) and `divergence` (mean L2
    distance of a worker's weights from the average just before each local round
    this epoch; an overlapped round gives this worker's own distance, which
    `MetricAverage` then averages). Batch logs gain `round_seconds`: this worker's
    seconds in rounds so far (`TrainingProgress.round_seconds`), for callbacks that
    time what rounds cost. A round also runs before evaluation, at each epoch end and
    at the end of training, so what is evaluated and saved is the consensus model (with
    `epoch_rounds=False`, only at the end; before then the average is shown instead).

    With `steps_per_execution` > 1 Keras reports several steps per batch callback:
    they are all counted, and a round falls due at the end of the execution in which
    its step falls. The warm start's end must then fall on an execution boundary.
    """

    def __init__(self, n_sync: int | str | None = None, warm_start_steps: int = 0,
                 average_bn_stats: bool = True,
                 average_optimizer_state: bool = False, outer_optimizer: str = "none",
                 outer_lr: float = 1.0, outer_momentum: float = 0.0,
                 broadcast_initial_state: bool = True, fp16_allreduce: bool = False,
                 warm_start: str = "sync", progress: TrainingProgress | None = None,
                 overlap: bool = False, sync_seconds: float | None = None,
                 batch_size: int | None = None, epoch_examples: int | None = None,
                 consensus_every: Sequence[int] = (), hierarchical: bool = False,
                 epoch_rounds: bool = True, epoch_average_every: int = 1, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        if n_sync is None and sync_seconds is None:
            raise ArgumentError("LocalSGD needs n_sync (steps between rounds) or sync_seconds")
        period = _period(n_sync) if n_sync is not None else None
        if isinstance(period, AutoPeriod) and sync_seconds is not None:
            raise ArgumentError(f"LocalSGD takes n_sync or sync_seconds, got n_sync={n_sync!r} "
                             f"and sync_seconds={sync_seconds!r}")
        _check_arguments(warm_start_steps, warm_start, outer_optimizer)
        if overlap and outer_optimizer != "none":
            raise ArgumentError(f"LocalSGD(overlap=True) takes the plain average, got "
                             f"outer_optimizer={outer_optimizer!r}")
        if sync_seconds is not None:
            _check_timed(batch_size, epoch_examples or (progress and progress.epoch_examples))
        if hierarchical and (warm_start_steps or sync_seconds is not None):
            raise ArgumentError("LocalSGD(hierarchical=True) takes no warm start and no "
                                f"sync_seconds yet, got warm_start_steps={warm_start_steps} "
                                f"and sync_seconds={sync_seconds!r}")
        if not epoch_rounds and (overlap or sync_seconds is not None):
            raise ArgumentError("LocalSGD(epoch_rounds=False) needs blocking rounds every n_sync "
                                f"steps, got overlap={overlap} and sync_seconds={sync_seconds!r}")
        self.hierarchical = hierarchical
        self.epoch_rounds = epoch_rounds
        self.epoch_average_every = epoch_average_every
        self.n_sync = n_sync
        # "N/workers" is resolved for the workers of each fit (an elastic job may resize);
        # rounds every T seconds have no step period to resolve.
        self.per_worker = period if isinstance(period, PerWorkerPeriod) and \
            sync_seconds is None else None
        if self.per_worker is not None:
            period = self.per_worker.steps(comm.size(), comm.host_group().hosts)
        self.warm_start = warm_start
        self.average_bn_stats = average_bn_stats
        self.average_optimizer_state = average_optimizer_state
        self.outer = None if outer_optimizer == "none" else OuterOptimizer(
            outer_lr, outer_momentum, nesterov=outer_optimizer == "nesterov")
        self.broadcast_initial_state = broadcast_initial_state
        self.fp16_allreduce = fp16_allreduce
        self.batch_size = batch_size
        self.counts_steps = progress is None  # nobody else advances the progress then
        self._fits = 0
        self.progress = progress or TrainingProgress(epoch_examples or 0)
        self.overlap = overlap
        # When rounds fall due, one object per policy (hvdtrain.round_triggers).
        self.warm = WarmStartEnd(warm_start_steps)
        self.timed = TimedEpochs(self.progress, batch_size) if sync_seconds is not None else None
        self.adaptive = AdaptiveRounds(AdaptivePeriod(
            period.initial, period.minimum, warm_start_steps)) if isinstance(
                period, AutoPeriod) else None
        self.trigger = self._make_trigger(period, sync_seconds, clock)
        self.report = self._make_report()
        # How a round that falls due is held: chosen once (hvdtrain.keras.round_kinds).
        self.kind = (round_kinds.Timed(self, overlap) if sync_seconds is not None
                     else round_kinds.Overlapped(self) if overlap else round_kinds.Blocking(self))
        self.consensus = ConsensusWanted(consensus_every)
        self.initial_state = InitialState()
        self.averager: ModelStateAverager | None = None
        self._overlapped: OverlappedRounds | None = None
        self._begin = 0
        self._epoch_distances: list[float] = []
        # While the workers are shown their average (epoch_rounds=False): each worker's own
        # state, and the step after which the workers last really agreed.
        self._own: tuple[list, int | None] | None = None

    @property
    def warm_start_steps(self) -> int:
        return self.warm.steps

    @property
    def rounds(self) -> int:
        """Averaging rounds so far (the warm start's hand-over and epoch ends included)."""
        return self.progress.averaging_rounds

    def _make_trigger(self, period, sync_seconds, clock):
        if self.adaptive is not None:
            return self.adaptive.trigger
        if sync_seconds is not None:
            return EveryTSeconds(RoundTimer(sync_seconds, clock), self.progress)
        return EveryNSteps(period, self.warm.steps)

    def _make_report(self) -> NoReport:
        if self.adaptive is not None:
            return LossReport(self.adaptive)
        if self.timed is not None:
            return CountReport(self.timed, self._follow_job_step)
        return NoReport()

    @property
    def period(self) -> int | None:
        """Local steps between two rounds now (None when rounds come every T seconds)."""
        return getattr(self.trigger, "n_sync", None)

    @property
    def kept_state(self) -> dict[str, list]:
        """State beyond the model's and the optimizer's that a checkpoint and an elastic
        commit must keep, by name (after `attach`): the outer optimizer's momentum buffers,
        and the adaptive period's schedule."""
        kept = {}
        if self.averager is not None and self.averager.buffers:
            kept["outer_momentum"] = list(self.averager.buffers)
        if self.adaptive is not None:
            kept["round_schedule"] = [self.adaptive.kept]
        return kept

    def attach(self, model: keras.Model) -> ModelStateAverager:
        """Create the averaging state now (it is created at train begin otherwise), e.g. to
        restore its outer-optimizer buffers from a checkpoint before `fit`."""
        if self.averager is None:
            build_optimizer(model)  # the slots must exist before we can average them
            self.averager = ModelStateAverager(
                model, trainable=True, statistics=self.average_bn_stats,
                optimizer_state=self.average_optimizer_state, outer=self.outer,
                fp16_allreduce=self.fp16_allreduce)
            if self.overlap:
                self._overlapped = OverlappedRounds(
                    self.averager, self.report.length if self.report.carries else None)
        return self.averager

    # --- Keras hooks ---

    def on_train_begin(self, logs=None):
        averaging = averaging_optimizer(self.model.optimizer)
        averages_gradients = self.warm_start == "sync" and self.warm.steps > 0
        if averages_gradients and averaging is None:
            raise ArgumentError("LocalSGD(warm_start_steps>0) needs an optimizer made by "
                                "hvdtrain.keras.with_gradient_averaging")
        if self.hierarchical and not (averaging is not None and averaging.within_host):
            raise ArgumentError("LocalSGD(hierarchical=True) needs an optimizer made by "
                                "hvdtrain.keras.with_gradient_averaging(..., within_host=True)")
        _check_steps_per_execution(self.model, self.warm.steps)
        if self.per_worker is not None:
            self.trigger.n_sync = self.per_worker.steps(comm.size(), comm.host_group().hosts)
        averager = self.attach(self.model)
        self._own = None  # an elastic reset brought every worker the last commit instead
        if self.broadcast_initial_state:  # once per set of workers, not once per fit
            kept = [v for variables in self.kept_state.values() for v in variables]
            self.progress.broadcast_bytes += self.initial_state.give(
                self.model, kept, name="local_sgd_state")
        averager.reset_anchor()  # every fit starts in consensus (rounds end each one)
        if self.counts_steps and self._fits == 0:
            # Our own count starts where the optimizer stands (rank 0's, after the
            # broadcast), so a user's resumed model continues its schedule.
            self.progress.restore({"steps": optimizer_step(self.model.optimizer)})
        self._fits += 1
        set_optimizer_step(self.model.optimizer, self.progress.steps)
        if self.adaptive is not None:
            self.adaptive.take_kept()
        self.progress.consensus_step = self.progress.steps
        warming = self.warm.warming(self.progress.steps)
        self._trace(warming)
        if averaging is not None:  # hierarchical: a host's workers average every step
            averaging.averaging_enabled.assign(
                self.hierarchical or (averages_gradients and warming))
        if self.timed is not None:
            self.timed.begin(self.progress.steps, in_step=warming)
        self.trigger.restart()

    def on_epoch_begin(self, epoch, logs=None):
        if self.timed is not None:
            _check_one_epoch_per_fit(epoch, self.params.get("epochs", epoch + 1))
            self.timed.begin_epoch()
        if self.adaptive is not None:
            self.adaptive.loss.begin_epoch()

    def on_train_batch_begin(self, batch, logs=None):
        self._begin = batch
        self.take_back_own()

    def on_train_batch_end(self, batch, logs=None):
        steps = executed_steps(self._begin, batch)
        if self.counts_steps:
            self.progress.advance(steps, self.batch_size or 0, comm.size())
        done = range(self.progress.steps - steps + 1, self.progress.steps + 1)
        self.consensus.note(done)
        if self.adaptive is not None:
            self.adaptive.observe(batch, logs)
        if self.warm.due(done):
            self._end_warm_start()
        elif self.trigger.due(done):
            with self._timing_rounds():
                self.kind.hold()
        if self.timed is not None and self.timed.in_step_past_end():
            self.stop_epoch()  # in step, every worker gets here at the same step
        if logs is not None:
            logs["round_seconds"] = self.progress.round_seconds

    def on_test_begin(self, logs=None):
        self.reach_consensus()

    def on_epoch_end(self, epoch, logs=None):
        if self.timed is not None and not self.timed.stopped:
            # The other workers are still in timed rounds: this one cannot join them.
            raise ArgumentError(
                f"LocalSGD(sync_seconds=...): epoch {epoch + 1} ended on this worker's data "
                f"after {self.progress.examples} of the {self.timed.epoch_end} examples that "
                "end it for the job; give fit endless data (dataset.repeat()) and no "
                "steps_per_epoch")
        # The last epoch's end holds the end's round now, for its callbacks to save.
        last, every = epoch + 1 == self.params.get("epochs"), self.epoch_average_every
        if self.epoch_rounds or last or (every and (epoch + 1) % every == 0):
            self.reach_consensus(final=last)
        if logs is not None:
            logs["averaging_rounds"] = self.rounds
            distances = self._epoch_distances
            logs["divergence"] = sum(distances) / len(distances) if distances else 0.0
            if self.period is not None:
                logs["n_sync"] = self.period  # in force now: it changes with n_sync="auto"
        self._epoch_distances = []

    def on_train_end(self, logs=None):
        try:
            self.take_back_own()
            self.reach_consensus(final=True)
        finally:
            self.abandon_rounds()

    def abandon_rounds(self) -> None:
        """Stop the overlapped rounds' thread, dropping a round in flight: for a fit that
        raised, which Keras ends without `on_train_end`."""
        if self._overlapped is not None:
            self._overlapped.abandon()

    # --- rounds ---

    def _trace(self, warming: bool) -> None:
        """Build the rounds' graphs now, so no round stalls training on tracing."""
        self.averager.trace(apply_outer=True)
        if self._overlapped is not None:
            self._overlapped.trace()
        if warming:
            self.averager.trace(apply_outer=False, take_chief=self.warm_start == "single")

    def _end_warm_start(self) -> None:
        if self.warm_start == "sync":
            averaging_optimizer(self.model.optimizer).averaging_enabled.assign(False)
        with self._timing_rounds():
            self.blocking_round(warm_start=True)
        if self.adaptive is not None:
            self.adaptive.loss.take()  # F₀ is the first local period's loss
        if self.timed is not None:
            self.timed.begin(self.progress.steps, in_step=False)
        self.trigger.restart()

    def blocking_round(self, by_trigger: bool = False, warm_start: bool = False) -> None:
        """Every worker takes the mean now (after a one-worker warm start, rank 0's
        state); `by_trigger`: a round the trigger held, which its report goes with."""
        self.progress.state_bytes += self.report.before_state()
        set_optimizer_step(self.model.optimizer, self.progress.steps)  # the outer step's rate
        # After a synchronous warm start only the BatchNorm statistics differ; after a
        # one-worker warm start everything but rank 0's state is thrown away.
        distance = self.averager.average(apply_outer=not warm_start,
                                         take_chief=warm_start and self.warm_start == "single")
        if not warm_start:
            self._epoch_distances.append(distance)
        self._count_round()
        self.progress.consensus_step = self.progress.steps
        if by_trigger:
            self.progress.state_bytes += self.report.after_state()

    def start_overlapped(self) -> None:
        """Start a round from the state now, behind the next steps; the workers are not in
        consensus until a blocking round."""
        report = self.report.carried()
        self._overlapped.start(self.progress.steps, report)
        self._count_round()
        if report is not None and self._overlapped.in_flight:
            self.progress.state_bytes += report.nbytes

    def finish_in_flight(self) -> None:
        """Wait for the overlapped round in flight, if any, and apply it."""
        if self._overlapped is None or not self._overlapped.in_flight:
            return
        started_at = self._overlapped.started_at
        finished = self._overlapped.finish()
        self._epoch_distances.append(finished.distance)
        self.report.learn(finished.report)
        if started_at == self.progress.steps:
            # Nothing moved since its snapshot: every worker now holds its mean.
            self.progress.consensus_step = self.progress.steps

    def round_held(self) -> None:
        """The trigger's round is held (of either kind): count the next period from here."""
        self.trigger.held(self.progress.steps)
        self.report.round_held()

    def reach_consensus(self, final: bool = False) -> None:
        """Make every worker hold the same state now: a round in flight is applied, then a
        blocking round unless the workers already agree; with `epoch_rounds=False` after
        the warm start, unless `final`, the workers' average is only shown
        (`show_average`). A collective call; hvdtrain calls it before evaluations (also
        within an epoch), at epoch ends and at the end."""
        with self._timing_rounds():
            self.finish_in_flight()
            if self.averager is None or self.progress.in_consensus:
                return
            warming = self.progress.steps <= self.warm.steps
            if self.epoch_rounds or warming or final:
                # Blocking in overlapped mode too: the caller needs the consensus model now.
                self.blocking_round(warm_start=warming)
            else:
                self.show_average()

    def show_average(self) -> None:
        """Every worker holds the workers' average until its next step (`take_back_own`),
        which is no round: the period and the outer optimizer go on as before."""
        self._own = (self.averager.show_mean(), self.progress.consensus_step)
        self.progress.state_bytes += self.averager.bytes_per_round
        self.progress.consensus_step = self.progress.steps  # what callbacks now see agrees

    def take_back_own(self) -> None:
        """Each worker goes on from its own state after `show_average`."""
        if self._own is not None:
            own, self.progress.consensus_step = self._own
            assign(self.averager.variables, own)
            self._own = None

    def _count_round(self) -> None:
        self.progress.averaging_rounds += 1
        self.progress.state_bytes += self.averager.bytes_per_round

    @contextlib.contextmanager
    def _timing_rounds(self):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.progress.round_seconds += time.perf_counter() - start

    # --- the schedule and the fit ---

    def _follow_job_step(self, job_step: int) -> None:
        """After a timed round: the count, and with it the optimizer's step, follows the
        job's, so the learning-rate schedule follows the job's progress, not this
        worker's speed."""
        self.progress.take_job_step(job_step)
        set_optimizer_step(self.model.optimizer, job_step)

    def stop_epoch(self) -> None:
        self.model.stop_training = True
        self.timed.stopped = True


def _period(n_sync) -> int | AutoPeriod | PerWorkerPeriod:
    try:
        return parse_period(n_sync)
    except ConfigError:
        raise ArgumentError(f"n_sync must be a positive integer, \"N/workers\", \"auto\" or "
                         f"\"auto:N\", got {n_sync!r}") from None


def _check_arguments(warm_start_steps, warm_start: str, outer_optimizer: str) -> None:
    if isinstance(warm_start_steps, bool) or not isinstance(warm_start_steps, int) \
            or warm_start_steps < 0:
        raise ArgumentError(f"warm_start_steps must be a non-negative integer, got {warm_start_steps!r}")
    if warm_start not in WARM_STARTS:
        raise ArgumentError(f"warm_start must be one of {WARM_STARTS}, got {warm_start!r}")
    if outer_optimizer not in OUTER_OPTIMIZERS:
        raise ArgumentError(f"outer_optimizer must be one of {OUTER_OPTIMIZERS}, got {outer_optimizer!r}")


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
