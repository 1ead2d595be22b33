"""`hvdtrain bench`: training throughput on synthetic data held in memory.

The driver (no horovodrun around it) starts one job per worker count, each running
`python -m hvdtrain.benchmarks.throughput SPECS RESULTS`; inside a job every setup
(mode, n_sync) is trained in turn through the same code path as `hvdtrain train`,
with a StepTimer as the last callback. Run under horovodrun yourself and it
measures that one job instead.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from typing import Callable

import keras
import tensorflow as tf

from hvdtrain import comm
from hvdtrain.buckets import gradient_buckets, parse_bucket_spec
from hvdtrain.benchmarks.round_form import RoundForm
from hvdtrain.benchmarks.scaling import (combine_repeats, communication_share, exchanges_in,
                                         rounded_steps, worker_throughput)
from hvdtrain.benchmarks.timing import SlowerSteps, StepTimer, all_workers, seconds_per_call
from hvdtrain.config import (DEFAULT_BUCKET_MB, LOCAL_MODES, load_config, parse_shape,
                             rounds_compression)
from hvdtrain.errors import ConfigError
from hvdtrain.keras.fragmented_rounds import FragmentedAverager
from hvdtrain.keras.gradient_averaging import has_gradient_averaging
from hvdtrain.keras.state import variable_bytes
from hvdtrain.optimizer_choice import BENCH_OPTIMIZER
from hvdtrain.plan import Job, settle
from hvdtrain.rounds.periods import TRAINS_DEFAULT
from hvdtrain.training.start import StartedWorker, start_worker

DATASET_OF = {"device": "synthetic-device", "host": "synthetic"}


@dataclass(frozen=True)
class Setup:
    """One thing to measure; every worker of the job measures it together."""

    model: str
    batch_size: int        # per worker
    shape: str             # HxWxC
    mode: str              # one of MODES
    # Local mode only: steps; TRAINS_DEFAULT, the job's settled period; or a rule (qsr...).
    n_sync: int | str | None
    steps: int             # timed steps (rounded up to whole n_sync periods in local mode)
    warmup_steps: int
    window: int
    seed: int = 42
    xla: bool = False
    mixed_precision: bool = False
    fp16_allreduce: bool = False
    bucket_mb: str = DEFAULT_BUCKET_MB  # sync mode's gradient groups (hvdtrain.buckets)
    data: str = "device"   # one batch kept on the worker's device, or "host": a tf.data pipeline
    slow_rank: int | None = None  # this worker's steps run slow_factor times slower
    slow_factor: float = 1.0
    sync_seconds: float | None = None  # local modes: rounds every T seconds, not n_sync steps
    hierarchical: bool = False  # local modes: gradients averaged every step inside a host
    round_fragments: int = 1  # local modes: a round averages one of this many fragments
    # Local modes: how a round travels (ROUND_COMPRESSIONS); None: the mode's default as
    # `hvdtrain train` resolves it, made concrete by `as_planned` before it is measured.
    round_compression: str | None = None
    optimizer: str = BENCH_OPTIMIZER  # the inner optimizer (the horovod reference's is SGD)

    @property
    def period(self) -> int | None:
        """Steps between rounds where they are fixed (whole periods are timed); None in
        sync mode, or where a rule or the clock sets when rounds come."""
        fixed = self.mode in LOCAL_MODES and self.sync_seconds is None
        return self.n_sync if fixed and isinstance(self.n_sync, int) else None

    @property
    def form(self) -> RoundForm:
        return RoundForm(self.round_fragments, self.round_compression)

    @property
    def label(self) -> str:
        if self.sync_seconds is not None:
            return f"{self.mode}, every {self.sync_seconds:g} s{self.form.suffix}"
        if self.mode == "sync" and self.bucket_mb != DEFAULT_BUCKET_MB:
            return f"sync, buckets {self.bucket_mb}"
        mode = f"hierarchical {self.mode}" if self.hierarchical else self.mode
        if self.mode not in LOCAL_MODES:
            return mode
        return f"{mode}, n_sync {self.n_sync}{self.form.suffix}"


def train_config(setup: Setup, total_steps: int, out: str, pin_cores: bool):
    mode = setup.mode if setup.mode in ("sync", "async") else "local"
    # Independent workers: local SGD whose first round would come after the last step.
    n_sync = (setup.n_sync or 1) if setup.mode in LOCAL_MODES else total_steps + 1
    if n_sync == TRAINS_DEFAULT:
        n_sync = None  # left to the config's default for the mode and optimizer
    local = dict(n_sync=n_sync, sync_seconds=setup.sync_seconds,
                 round_compression=setup.round_compression,
                 round_fragments=setup.round_fragments) if mode in LOCAL_MODES else {}
    return load_config(None, dict(
        model=setup.model, dataset=DATASET_OF[setup.data], synthetic_shape=setup.shape,
        batch_size=setup.batch_size, epochs=1, steps_per_epoch=total_steps, seed=setup.seed,
        mode=mode, optimizer=setup.optimizer, **local,
        # Random labels: a small constant rate keeps every model finite.
        base_lr=0.001, warmup_epochs=0.0, lr_decay="constant", validate=False,
        checkpoint_every="1000epochs", xla=setup.xla, mixed_precision=setup.mixed_precision,
        fp16_allreduce=setup.fp16_allreduce, bucket_mb=setup.bucket_mb,
        hierarchical_sgd=setup.hierarchical, pin_cores=pin_cores, out=out))


def as_planned(setup: Setup, workers: int) -> Setup:
    """`setup` as a job of `workers` trains it: the optimizer and round compression of its
    run's settled plan (`hvdtrain.plan.settle`, as the runner trains by it), so that its
    row and label say what was timed. A compression left to the mode comes from the config
    (int8 in local mode, int4 for rescaled rounds); --fp16-allreduce's uncompressed rounds
    are fp16 rounds. The plain-Horovod reference trains SGD as it is (`plain_horovod`)."""
    if setup.mode == "horovod":
        return replace(setup, round_compression="none")
    setup = _with_settled_period(setup, workers)
    steps = setup.warmup_steps + rounded_steps(setup.steps, setup.period)
    cfg = settle(train_config(setup, steps, "", False), Job(workers)).config
    compression = (rounds_compression(cfg.round_compression, cfg.fp16_allreduce)
                   if setup.mode in LOCAL_MODES else setup.round_compression or "none")
    return replace(setup, optimizer=cfg.optimizer, round_compression=compression)


def _with_settled_period(setup: Setup, workers: int) -> Setup:
    """A `--n-sync default` setup at the period `hvdtrain train` settles for this job:
    steps, or a rule (qsr, auto, link), whose rounds the run's own count gives."""
    if setup.n_sync != TRAINS_DEFAULT:
        return setup
    return replace(setup, n_sync=settle(train_config(setup, 1, "", False), Job(workers)).period)


