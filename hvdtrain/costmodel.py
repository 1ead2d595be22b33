"""What a step costs on other clusters: a latency-bandwidth model of ring allreduce.

Pure functions, fed by one `hvdtrain bench` measurement (`hvdtrain.benchmarks.predict`).

Ring allreduce of B bytes over N workers (Patarasuk and Yuan 2009; Horovod's and
NCCL's algorithm) takes 2(N − 1) steps; in each, every worker sends and receives a
chunk of B / N bytes. So each worker puts 2(N − 1)/N × B bytes on its link, in
2(N − 1) messages:

    T(B, N) = 2(N − 1) α + 2(N − 1)/N × B × s / R

with α the latency of one message, R the link's rate and s the workers whose traffic
shares one link (1 for a worker per NIC; 2 on this machine's emulated loopback,
which carries both workers' traffic).

A step of each mode, with t the compute time of one step (independent workers):
- independent: t;
- sync: gradients travel in buckets while back-propagation goes on. A share
  `overlap` of the step can hide communication, but the last bucket (the first
  layers' gradients) only leaves when back-propagation ends:
      t + max(T(grads) − overlap × t, T(last bucket));
- local SGD: one exchange of the model state every n_sync steps: t + T(state) / n_sync.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    rate_bits: float            # bits per second of one link
    latency: float = 50e-6      # seconds per message
    workers_per_link: int = 1   # workers whose traffic shares the link


@dataclass(frozen=True)
class Workload:
    """One model's step, as measured: compute alone, and what each mode sends."""

    compute_seconds: float      # one step without communication
    gradient_bytes: float       # allreduced every step in sync mode
    state_bytes: float          # allreduced every round in local mode
    batch_per_worker: int
    bucket_bytes: float = 25e6  # sync mode's gradient groups
    overlap: float = 0.0        # share of a step that can hide sync mode's communication


def ring_allreduce_seconds(payload_bytes: float, workers: int, link: Link) -> float:
    if workers <= 1 or payload_bytes <= 0:
        return 0.0
    messages = 2 * (workers - 1)
    wire_bytes = messages / workers * payload_bytes * link.workers_per_link
    return messages * link.latency + wire_bytes * 8 / link.rate_bits


def step_seconds(work: Workload, mode: str, workers: int, link: Link, n_sync: int = 1) -> float:
    compute = work.compute_seconds
    if mode == "independent":
        return compute
    if mode == "sync":
        if workers <= 1:
            return compute
        exchange = ring_allreduce_seconds(work.gradient_bytes, workers, link)
        last_bucket = ring_allreduce_seconds(
            min(work.bucket_bytes, work.gradient_bytes) if work.bucket_bytes > 0
            else work.gradient_bytes, workers, link)
        return compute + max(exchange - work.overlap * compute, last_bucket)
    if mode == "local":
        return compute + ring_allreduce_seconds(work.state_bytes, workers, link) / n_sync
    raise ValueError(f"unknown mode {mode!r}")


@dataclass(frozen=True)
class Prediction:
    images_per_sec: float       # all workers together
    efficiency: float           # against independent workers (no communication)
    communication_share: float  # of a step spent waiting for allreduce


def predict(work: Workload, mode: str, workers: int, link: Link, n_sync: int = 1) -> Prediction:
    seconds = step_seconds(work, mode, workers, link, n_sync)
    return Prediction(workers * work.batch_per_worker / seconds, work.compute_seconds / seconds,
                      1.0 - work.compute_seconds / seconds)
