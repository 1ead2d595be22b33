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

No link makes an exchange faster than the hosts can take part in it: copying into
the fusion buffer, reducing, Horovod's negotiation and Gloo's per-operation cost. A
bench over an unshaped link measures that floor (`seconds_per_exchange`); it grows
with the share (N − 1)/N of the payload each worker handles, so a floor measured on
M workers is kept as F = measured / [(M − 1)/M], the floor of a worker's whole payload
(benches of different worker counts then average like with like). An exchange takes

    E(B, N) = max(T(B, N), F × (N − 1)/N)

Taking the larger, not the sum, is the ring's own pipelining: a worker reduces one
chunk while the next is on the wire.

A step of each mode, with t the compute time of one step (independent workers):
- independent: t;
- sync: t + x, with x what a sync step computes beyond an independent one (the
  gradient path, measured too), plus the gradient exchange. Gradients travel in
  buckets while back-propagation goes on: a share `overlap` of the step can hide
  communication, but the last bucket only leaves when back-propagation ends:
      t + x + max(E(grads) − overlap × t, E(last bucket)).
  The last bucket is the one `hvdtrain.rounds.averaging.gradient_buckets` makes last: the
  first layers' gradients, what is left once the later layers filled whole buckets
  (the bench records it); without it, at most min(bucket cap, gradients).
  x is computed, not waited for: it is no part of the communication share;
- local SGD: one exchange of the model state every n_sync steps: t + E(state) / n_sync;
- async (overlapped local SGD): the exchange runs behind the next n_sync steps, and a
  worker waits only for what they do not cover: t + max(0, E(state) − n_sync × t) / n_sync.
  On a machine where the allreduce and the training share the cores this is the bound
  from below;
- hierarchical local SGD and async on hosts of S workers (`Hierarchy`): a sync step
  among the S workers of a host, over the host's own link (NVLink or PCIe; the loopback
  on emulated hosts), then a round every n_sync steps as above. The round is one ring
  over all N workers with each host's workers next to each other, so the hops between
  hosts carry 2(N − 1)/N × B each, as in a flat round: what the hierarchy saves is the
  rounds it needs no longer (its period follows the hosts), not bytes per round. An
  async round hides behind the next period's whole steps, inner exchanges included.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from hvdtrain.rounds.periods import LOCAL_MODES


@dataclass(frozen=True)
class Link:
    rate_bits: float            # bits per second of one link
    latency: float = 50e-6      # seconds per message
    workers_per_link: int = 1   # workers whose traffic shares the link


# A host's own links next to a network (NVLink, a machine's loopback): only the floor counts.
UNLIMITED = Link(math.inf, latency=0.0)


@dataclass(frozen=True)
class Workload:
    """One model's step, as measured: compute alone, and what each mode sends."""

    compute_seconds: float      # one step without communication
    gradient_bytes: float       # allreduced every step in sync mode
    state_bytes: float          # allreduced every round in local mode
    batch_per_worker: int
    bucket_bytes: float = 25e6  # sync mode's gradient groups
    overlap: float = 0.0        # share of a step that can hide sync mode's communication
    last_bucket_bytes: float | None = None  # the group sent last; None: not known
    # Measured over a fast link, as a worker's whole payload (see the module doc); 0: none.
    gradient_floor: float = 0.0  # seconds of one gradient exchange
    state_floor: float = 0.0     # seconds of one state exchange (a local-SGD round)
    sync_extra: float = 0.0      # seconds a sync step computes beyond an independent one


@dataclass(frozen=True)
class Hierarchy:
    """Hosts of several workers that average gradients every step among themselves."""

    workers_per_host: int
    host_link: Link = UNLIMITED


def ring_allreduce_seconds(payload_bytes: float, workers: int, link: Link) -> float:
    if workers <= 1 or payload_bytes <= 0:
        return 0.0
    messages = 2 * (workers - 1)
    wire_bytes = messages / workers * payload_bytes * link.workers_per_link
    return messages * link.latency + wire_bytes * 8 / link.rate_bits


def floor_of_whole_payload(measured_seconds: float, workers: int) -> float:
    """F: a floor measured on `workers` workers, scaled to a worker's whole payload."""
    return measured_seconds * workers / (workers - 1)


def exchange_seconds(payload_bytes: float, floor: float, workers: int, link: Link) -> float:
    """E(B, N): the ring over `link`, but never faster than the hosts' floor F."""
    if workers <= 1 or payload_bytes <= 0:
        return 0.0
    return max(ring_allreduce_seconds(payload_bytes, workers, link),
               floor * (workers - 1) / workers)