def _gradient_exchange(model: keras.Model, fp16: bool):
    """One step's gradient averaging, on stand-in gradients: hvdtrain's own (its groups
    included); for the plain-Horovod reference (one allreduce per gradient, which
    Horovod's tensor fusion packs together), one grouped allreduce of them all."""
    optimizer = model.optimizer
    grads = [tf.identity(tf.convert_to_tensor(v)) for v in model.trainable_variables]
    if has_gradient_averaging(optimizer):
        return tf.function(lambda: optimizer.average_gradients(grads))
    return tf.function(lambda: comm.average(grads, name="bench_gradients", fp16=fp16))


def measure(setup: Setup, pin_cores: bool = False) -> dict:
    """Train `setup` on every worker of this job (started by `start_job` with the same
    `pin_cores`); the row of results, on every worker, naming the optimizer and round
    compression it trained with (`as_planned`)."""
    from hvdtrain.training.runner import train

    keras.backend.clear_session()
    setup = as_planned(setup, comm.size())
    steps = rounded_steps(setup.steps, setup.period)
    total_steps = setup.warmup_steps + steps
    timer = StepTimer(setup.warmup_steps)
    if setup.slow_rank is not None and setup.slow_rank >= comm.size():
        raise ConfigError(f"--slow-rank {setup.slow_rank}:{setup.slow_factor:g} names a rank "
                          f"this {comm.size()}-worker job does not have")
    callbacks = [timer] if setup.slow_rank is None else [
        SlowerSteps(setup.slow_rank, setup.slow_factor), timer]
    scratch = tempfile.mkdtemp(prefix="hvdtrain-bench-")
    try:
        if setup.mode == "horovod":
            from hvdtrain.benchmarks import plain_horovod

            model = plain_horovod.train(setup.model, parse_shape(setup.shape), setup.batch_size,
                                        total_steps, setup.seed, callbacks=callbacks,
                                        on_device=setup.data == "device")
            summary, averager = {}, None
        else:
            cfg = train_config(setup, total_steps, os.path.join(scratch, "run"), pin_cores)
            result = train(cfg, verbose=0, extra_callbacks=tuple(callbacks))
            model, summary, averager = result.model, result.summary, result.state_averager
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    workers = comm.size()
    step_seconds = all_workers(timer.step_seconds)
    if min(map(len, step_seconds)) == 0:
        raise ConfigError(f"{setup.label}: a worker took no steps after the --warmup-steps "
                          f"({setup.warmup_steps}); give --steps more (now {setup.steps})")
    rates = worker_throughput(step_seconds, setup.window, setup.batch_size)
    exchanges, exchange_steps, steps = _exchange_counts(setup, summary, step_seconds, steps)
    gradient_bytes = variable_bytes(model.trainable_variables, setup.fp16_allreduce)
    groups = _gradient_groups(model.trainable_variables, setup)
    if setup.mode in LOCAL_MODES:
        exchange_bytes, largest, exchange = _round_exchange(averager)
    else:
        exchange_bytes = largest = gradient_bytes
        exchange = _gradient_exchange(model, setup.fp16_allreduce)
    seconds = seconds_per_call(exchange) if exchanges else 0.0
    return {
        **{k: v for k, v in asdict(setup).items() if k not in ("batch_size", "steps")},
        "label": setup.label,
        "workers": workers,
        "batch_per_worker": setup.batch_size,
        "timed_steps": steps,
        # Each worker's own timed steps, in rank order: equal in lockstep modes, each at
        # its own pace between timed rounds.
        "worker_timed_steps": [len(seconds) for seconds in step_seconds],
        "parameters": int(model.count_params()),
        **rates,
        "exchanges_timed": exchanges,
        "seconds_per_exchange": seconds,
        "communication_share": communication_share(seconds, exchanges, exchange_steps,
                                                   rates["step_seconds"]),
        # Across hosts in a hierarchical row: its rounds. Its gradients, averaged every step
        # among a host's workers, stay inside the host.
        "bytes_per_step": exchanges * exchange_bytes / exchange_steps,
        # What one exchange (a round, a step's gradients) sends: on average, and at most.
        "bytes_per_round": exchange_bytes,
        "largest_burst_bytes": largest,
        "bytes_within_host_per_step": _within_host_bytes(setup, summary, gradient_bytes),
        "hosts": summary.get("hosts"),  # a hierarchical run's host groups
        # Its rounds cut in this many host shards: `bytes_per_round` is then one shard's.
        "host_shards": averager.host_shards if averager is not None else 1,
        "gradient_group_bytes": groups,
        # The workers' mean share of the timed steps spent in rounds: what they waited.
        "round_share": sum(row[0] for row in all_workers([timer.round_share])) / workers,
    }


