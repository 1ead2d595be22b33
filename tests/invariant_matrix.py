"""The invariant matrix: local SGD's round choices in combination, each cell a run of the
trainer's own parts in threaded workers (tests/threaded_comm.py), checked for what must
hold whatever the options.

A cell is one value of each of `DIMENSIONS`. Its options become a `TrainConfig` and
`hvdtrain.plan.settle` settles it, as `hvdtrain train` does; a cell that the config's
checks or the plan refuse (the round rules of `hvdtrain.rounds.spec` among them) is not a
run, so the matrix asks them (`allowed`) rather than keeping a list of its own.
Each worker then builds what the trainer builds from the plan (`current_world`'s
schedule, `make_optimizer`, `state_callback`'s LocalSGD, `save_plan`, the Checkpointer
on rank 0, the elastic commit) around a small Dense model, and fits as `runner._fit` does:
one `fit` per run of equal-length epochs; in an elastic job, as Horovod's elastic loop
does around it (`ThreadElasticState`).

What every cell must hold (`problems`):
- no hang: a collective that waits `threaded_comm.WAIT_SECONDS` for its peers fails the
  cell (CollectiveHung);
- the run ends, every worker at the run's last step;
- every worker holds the same bits after every whole round (a round after which the
  workers agree, `TrainingProgress.in_consensus`) and at the run's end;
- every checkpoint that falls due is written within one period of its step (the period
  in force then), and holds the model the workers agreed on there;
- the plan's period is the one every worker's rounds follow (for a period that a rule
  sets at rounds, every worker follows the same one), and the plan's peak and initial
  learning rates are those every worker trained at.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field
from typing import Any, Mapping
from unittest import mock

import keras
import numpy as np
import tensorflow as tf

from covering_arrays import covering_array
from hvdtrain import comm
from hvdtrain.config import TrainConfig
from hvdtrain.errors import ConfigError
from hvdtrain.keras.schedule import WarmupDecaySchedule
from hvdtrain.plan import Job, RunPlan, settle
from hvdtrain.progress import TrainingProgress, fit_phases
from hvdtrain.training.build import elastic_variables, save_plan, state_callback, use_world
from hvdtrain.training.callbacks import Checkpointer, CountProgress, ElasticCommit
from hvdtrain.training.optimizers import make_optimizer
from hvdtrain.training.world import current_world
from threaded_comm import WAIT_SECONDS, run_workers, this_worker

# Each dimension's values; a cell takes one of each.
DIMENSIONS: dict[str, tuple] = {
    "mode": ("local", "async"),                  # blocking rounds, or overlapped (async)
    "hosts": ("flat", "equal", "unequal"),       # flat local SGD, or hierarchical on hosts
    "period": ("steps", "qsr", "auto", "link"),
    # How a round travels ("none": float32; int2, int1 and topk send statistics in float32).
    "compression": ("none", "int8", "int4", "int2", "int1", "topk"),
    "fragments": (1, 2),
    "epoch_rounds": (True, False),
    "checkpoints": ("epochs", "steps"),
    "fits": ("one", "split"),                    # one fit, or one per run of equal epochs
    "elastic_reset": (0, 1),                     # 0: not elastic; 1: an elastic job, one reset
    # Streaming rounds: each kind is a value here and its options in `STREAMING`; the
    # arrays pair it with every other choice, and the rules' refusals leave out what
    # cannot be (a merge needs overlapped rounds: async mode).
    "streaming": ("off", "merge1"),
}
# The options of each value of "streaming" (as config keys, added to the cell's others):
# "merge1" takes each overlapped round's mean a step after it starts (Streaming DiLoCo's
# tau), not at the next round.
STREAMING: dict[str, dict[str, Any]] = {"off": {}, "merge1": {"merge_after": 1}}

# Interactions of more than two options under which a run once went wrong: the arrays
# always hold a cell of each, whatever else they pick.
SEEDS: tuple[dict[str, Any], ...] = (
    # Without epoch rounds, fragments' rounds never give consensus, and an epoch's
    # checkpoint waited for the run's end.
    dict(mode="local", fragments=2, epoch_rounds=False, checkpoints="epochs",
         period="steps", elastic_reset=0),
    # Without epoch rounds, a step checkpoint due shortly before a fit's end was dropped
    # when the next fit began.
    dict(mode="local", epoch_rounds=False, checkpoints="steps", fits="split",
         period="steps", elastic_reset=0),
    # Hosts of unequal size train at different rates; a period read from each host's own
    # rate parted their rounds, and overlapped rounds then waited for each other.
    dict(mode="async", hosts="unequal", period="qsr"),
)

# Workers, and the ranks of each host (None: one host, flat rounds). Unequal hosts of 2
# and 1 train at different peak rates once the flat rule counts fewer workers than the
# larger host has (`LOCAL_LR_WORKERS`), as the trainer's hosts of 6 and 2 do at its
# defaults' cap of 4.
HOSTS: dict[str, tuple[int, tuple[tuple[int, ...], ...] | None]] = {
    "flat": (2, None),
    "equal": (4, ((0, 1), (2, 3))),
    "unequal": (3, ((0, 1), (2,))),
}
PERIODS = {"steps": 3, "qsr": "qsr:1:0.2", "auto": "auto:3", "link": "link"}
BATCH = 4              # examples of one worker's step
EPOCH_STEPS = 4        # steps of an epoch; split fits' epochs take 5 and 4
EPOCHS = 2
SAVE_EVERY = 5         # steps between step checkpoints
COMMIT_EVERY = 4       # steps between elastic commits
FAIL_AFTER = 6         # an elastic cell's workers fail at their first agreement from here
LOCAL_LR_WORKERS = 1
# Step decay (x0.1 at half the steps after warmup) makes qsr's period jump from 1 to
# (0.2 x 10)^2 = 4, where float32 rounding of a host's own rate could decide the floor:
# under the square-root rule the unequal hosts' peaks (0.0707 and 0.05) differ in their
# mantissas, as a power of two apart they would not.
BASE_LR = 0.4
LR_SCALING = "sqrt"

_BUILDING = threading.Lock()  # Keras's seeds are global: one model built at a time


def options(cell: Mapping[str, Any]) -> dict[str, Any]:
    """The trainer's options of a cell (`hvdtrain train`'s flags, as config keys)."""
    return dict(
        mode=cell["mode"], hierarchical_sgd=cell["hosts"] != "flat",
        n_sync=PERIODS[cell["period"]], round_compression=cell["compression"],
        round_fragments=cell["fragments"], epoch_rounds=cell["epoch_rounds"],
        checkpoint_every="1epoch" if cell["checkpoints"] == "epochs" else str(SAVE_EVERY),
        elastic=bool(cell["elastic_reset"]), elastic_commit_every=COMMIT_EVERY,
        out="runs/invariant-matrix", batch_size=BATCH, epochs=EPOCHS, optimizer="sgd",
        base_lr=BASE_LR, lr_scaling=LR_SCALING, lr_decay="step", warmup_epochs=0.5,
        local_lr_workers=LOCAL_LR_WORKERS, validate=False, divergence_guard=False,
        **STREAMING[cell["streaming"]])


def job(cell: Mapping[str, Any]) -> Job:
    workers, hosts = HOSTS[cell["hosts"]]
    if not hosts:
        return Job(workers)
    sizes = tuple(len(host) for host in hosts)
    return Job(workers, len(hosts), sizes if len(set(sizes)) > 1 else ())


def planned_peak(plan: RunPlan, cell: Mapping[str, Any], rank: int) -> float:
    """The peak rate the plan gives `rank`: its host's, where hosts differ in size."""
    _, hosts = HOSTS[cell["hosts"]]
    if not plan.host_peak_lrs:
        return plan.peak_lr
    return plan.host_peak_lrs[next(i for i, host in enumerate(hosts) if rank in host)][1]