def last_bucket(work: Workload) -> float:
    """The gradients that leave when back-propagation ends (see the module doc)."""
    if work.last_bucket_bytes is not None:
        return min(work.last_bucket_bytes, work.gradient_bytes)
    if work.bucket_bytes <= 0:
        return work.gradient_bytes
    return min(work.bucket_bytes, work.gradient_bytes)


def step_parts(work: Workload, mode: str, workers: int, link: Link, n_sync: int = 1,
               hierarchy: Hierarchy | None = None) -> tuple[float, float]:
    """(seconds computing, seconds waiting for exchanges) of one step of `mode`; with
    `hierarchy`, of hierarchical local SGD (`mode` local or async)."""
    compute = work.compute_seconds
    if mode == "independent":
        return compute, 0.0
    if mode == "sync":
        return _sync_parts(work, workers, link)
    if mode not in LOCAL_MODES:
        raise ValueError(f"unknown mode {mode!r}")
    within = 0.0
    if hierarchy is not None and hierarchy.workers_per_host > 1:
        compute, within = _sync_parts(work, hierarchy.workers_per_host, hierarchy.host_link)
    exchange = round_seconds(work, workers, link, hierarchy)
    if mode == "async":
        exchange = max(0.0, exchange - n_sync * (compute + within))
    return compute, within + exchange / n_sync


def round_seconds(work: Workload, workers: int, link: Link,
                  hierarchy: Hierarchy | None = None) -> float:
    """A round of `work`'s state among `workers`: a ring over them all, or, on hosts of
    one size several workers each, cut in host shards."""
    per_host = 1 if hierarchy is None else hierarchy.workers_per_host
    if per_host > 1 and workers % per_host == 0:
        return host_sharded_round_seconds(work, workers, link, per_host)
    return exchange_seconds(work.state_bytes, work.state_floor, workers, link)


def host_sharded_round_seconds(work: Workload, workers: int, link: Link, per_host: int) -> float:
    """A hierarchical round cut in host shards (`hvdtrain.keras.host_shards`): each of a
    host's workers averages a k-th of the state with its peers, one a host, and all k of
    them at once through the host's link, which so carries a ring's bytes of the whole
    state over the hosts. (The gather of the shards inside a host is left out, like the
    host link's share of a sync step's.)"""
    shared = replace(link, workers_per_link=link.workers_per_link * per_host)
    return exchange_seconds(work.state_bytes / per_host, work.state_floor / per_host,
                            workers // per_host, shared)


def _sync_parts(work: Workload, workers: int, link: Link) -> tuple[float, float]:
    """A sync step's compute and wait: its gradient exchange among `workers` over `link`."""
    compute = work.compute_seconds
    grads = work.gradient_bytes
    if workers <= 1 or grads <= 0:
        return compute, 0.0
    exchange = exchange_seconds(grads, work.gradient_floor, workers, link)
    last = last_bucket(work)
    last_exchange = exchange_seconds(last, work.gradient_floor * last / grads, workers, link)
    return (compute + work.sync_extra,
            max(exchange - work.overlap * compute, last_exchange))


def step_seconds(work: Workload, mode: str, workers: int, link: Link, n_sync: int = 1,
                 hierarchy: Hierarchy | None = None) -> float:
    return sum(step_parts(work, mode, workers, link, n_sync, hierarchy))


def sync_extra_seconds(work: Workload, measured_step: float, workers: int) -> float:
    """x: what a sync step measured over a link that was not the limit took beyond the
    compute and the part of its exchange the model leaves exposed, with `work`'s own
    overlap and last bucket (the same model that will predict with x)."""
    unlimited = Link(math.inf, latency=0.0)
    without = replace(work, sync_extra=0.0)
    return max(0.0, measured_step - step_seconds(without, "sync", workers, unlimited))


@dataclass(frozen=True)
class Prediction:
    images_per_sec: float       # all workers together
    efficiency: float           # against independent workers (no communication)
    communication_share: float  # of a step spent waiting for allreduce


def predict(work: Workload, mode: str, workers: int, link: Link, n_sync: int = 1,
            hierarchy: Hierarchy | None = None) -> Prediction:
    computing, waiting = step_parts(work, mode, workers, link, n_sync, hierarchy)
    seconds = computing + waiting
    return Prediction(workers * work.batch_per_worker / seconds, work.compute_seconds / seconds,
                      waiting / seconds)