def _round_exchange(averager) -> tuple[float, int, Callable[[], float]]:
    """A period's round of the run's own averager, so a round is sized and timed with what
    the run's rounds carried (the optimizer slots, statistics, compression of its resolved
    config): its bytes on average, its largest bytes, and the round to time. A fragmented
    round sends its fragments in turn, 1/F of the state on average; the largest
    fragment's round is the one timed."""
    if not isinstance(averager, FragmentedAverager):
        return averager.payload_bytes, averager.payload_bytes, averager.average
    largest = averager.largest_part
    return averager.payload_bytes / averager.count, largest.payload_bytes, largest.average


def _within_host_bytes(setup: Setup, summary: dict, gradient_bytes: int) -> int:
    """A hierarchical row's gradients per step, averaged among its host's workers (none
    on a host of one worker, or in a flat row)."""
    if not setup.hierarchical or summary.get("workers_per_host", 1) < 2:
        return 0
    return gradient_bytes


def _gradient_groups(variables, setup: Setup) -> list[int] | None:
    """Bytes of each group sync mode's gradients travel in, in the order they are sent
    (the last leaves when back-propagation ends; `hvdtrain predict` needs it). None for
    plain Horovod, whose tensor fusion groups by time, not by size."""
    if setup.mode == "horovod":
        return None
    # Grouped by their size in the step, sent at their size on the wire (fp16 halves it).
    sizes = [variable_bytes([v]) for v in variables]
    wire = [variable_bytes([v], setup.fp16_allreduce) for v in variables]
    return [sum(wire[i] for i in group)
            for group in gradient_buckets(sizes, parse_bucket_spec(setup.bucket_mb).cap_bytes(sizes))]