def plan_of(cell: Mapping[str, Any]) -> RunPlan:
    """The settled plan of a cell, as `hvdtrain train` settles it; ConfigError if refused."""
    return _settled(tuple(sorted(options(cell).items())), job(cell))


def _settled(given: tuple, shape: Job) -> RunPlan:
    # The options are typed already: `load_config`'s checks without its parsing of text.
    return settle(TrainConfig(**dict(given)).validate_values(), shape)


@functools.lru_cache(maxsize=None)
def _takes(given: tuple, shape: Job) -> bool:
    try:
        _settled(given, shape)
    except ConfigError:
        return False
    return True


def allowed(cell: Mapping[str, Any]) -> bool:
    """Whether the trainer takes the cell: its config's checks and the plan refuse none."""
    return _takes(tuple(sorted(options(cell).items())), job(cell))


def cells(strength: int = 2, including: tuple[Mapping[str, Any], ...] = ()) -> list[dict]:
    """The cells of a covering array of `strength` (2: every pair of values) that holds
    the cells `including` (first) and the seeds."""
    return covering_array(DIMENSIONS, allowed, strength, (*including, *SEEDS))


def cell_id(cell: Mapping[str, Any]) -> str:
    words = [cell["mode"], cell["hosts"], cell["period"], cell["compression"],
             f"f{cell['fragments']}", "rounds" if cell["epoch_rounds"] else "no-rounds",
             f"save-{cell['checkpoints']}", f"{cell['fits']}-fit",
             "reset" if cell["elastic_reset"] else "no-reset"]
    if cell["streaming"] != "off":
        words.append(f"streaming-{cell['streaming']}")
    return "-".join(words)


