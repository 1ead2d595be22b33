"""When is a network slow? Which side of the measured rule a job across hosts is on.

The rule: the network binds when sync mode spends `SLOW_NETWORK_SHARE` of its step or more
communicating, i.e. runs below that fraction of independent workers' images/sec
(`hvdtrain bench --modes sync,independent` measures both). There, on 4 emulated hosts at
10 Mbit/s, sync ran at 0.19x independent workers and local mode reached sync's accuracy
less a point in a third of sync's time; at 100 Mbit/s sync ran at 0.81x and local mode's
time was level within its interval (BENCHMARKS.md, "Time to accuracy where the network
binds"). Between the two the threshold is a judgement, not a measurement.

`hvdtrain plan --hosts H --link-rate RATE` says which side a job is on from an estimate of
sync's share: the cost model's ring allreduce (`costmodel.predict`) of the model's
gradients over one link a host, beside a step's compute measured by `hvdtrain bench` on
this project's 2-core CPU machines (`MEASURED_STEPS`). The plan cannot time the job's own
machines, so the note names the figure it used; a model with no measured step gets the
rule and the command that measures it. The model overlaps no gradient with
back-propagation, as sync's gradient groups do, so its share is an upper bound. Pure
Python: no TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass

from hvdtrain.benchmarks.costmodel import Link, Workload, predict
from hvdtrain.cluster.links import parse_rate
from hvdtrain.config import TrainConfig
from hvdtrain.errors import ConfigError
from hvdtrain.rounds.payload import VALUE_BYTES

# Sync's share of a step spent communicating from which the network binds: sync then runs
# below this fraction of independent workers' images/sec. Docs cite it by name.
SLOW_NETWORK_SHARE = 0.5


@dataclass(frozen=True)
class MeasuredStep:
    """One worker's step without communication, as `hvdtrain bench` timed it."""

    parameters: int       # the model's trainable values at `shape`, 10 classes
    shape: str
    batch: int
    seconds: float
    where: str            # the machine and the raw file


MEASURED_STEPS = {
    # Independent workers' step, 4 workers on a 2-core AMD EPYC, TensorFlow 2.21: the bench
    # of the 10 Mbit/s time-to-accuracy runs.
    "resnet20": MeasuredStep(
        271_098, "32x32x3", 64, 0.308,
        "4 workers sharing a 2-core CPU machine, docs/benchmarks/time-to-accuracy/"
        "resnet20-4-hosts/bench-10mbit.json"),
    # 2 workers on 2 cores, TensorFlow 2.15 (the only LeNet-5 bench with independent rows).
    "lenet": MeasuredStep(
        61_706, "28x28x1", 64, 0.0126,
        "2 workers on a 2-core CPU machine, docs/benchmarks/history/throughput-tf2.15/"
        "bench-lenet.csv"),
}


def sync_communication_share(cfg: TrainConfig, workers: int, hosts: int,
                             rate_bits: float) -> float | None:
    """Sync's estimated share of a step spent communicating for this job over links of
    `rate_bits` (one a host, shared by its workers), or None with no measured step of
    `cfg.model`. The step's compute scales with the batch from the measured one."""
    step = MEASURED_STEPS.get(cfg.model)
    if step is None:
        return None
    gradient_bytes = step.parameters * VALUE_BYTES["fp16" if cfg.fp16_allreduce else "none"]
    work = Workload(compute_seconds=step.seconds * cfg.batch_size / step.batch,
                    gradient_bytes=gradient_bytes, state_bytes=gradient_bytes,
                    batch_per_worker=cfg.batch_size)
    link = Link(rate_bits, workers_per_link=max(1, workers // hosts))
    return predict(work, "sync", workers, link).communication_share


# Where the estimate met a measurement (BENCHMARKS.md, "Time to accuracy where the network
# binds"): ResNet-20 at a batch of 64 on 4 hosts at 100 Mbit/s, where the bench ran sync at
# 0.81x independent workers' images/sec.
CHECKED_AT = dict(model="resnet20", batch_size=64, hosts=4, link_rate="100mbit",
                  measured_ratio=0.81)
MEASURE = (f"`hvdtrain bench --modes sync,independent` measures it: sync below "
           f"{SLOW_NETWORK_SHARE:g}x independent workers' images/sec")
GAIN = ("local mode reached sync's accuracy less a point in a third of sync's time on "
        "emulated hosts")


def _checked() -> str:
    """The estimate beside the measurement it was checked against, in words."""
    at = CHECKED_AT
    share = sync_communication_share(
        TrainConfig(model=at["model"], batch_size=at["batch_size"]), at["hosts"], at["hosts"],
        parse_rate(at["link_rate"]))
    return (f"for {at['model']} on {at['hosts']} hosts at {at['link_rate']} it estimates "
            f"{share:.0%}, where sync ran at {at['measured_ratio']:g}x independent workers' "
            f"images/sec")


def network_note(cfg: TrainConfig, workers: int, hosts: int, link_rate: str) -> str:
    """The plan's note for a job of `workers` on `hosts` hosts linked at `link_rate` (tc's
    units): which side of the slow-network rule it is on, and from what estimate."""
    if hosts < 2:
        raise ConfigError(f"--link-rate {link_rate} is the link between hosts: give --hosts 2 "
                          f"or more")
    share = sync_communication_share(cfg, workers, hosts, parse_rate(link_rate))
    where = f"at {link_rate} between {hosts} hosts"
    binds = f"{SLOW_NETWORK_SHARE:.0%} of its step or more"
    if share is None:
        return (f"{where}: the network binds when sync spends {binds} communicating "
                f"({MEASURE}), and there {GAIN}; the plan has no measured step of "
                f"--model {cfg.model} to estimate sync's share from")
    step = MEASURED_STEPS[cfg.model]
    estimate = (f"estimated by the cost model from a step of {cfg.model} on {step.shape} "
                f"measured at {step.seconds:g} s for a batch of {step.batch}, {step.where}; "
                f"your machines' own step changes it; it leaves out sync's overlap of its "
                f"gradients with back-propagation, so it is at most what sync spends: "
                f"{_checked()}")
    said = f"{where} sync would spend about {share:.0%} of its step communicating ({estimate})"
    if share >= SLOW_NETWORK_SHARE:
        return (f"the network binds: {said}; it binds from {binds} ({MEASURE}), and there "
                f"{GAIN}")
    return (f"the network does not bind: {said}; it binds from {binds} ({MEASURE}), where "
            f"{GAIN}; below it no time gain of local mode is established")