def _exchange_counts(setup: Setup, summary: dict, step_seconds: list[list[float]],
                     steps: int) -> tuple[int, float, int]:
    """(exchanges, the steps they are spread over, timed steps) of one measurement."""
    workers = len(step_seconds)
    if setup.mode not in LOCAL_MODES or setup.period is not None:
        exchanges = exchanges_in(setup.mode, setup.warmup_steps + 1, steps, setup.period,
                                 workers)
        return exchanges, steps, steps
    # Rounds came by the clock or a rule (the workers' step counts may differ): the run's
    # rounds, over each worker's mean steps in the run; the timed steps are each worker's
    # own, averaged.
    exchanges = summary["averaging_rounds"] if workers > 1 else 0
    return (exchanges, sum(summary["steps_per_worker"]) / workers,
            round(sum(map(len, step_seconds)) / workers))


def machine() -> dict:
    """What the numbers were measured on."""
    import horovod

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            cpu = next((line.split(":", 1)[1].strip() for line in fh
                        if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"host": platform.node(), "cpu": cpu, "cpus": os.cpu_count(),
            "gpus": len(tf.config.list_physical_devices("GPU")),
            "python": platform.python_version(), "tensorflow": tf.__version__,
            "horovod": horovod.__version__}


def start_job(setups: list[Setup], pin_cores: bool = False) -> StartedWorker:
    """This worker, started (`start_worker`) for a job measuring `setups`: once, with the
    host groups if any setup is hierarchical (they need Horovod started with them)."""
    hierarchical = dict(mode="local", hierarchical_sgd=True) if any(
        setup.hierarchical for setup in setups) else {}
    return start_worker(load_config(None, dict(hierarchical, pin_cores=pin_cores)))


def run_setups(setups: list[Setup], repeats: int = 1,
               pin_cores: bool = False) -> tuple[list[dict], dict]:
    """Measure each setup `repeats` times in this job, taking turns so that a slow spell
    of the machine hits every setup alike; (rows, machine) on every worker. `pin_cores`
    gives each worker its own share of the machine's cores (`hvdtrain.machine.cpu_cores`)."""
    started = start_job(setups, pin_cores)
    measured: list[list[dict]] = [[] for _ in setups]
    for repeat in range(repeats):
        for setup, rows in zip(setups, measured):
            row = measure(setup, pin_cores)
            rows.append(row)
            if comm.is_chief():
                print(f"hvdtrain: {setup.model} {row['label']}, {row['workers']} worker(s), "
                      f"repeat {repeat + 1}/{repeats}: {row['total_images_per_sec']:.1f} ± "
                      f"{row['total_ci95']:.1f} images/sec (by rank: "
                      f"{' / '.join(f'{r:.1f}' for r in row['worker_images_per_sec'])})",
                      flush=True)
    return [combine_repeats(rows) for rows in measured], dict(machine(), cores_per_worker=(
        started.cores if started.pinned else None))


def main(argv: list[str]) -> int:
    """Job entry point: `python -m hvdtrain.benchmarks.throughput PLAN.json RESULTS.json`,
    the plan holding {"setups": [...], "repeats": R, "pin_cores": bool}."""
    plan_path, results_path = argv
    with open(plan_path, encoding="utf-8") as fh:
        plan = json.load(fh)
    rows, host = run_setups([Setup(**s) for s in plan["setups"]], plan["repeats"],
                            plan.get("pin_cores", False))
    if comm.is_chief():
        with open(results_path, "w", encoding="utf-8") as fh:
            json.dump({"rows": rows, "machine": host}, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