# --- one cell's run ---

@dataclass
class WorkerRecord:
    """What one worker did, as the checks read it."""
    rank: int
    peak_lr: float = 0.0       # its schedule's (`current_world`), at every (re)start
    initial_lr: float = 0.0
    n_sync: Any = None         # the period its LocalSGD was given
    whole_rounds: list[tuple[int, np.ndarray]] = field(default_factory=list)
    periods: list[tuple[int, int | None]] = field(default_factory=list)  # after each step
    rates: list[tuple[int, float]] = field(default_factory=list)         # each step's
    saves: list[tuple[int, np.ndarray]] = field(default_factory=list)    # rank 0's
    final: np.ndarray | None = None
    steps: int = 0
    resets: int = 0


@dataclass
class CellRun:
    cell: dict[str, Any]
    plan: RunPlan
    workers: list[WorkerRecord]
    epoch_ends: list[int]      # the step of each epoch's end
    run_steps: int


def _weights(model: keras.Model) -> np.ndarray:
    return np.concatenate([np.asarray(w.numpy()).ravel() for w in model.weights])


class Recorder(keras.callbacks.Callback):
    """After LocalSGD: each whole round's weights, each step's period and rate."""

    def __init__(self, local, progress: TrainingProgress, record: WorkerRecord):
        super().__init__()
        self.local, self.progress, self.record = local, progress, record
        self._rounds = 0  # rounds so far at the last agreement (or the fit's start)

    def _after_rounds(self) -> None:
        """The workers agree after rounds since they last did: a whole round (or an
        overlapped one that landed where no step followed it)."""
        if self.progress.in_consensus and self.local.rounds != self._rounds:
            self.record.whole_rounds.append((self.progress.steps, _weights(self.model)))
            self._rounds = self.local.rounds

    def on_train_begin(self, logs=None):
        self._rounds = self.local.rounds

    def on_train_batch_begin(self, batch, logs=None):
        rate = keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)
        self.record.rates.append((self.progress.steps + 1, float(rate)))

    def on_train_batch_end(self, batch, logs=None):
        self._after_rounds()
        self.record.periods.append((self.progress.steps, self.local.period))

    def on_epoch_end(self, epoch, logs=None):
        self._after_rounds()

    def on_train_end(self, logs=None):
        self._after_rounds()


class NotingStore:
    """Stands in for CheckpointStore: notes the step and the weights of each save."""

    def __init__(self, model: keras.Model, record: WorkerRecord):
        self.model, self.record = model, record

    def save(self, state, saved) -> None:
        self.record.saves.append((saved.progress.steps, _weights(self.model)))

    def newest(self):
        return None


