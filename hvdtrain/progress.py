"""Where a training run stands, counted in examples so it survives a change of workers.

A step means a different amount of data when the number of workers changes (an
elastic job that shrinks, a checkpoint resumed with another `-np`), so progress is
kept in examples seen by all workers together, and the epoch, the steps left in
it and the learning-rate schedule's position are derived from that count.

An epoch ends at the first step at which the examples reach a multiple of the epoch
length, so a run of E epochs trains on E × epoch length examples plus less than one
global batch. Pure Python: the Keras callbacks in `hvdtrain.training.callbacks` and
`hvdtrain.keras.local_sgd` advance and read the one `TrainingProgress` of a run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class TrainingProgress:
    """The counts of one run; one object, shared by every callback that needs them.

    - `examples`: training examples consumed by all workers together.
    - `steps`: steps this worker has completed, the same on every worker while they are in
      step. This object owns the count: only `advance`, `restore` and `take_job_step` write
      it, and the optimizer's `iterations` follows it (`keras.state.set_optimizer_step`),
      never the other way round. A mixed-precision optimizer leaves `iterations` behind on
      every step whose gradients overflow, and in local mode each worker overflows on its
      own data: a count read back from it would differ between workers, and their rounds
      would stop meeting.
    - `averaging_rounds`: local SGD rounds that averaged the workers' state.
    - `state_bytes`: bytes this worker handed to allreduce in state-averaging rounds
      (local SGD rounds, sync mode's BatchNorm averaging); a round with one worker
      sends nothing and adds nothing.
    - `broadcast_bytes`: bytes this worker handed to broadcasts of rank 0's whole state
      (at the start of a run, and after an elastic reset).
    - `consensus_step`: the step after which all workers last held the same state, or
      None when they always do (synchronous training).
    - `round_seconds`: wall time this worker's training thread spent in averaging rounds
      in this process: blocking rounds whole; overlapped ones taking their snapshot and
      waiting for the round in flight. Not kept by checkpoints: it times this process.
    - `eval_seconds`: wall time spent evaluating within training (Keras's validation after
      each epoch, `--eval-every`'s evaluations within epochs), so time to accuracy can
      leave it out; every process's of the run (kept by checkpoints and commits).
    - `train_seconds`: wall time the run has trained, evaluations left out, every process's
      (kept by checkpoints and commits): the count as of the last `start_clock` or
      `restore`; `trained_seconds(now)` adds this process's time since. A run that
      stopped and resumed counts what it trained before the stop, not the time between.
    - `own_steps`, `own_examples`: what this worker alone trained in this process.
    - `workers_in_step`: every worker takes the same steps, so the others' examples are
      known as they happen. Rounds every T seconds (`hvdtrain.rounds.timed`) clear it:
      `examples` is then what the last round reported plus this worker's own since, and
      `worker_steps` each worker's `own_steps` as that round reported them.
    """

    epoch_examples: int = 0   # 0: not known (a Keras layer used on its own)
    examples: int = 0
    steps: int = 0
    averaging_rounds: int = 0
    state_bytes: int = 0
    broadcast_bytes: int = 0
    consensus_step: int | None = None
    round_seconds: float = 0.0
    eval_seconds: float = 0.0
    own_steps: int = 0
    own_examples: int = 0
    workers_in_step: bool = True
    worker_steps: tuple[int, ...] = ()
    train_seconds: float = 0.0
    # Where this process's clock started (`time.time()`) and `eval_seconds` then.
    clock_start: float | None = None
    clock_eval: float = 0.0

    def advance(self, steps: int, batch_size: int = 0, workers: int = 1) -> None:
        """`steps` more of this worker, each of `batch_size` examples per worker."""
        self.steps += steps
        self.own_steps += steps
        self.own_examples += steps * batch_size
        self.examples += steps * batch_size * (workers if self.workers_in_step else 1)

    def restore(self, saved: dict[str, int]) -> None:
        """Take the counts a checkpoint or an elastic commit kept (`saved`'s keys); the
        seconds go on from them now (a commit's: the time since it is trained again)."""
        for name, value in saved.items():
            if name not in SAVED_COUNTS:
                raise ValueError(f"not a saved count of TrainingProgress: {name!r}")
            setattr(self, name, value)
        if "train_seconds" in saved and self.clock_start is not None:
            self.start_clock(time.time())

    def start_clock(self, now: float) -> None:
        """Count this process's training seconds from `now` on top of `train_seconds`."""
        self.clock_start, self.clock_eval = now, self.eval_seconds

    def trained_seconds(self, now: float | None = None) -> float:
        """The run's training seconds at `now` (default: this moment): every earlier
        process's, and this one's since its clock started, evaluations left out."""
        if self.clock_start is None:
            return self.train_seconds
        now = time.time() if now is None else now
        return self.train_seconds + (now - self.clock_start) - \
            (self.eval_seconds - self.clock_eval)

    def take_job_step(self, step: int) -> None:
        """After a round every T seconds: the job's step, learnt from the round's reports,
        replaces this worker's count, so the schedule follows the job, not this worker's
        speed."""
        self.steps = step

    def steps_by_worker(self, workers: int) -> list[int]:
        """Steps each worker took in this process (as of the last round, out of step)."""
        return list(self.worker_steps) if self.worker_steps else [self.own_steps] * workers

    @property
    def epoch(self) -> int:
        """Epochs completed."""
        return self.examples // self.epoch_examples

    @property
    def in_consensus(self) -> bool:
        """True when every worker holds the same model state (right after a round)."""
        return self.consensus_step is None or self.consensus_step == self.steps

    def saved(self, now: float | None = None) -> dict[str, int | float]:
        """What a checkpoint or an elastic commit keeps (consensus is implied there), the
        seconds as of `now` (default: this moment)."""
        counts = {name: getattr(self, name) for name in SAVED_COUNTS}
        return dict(counts, train_seconds=self.trained_seconds(now))


# The counts a checkpoint or an elastic commit keeps; the rest time or describe one process.
SAVED_COUNTS = ("epoch_examples", "examples", "steps", "averaging_rounds", "state_bytes",
                "broadcast_bytes", "eval_seconds", "train_seconds")


def epoch_length(num_train: int | None, steps_cap: int | None, global_batch: int) -> int:
    """Examples in one epoch: the training set, or fewer when `--steps-per-epoch` caps it.

    A cap is in steps of the workers the run starts with; the run keeps the length in
    examples it gave, whatever the workers later. Endless data (None) needs a cap.
    """
    if steps_cap is None:
        if num_train is None:
            raise ValueError("endless data needs a steps cap to define an epoch")
        return num_train
    capped = steps_cap * global_batch
    return capped if num_train is None else min(num_train, capped)


def run_steps(epoch_examples: int, epochs: int, global_batch: int) -> int:
    """Whole steps of `global_batch` in `epochs` epochs of `epoch_examples` examples: a
    new run's length at this job's size, which a warm start must leave room in."""
    return epochs * epoch_examples // global_batch


def steps_to_epoch_end(examples: int, epoch_examples: int, global_batch: int) -> int:
    """Steps of `global_batch` from `examples` to the end of the epoch they are in."""
    epoch_end = (examples // epoch_examples + 1) * epoch_examples
    return -(-(epoch_end - examples) // global_batch)


@dataclass(frozen=True)
class FitPhase:
    """One `model.fit` call: epochs [first_epoch, end_epoch) of `steps` steps each (None:
    until a callback stops it)."""

    first_epoch: int
    end_epoch: int
    steps: int | None


def fit_phases(examples: int, epoch_examples: int, epochs: int,
               global_batch: int) -> list[FitPhase]:
    """How to train from `examples` to the end of epoch `epochs` with this global batch.

    Keras gives every epoch of one `fit` the same number of steps; epochs whose
    lengths in steps differ (the length in examples is not a multiple of the global
    batch, or the run resumes mid-epoch) go into separate calls.
    """
    phases: list[FitPhase] = []
    for epoch in range(examples // epoch_examples, epochs):
        steps = steps_to_epoch_end(examples, epoch_examples, global_batch)
        examples += steps * global_batch
        if phases and phases[-1].steps == steps:
            phases[-1] = FitPhase(phases[-1].first_epoch, epoch + 1, steps)
        else:
            phases.append(FitPhase(epoch, epoch + 1, steps))
    return phases


def executed_steps(begin_step: int, end_step: int) -> int:
    """Steps one Keras batch callback covers: several with `steps_per_execution` > 1.

    Keras 3 calls `on_train_batch_begin(begin)` and `on_train_batch_end(end)` once per
    execution, with the first and last step index of it.
    """
    return end_step - begin_step + 1