class WorkerLost(RuntimeError):
    """Every worker's collective failed at once: a peer is gone (Horovod's internal error)."""


class FailOnce(keras.callbacks.Callback):
    """Fails every worker at their first agreement from step `after` on, after the
    checkpoint and before the elastic commit there, so the job rolls back to the commit
    before. At an agreement no overlapped round is in flight: every worker made the same
    collectives before it fails."""

    def __init__(self, progress: TrainingProgress, after: int, record: WorkerRecord):
        super().__init__()
        self.progress, self.after, self.record = progress, after, record

    def _maybe_fail(self) -> None:
        if not self.record.resets and self.progress.steps >= self.after \
                and self.progress.in_consensus:
            self.record.resets += 1
            raise WorkerLost(f"every worker lost a peer after step {self.progress.steps}")

    def on_train_batch_end(self, batch, logs=None):
        self._maybe_fail()

    def on_epoch_end(self, epoch, logs=None):
        self._maybe_fail()


class ThreadElasticState:
    """`comm.ElasticState` without Horovod: the variables and the progress a commit keeps
    in memory, each worker's own; `sync` gives every worker rank 0's."""

    def __init__(self, variables, progress: dict):
        self._variables = list(variables)
        self.progress = progress
        self.commit()

    def commit(self) -> None:
        self._saved = [tf.identity(v) for v in self._variables]
        self._saved_progress = dict(self.progress)

    def restore(self) -> None:
        for variable, value in zip(self._variables, self._saved):
            variable.assign(value)
        self.progress = dict(self._saved_progress)

    def sync(self) -> None:
        values = comm.broadcast([tf.convert_to_tensor(v) for v in self._variables],
                                name="elastic_sync")
        for variable, value in zip(self._variables, values):
            variable.assign(value)
        self.progress = comm.broadcast_object(self.progress, name="elastic_progress")
        self.commit()


def _model(cfg: TrainConfig, schedule) -> keras.Model:
    with _BUILDING:
        keras.utils.set_random_seed(cfg.seed)
        # BatchNorm's moving statistics are averaged apart from the weights (pooled, in
        # float32 beside coarse codes, by host first in the hierarchy): every cell has them.
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8),
                                  keras.layers.BatchNormalization(),
                                  keras.layers.Activation("relu"), keras.layers.Dense(2)])
    model.compile(make_optimizer(cfg, WarmupDecaySchedule.from_spec(schedule),
                                 averaging=cfg.hierarchical_sgd),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _stream(rank: int, workers: int, first_step: int) -> tf.data.Dataset:
    """This worker's shard of one learnable dataset, endless, from its `first_step`."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64 * workers, 5)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("int64")
    shard = tf.data.Dataset.from_tensor_slices((x[rank::workers], y[rank::workers]))
    return shard.repeat().skip(first_step * BATCH).batch(BATCH)


def _epoch_examples(cell: Mapping[str, Any]) -> int:
    global_batch = BATCH * job(cell).workers
    return EPOCH_STEPS * global_batch + (global_batch // 2 if cell["fits"] == "split" else 0)


def _work(cell: Mapping[str, Any], plan: RunPlan, rank: int) -> WorkerRecord:
    """One worker of the cell's job, as `hvdtrain.training.runner` trains it."""
    cfg = plan.config
    record = WorkerRecord(rank)
    progress = TrainingProgress(_epoch_examples(cell))
    world = current_world(cfg, progress)
    model = _model(cfg, world.schedule)
    saves = save_plan(cfg)
    local = state_callback(cfg, model, progress, saves)
    record.n_sync = local.n_sync
    checkpointer = Checkpointer(NotingStore(model, record), None, saves, progress, BATCH)
    callbacks = [CountProgress(progress, BATCH), local, Recorder(local, progress, record),
                 *([checkpointer] if comm.is_chief() else [])]

    def fit_to_the_end() -> None:
        nonlocal world
        world = current_world(cfg, progress)
        record.peak_lr, record.initial_lr = world.schedule.peak_lr, world.schedule.initial_lr
        for phase in fit_phases(progress.examples, progress.epoch_examples, cfg.epochs,
                                world.global_batch):
            stream = _stream(rank, world.workers, progress.examples // world.global_batch)
            try:
                model.fit(stream, initial_epoch=phase.first_epoch, epochs=phase.end_epoch,
                          steps_per_epoch=phase.steps, callbacks=callbacks, verbose=0,
                          shuffle=False)
            finally:
                local.abandon_rounds()  # a fit that raised gets no on_train_end

    if cfg.elastic:
        _fit_elastically(cfg, model, local, progress, saves, callbacks, record,
                         fit_to_the_end)
    else:
        fit_to_the_end()
    record.final, record.steps = _weights(model), progress.steps
    return record


def _fit_elastically(cfg, model, local, progress, saves, callbacks, record, fit) -> None:
    """Horovod's elastic loop (`horovod.common.elastic.run_fn`) around the trainer's
    `fit_with_current_workers`: sync, fit; on a failure every worker restores its last
    commit, the workers start a new world, and sync again."""
    state = ThreadElasticState(elastic_variables(model, local), progress.saved())
    callbacks += [FailOnce(progress, FAIL_AFTER, record),
                  ElasticCommit(state, saves, progress)]
    while True:
        state.sync()
        progress.restore(state.progress)
        progress.consensus_step = progress.steps
        use_world(model, current_world(cfg, progress))
        try:
            fit()
            return
        except WorkerLost:
            state.restore()
            this_worker().world_id += 1


def _no_graphs_ahead():
    """Threaded workers run functions eagerly (threaded_comm): the round graphs hvdtrain
    traces ahead (at a fit's start, at the first overlapped round) would never run, and
    tracing them took most of a cell's time. Other functions trace as they would."""
    function = type(tf.function(lambda: None))
    trace = function.get_concrete_function

    def unless_hvdtrains(self, *args, **kwargs):
        if getattr(self.python_function, "__module__", "").startswith("hvdtrain."):
            return None  # its callers build the graph ahead only, and drop it
        return trace(self, *args, **kwargs)
    return mock.patch.object(function, "get_concrete_function", unless_hvdtrains)


def run_cell(cell: Mapping[str, Any], wait: float = WAIT_SECONDS) -> CellRun:
    """The cell's job, every worker in a thread; CollectiveHung if a collective waits
    `wait` seconds for its peers."""
    plan = plan_of(cell)
    workers, hosts = HOSTS[cell["hosts"]]
    with _no_graphs_ahead():
        records = run_workers(workers, functools.partial(_work, cell, plan), hosts=hosts,
                              wait=wait)
    global_batch = BATCH * workers
    ends, steps = [], 0
    for phase in fit_phases(0, _epoch_examples(cell), EPOCHS, global_batch):
        for _ in range(phase.first_epoch, phase.end_epoch):
            steps += phase.steps
            ends.append(steps)
    return CellRun(dict(cell), plan, records, ends, steps)


# --- what must hold ---

def problems(run: CellRun) -> list[str]:
    """Every invariant the run broke, one line each (none: the cell holds)."""
    found = []
    for check in (_ended, _equal_after_whole_rounds, _checkpoints_due_written,
                  _plans_period_followed, _plans_rates_used, _reset_happened):
        found += check(run)
    return found


def _ended(run: CellRun) -> list[str]:
    return [f"rank {w.rank} ended at step {w.steps}, the run has {run.run_steps}"
            for w in run.workers if w.steps != run.run_steps]


def _equal_after_whole_rounds(run: CellRun) -> list[str]:
    found = []
    first = run.workers[0]
    if not first.whole_rounds or first.whole_rounds[-1][0] != run.run_steps:
        found.append(f"rank 0's last whole round is not at the run's end (step "
                     f"{run.run_steps}): whole rounds at {[s for s, _ in first.whole_rounds]}")
    for other in run.workers[1:]:
        steps = [s for s, _ in other.whole_rounds]
        if steps != [s for s, _ in first.whole_rounds]:
            found.append(f"whole rounds at steps {[s for s, _ in first.whole_rounds]} on rank 0, "
                         f"{steps} on rank {other.rank}")
            continue
        for (step, mine), (_, theirs) in zip(first.whole_rounds, other.whole_rounds):
            if not np.array_equal(mine, theirs):
                found.append(f"after the whole round at step {step}, rank {other.rank}'s "
                             f"weights differ from rank 0's by up to "
                             f"{np.max(np.abs(mine - theirs)):.3g}")
                break
        if not np.array_equal(first.final, other.final):
            found.append(f"at the run's end rank {other.rank}'s weights differ from rank 0's")
    return found


def due_checkpoints(run: CellRun) -> list[int]:
    """The steps at which a checkpoint falls due (the trainer's SavePlan)."""
    saves = save_plan(run.plan.config)
    if saves.checkpoint_steps:
        return list(range(saves.checkpoint_steps, run.run_steps + 1, saves.checkpoint_steps))
    return [step for epoch, step in enumerate(run.epoch_ends, 1)
            if saves.checkpoints_at_epoch_end(epoch)]


def _checkpoints_due_written(run: CellRun) -> list[str]:
    chief = run.workers[0]
    period_at = dict(chief.periods)  # a step retrained after a reset: its last period
    written = [step for step, _ in chief.saves]
    found = []
    for due in due_checkpoints(run):
        period = period_at.get(due) or 0
        if not any(due <= step <= due + period for step in written):
            found.append(f"the checkpoint due at step {due} was not written within its period "
                         f"({period}): checkpoints at steps {written}")
    agreed = {}
    for step, weights in chief.whole_rounds:
        agreed.setdefault(step, []).append(weights)
    for step, weights in chief.saves:
        if not any(np.array_equal(weights, w) for w in agreed.get(step, [])):
            found.append(f"the checkpoint at step {step} holds no model the workers agreed on "
                         f"(whole rounds at {sorted(agreed)})")
    return found


def _plans_period_followed(run: CellRun) -> list[str]:
    found = []
    planned = run.plan.period
    for w in run.workers:
        if str(w.n_sync) != str(planned):
            found.append(f"rank {w.rank}'s rounds were given n_sync={w.n_sync!r}, the plan "
                         f"{planned!r}")
        if isinstance(planned, int):
            other = sorted({p for _, p in w.periods if p != planned}, key=str)
            if other:
                found.append(f"rank {w.rank} held rounds every {other} steps, the plan every "
                             f"{planned}")
    first = run.workers[0].periods
    for w in run.workers[1:]:
        parted = next((i for i, (a, b) in enumerate(zip(first, w.periods)) if a != b), None)
        if parted is not None:
            (step, mine), (_, theirs) = first[parted], w.periods[parted]
            found.append(f"rank {w.rank}'s period parts from rank 0's after step {step}: "
                         f"{theirs} against {mine}")
        elif len(w.periods) != len(first):
            found.append(f"rank {w.rank} took {len(w.periods)} steps, rank 0 {len(first)}")
    return found


def _plans_rates_used(run: CellRun) -> list[str]:
    found = []
    for w in run.workers:
        peak = planned_peak(run.plan, run.cell, w.rank)
        for name, planned, used in (("peak", peak, w.peak_lr),
                                    ("initial", run.plan.initial_lr, w.initial_lr)):
            if not np.isclose(used, planned, rtol=1e-6, atol=0):
                found.append(f"rank {w.rank} trained at a {name} rate of {used:.6g}, the plan "
                             f"says {planned:.6g}")
        highest = max(rate for _, rate in w.rates)
        if not np.isclose(highest, peak, rtol=1e-6, atol=0):
            found.append(f"rank {w.rank}'s steps peaked at a rate of {highest:.6g}, the plan's "
                         f"peak is {peak:.6g}")
    return found


def _reset_happened(run: CellRun) -> list[str]:
    wanted = run.cell["elastic_reset"]
    return [f"rank {w.rank} went through {w.resets} elastic resets, the cell asks {wanted}"
            for w in run.workers if w.resets != wanted]
