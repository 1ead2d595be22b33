"""Every call hvdtrain makes into Horovod goes through this module.

Horovod 0.28.1 is the last release. Its TensorFlow ops (built with the patches in
launch/patches) work on TensorFlow 2.21, but its Keras layer does not work with
Keras 3: `horovod.tensorflow.keras.DistributedOptimizer` trains without averaging,
and `broadcast_variables` / `DistributedGradientTape` fail on Keras 3 variables. So
everything here takes and returns tensors, never Keras variables; the Keras layer
(`hvdtrain.keras`) reads variables into tensors and assigns the results back. A move
to another collective library (or a future Horovod) changes this file only.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Mapping, Sequence

import horovod.tensorflow as hvd
import tensorflow as tf
from horovod.common.elastic import ObjectState, run_fn
from horovod.common.exceptions import HorovodInternalError

from hvdtrain.errors import ConfigError
from hvdtrain.machine.host_layout import (HostLayout, hosts_from_environment,
                                          layout_from_environment, peer_groups)
from hvdtrain.machine.launcher_lifetime import end_with_launcher


_worlds_started = 0  # Horovod (re)starts in this process: each one is a new set of workers
FUSION_THRESHOLD = "HOROVOD_FUSION_THRESHOLD"  # bytes; Horovod reads it when it starts
GLOO_TIMEOUT = "HOROVOD_GLOO_TIMEOUT_SECONDS"  # its wait for every worker at the start
# Set by hvd.init(process_sets="dynamic") before Horovod starts, which reads it then: only
# a Horovod started so can take process sets (the host groups) later.
DYNAMIC_PROCESS_SETS = "HOROVOD_DYNAMIC_PROCESS_SETS"


@dataclass(frozen=True)
class WorkerGroup:
    """Some of the workers, for collectives among them only: the workers of one host
    (`host_group`). `process_set` is Horovod's, or None for all the workers."""

    ranks: tuple[int, ...]
    hosts: int                 # how many groups the workers were split into
    process_set: object = None

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def index(self) -> int:
        """This worker's place in the group: Horovod ranks a process set's workers in
        the order of their global ranks."""
        return sorted(self.ranks).index(rank())


# The host groups registered with Horovod in this world (Horovod keeps process sets in a
# registry of its own; this mirrors which of them is ours). Set by `init(host_groups=True)`,
# and made again for every new set of workers after an elastic reset.
_host_group: WorkerGroup | None = None
# The workers that hold the same place in every host (`peer_group`), when hosts are equal.
_peer_group: WorkerGroup | None = None
_wants_host_groups = False
# The process sets Horovod started with, by their ranks (`_start_horovod`); empty when it
# started in its dynamic mode or without sets.
_started_sets: dict[tuple[int, ...], object] = {}
_started_layout: HostLayout | None = None  # the layout they were made from


def init(fuse_tensors: bool = True, host_groups: bool = False,
         rendezvous_seconds: int | None = None) -> None:
    """Start Horovod once; without horovodrun this is a world of one worker.

    `host_groups=True` also makes a group of each host's workers (`host_group`), for
    collectives inside a host: hierarchical local SGD averages gradients there every step.
    That is a collective call, which starts TensorFlow's runtime: a worker's cores and
    thread pools must be set before (`hvdtrain.training.start`).

    `fuse_tensors=False` turns Horovod's tensor fusion off. Which tensors share a fused
    buffer depends on which are ready in the same cycle, i.e. on timing, and with three
    or more workers the ring sums each element in an order set by its place in the
    buffer: two identical runs then round differently, and the difference grows. Each
    group then travels as one flat tensor instead (`average`, `total`).

    `rendezvous_seconds`: how long Horovod's start waits for every worker (Gloo's 30 s
    when None), unless the user set it (horovodrun --gloo-timeout-seconds).
    """
    global _worlds_started, _wants_host_groups
    _wants_host_groups = _wants_host_groups or host_groups
    if not fuse_tensors:
        if hvd.is_initialized() and not fusion_is_off():
            raise ConfigError("--deterministic must start Horovod itself: this process "
                              "started it earlier with tensor fusion on")
        os.environ[FUSION_THRESHOLD] = "0"
    if not hvd.is_initialized():
        end_with_launcher()  # every worker starts here, hvdtrain's and a user's own script
        if rendezvous_seconds is not None:
            os.environ.setdefault(GLOO_TIMEOUT, str(rendezvous_seconds))
        _start_horovod(host_groups)
        _worlds_started += 1
    if host_groups and _host_group is None:
        _make_host_groups()


def _start_horovod(host_groups: bool) -> None:
    """`hvd.init`; for host groups, with them as process sets when hvdtrain's horovodrun
    says the hosts are equal (`host_layout`), else in the dynamic mode that can add them
    once the workers' host names are known."""
    global _started_sets, _started_layout
    layout = layout_from_environment(os.environ) if host_groups else None
    _started_sets, _started_layout = {}, None
    if layout is None:
        hvd.init(process_sets="dynamic" if host_groups else None)
        return
    sets = [hvd.ProcessSet(ranks) for ranks in layout.process_sets()]
    hvd.init(process_sets=sets)
    _started_sets, _started_layout = {tuple(ps.ranks): ps for ps in sets}, layout


def _make_host_groups() -> None:
    """Every worker registers every host's group, in the same order: a collective call;
    then, when every host has as many workers (two or more), the groups of the workers at
    the same place in each host (`peer_group`)."""
    global _host_group, _peer_group
    names = hvd.allgather_object(os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname())
    groups: dict[str, list[int]] = {}
    for worker, name in enumerate(names):
        groups.setdefault(name, []).append(worker)
    mine = tuple(groups[names[hvd.rank()]])
    if _started_layout is not None and list(groups.values()) != _started_layout.host_sets():
        raise ConfigError(f"the workers' host names group them as {list(groups.values())}, "
                          f"but horovodrun's environment as {_started_layout.host_sets()}")
    process_set = None
    if len(groups) > 1:
        if not _started_sets and os.environ.get(DYNAMIC_PROCESS_SETS) != "1":
            raise ConfigError("--hierarchical-sgd must start Horovod itself: this process "
                              "started it earlier without process sets")
        process_set = _register(list(groups.values()), mine)
    _host_group = WorkerGroup(mine, len(groups), process_set)
    _peer_group = None
    sizes = {len(ranks) for ranks in groups.values()}
    if len(groups) > 1 and sizes != {1} and len(sizes) == 1:
        peers = peer_groups(list(groups.values()))
        place = mine.index(hvd.rank())
        _peer_group = WorkerGroup(tuple(peers[place]), len(groups),
                                  _register(peers, tuple(peers[place])))


def _register(groups: list[list[int]], mine: tuple[int, ...]):
    """Register `groups` as Horovod process sets, in order, and return the one of `mine`;
    or take them from the sets Horovod started with."""
    own = None
    for ranks in groups:  # in the same order on every worker
        if _started_sets:
            added = _started_sets[tuple(ranks)]
        else:
            # Any failure here is Horovod's own and keeps its words: Horovod shut down
            # meanwhile (a peer lost while an elastic reset makes the groups again).
            added = hvd.add_process_set(ranks)
        if tuple(ranks) == mine:
            own = added
    return own


def host_group() -> WorkerGroup:
    """This worker's host group (all the workers when they share one host, or when
    `init` was not asked for host groups)."""
    if _host_group is None:
        return WorkerGroup(tuple(range(hvd.size())), 1)
    return _host_group


def host_count() -> int:
    """How many hosts the job's workers run on, the same on every worker and without a
    collective (elastic workers that join later call it alone): the host groups' count
    when they were made; else what hvdtrain's horovodrun told every worker; else
    Horovod's own count from this worker's place (mpirun), every host's when each host has
    as many workers. `host_group()` alone counts one host unless groups were asked for."""
    if _host_group is not None:
        return _host_group.hosts
    told = hosts_from_environment(os.environ)
    return told if told is not None else hvd.cross_size()


def host_groups_at_start() -> bool:
    """Whether Horovod started knowing the host groups, as process sets (none on one
    host). Otherwise they were added to a Horovod started in its dynamic mode, whose every
    cycle then gathers from every worker (`host_layout`)."""
    return _started_layout is not None


def peer_group() -> WorkerGroup | None:
    """The workers at this worker's place in every host (its host's k-th worker, the
    other hosts' k-th), one per host, or None unless there are two or more hosts, all of
    the same number of workers, two or more. A round across hosts can then be cut in
    shards, one per place, each crossing between hosts in its own group: every host's NIC
    carries one copy of the state instead of one per worker."""
    return _peer_group


def fusion_is_off() -> bool:
    """Whether Horovod runs without tensor fusion: its threshold is 0, set by
    `init(fuse_tensors=False)` or by the user (horovodrun --fusion-threshold-mb 0). Read
    from Horovod's own setting, so the way groups travel cannot disagree with it."""
    try:
        return int(os.environ.get(FUSION_THRESHOLD, "-1")) == 0
    except ValueError:
        return False


def world_id() -> int:
    """Changes whenever this process joins a new set of workers (an elastic reset), so
    state handed out once per set of workers can tell when it must be handed out again."""
    return _worlds_started


def rank() -> int:
    return hvd.rank()


def size() -> int:
    return hvd.size()


def local_rank() -> int:
    return hvd.local_rank()


def local_size() -> int:
    return hvd.local_size()


def is_chief() -> bool:
    return hvd.rank() == 0


def average(tensors: Sequence[tf.Tensor], name: str | None = None, fp16: bool = False,
            flat: bool | None = None, group: WorkerGroup | None = None) -> list[tf.Tensor]:
    """Element-wise mean over workers of each tensor, as one grouped allreduce.

    Works eagerly and inside tf.function. With one worker it returns the inputs.
    `flat`: whether a group of one dtype travels as one flat tensor; by default when
    fusion is off (`fusion_is_off`), where Horovod would give each of the group's tensors
    a ring allreduce of its own (that halved LeNet's throughput). `group`: over those
    workers only (every one of them must call it), by default over all.
    """
    tensors = list(tensors)
    workers = hvd.size() if group is None else group.size
    if workers == 1 or not tensors:
        return tensors
    process_set = None if group is None else group.process_set
    return _allreduce_group(tensors, hvd.Average, name, fp16, flat, process_set)


def total(tensors: Sequence[tf.Tensor], name: str | None = None,
          flat: bool | None = None) -> list[tf.Tensor]:
    """Element-wise sum over workers, as one grouped allreduce; `flat` as for `average`."""
    tensors = list(tensors)
    if hvd.size() == 1 or not tensors:
        return tensors
    return _allreduce_group(tensors, hvd.Sum, name, False, flat)


def _allreduce_group(tensors: list[tf.Tensor], op, name: str | None, fp16: bool,
                     flat: bool | None, process_set=None) -> list[tf.Tensor]:
    options = dict(op=op, name=name,
                   compression=hvd.Compression.fp16 if fp16 else hvd.Compression.none,
                   process_set=process_set or hvd.global_process_set)
    if flat is None:
        flat = fusion_is_off()
    if flat and len({t.dtype for t in tensors}) == 1 and all(
            t.shape.is_fully_defined() for t in tensors):
        (reduced,) = hvd.grouped_allreduce([flatten(tensors)], **options)
        return unflatten(reduced, tensors)
    return list(hvd.grouped_allreduce(tensors, **options))


def flatten(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
    """Tensors of one dtype as one vector, in order."""
    return tf.concat([tf.reshape(t, [-1]) for t in tensors], axis=0)


def unflatten(flat: tf.Tensor, like: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    """`flatten`'s inverse: pieces of `flat` shaped as `like` (whose shapes are static)."""
    pieces = tf.split(flat, [t.shape.num_elements() for t in like])
    return [tf.reshape(piece, t.shape) for piece, t in zip(pieces, like)]


def gather_rows(rows: tf.Tensor, name: str | None = None) -> list[tf.Tensor]:
    """Every worker's `rows` (a tensor whose first axis may differ between workers), in
    rank order, on every worker. Eager only."""
    if hvd.size() == 1:
        return [rows]
    counts = hvd.allgather(tf.reshape(tf.shape(rows, out_type=tf.int64)[:1], [1]),
                           name=None if name is None else name + "_counts")
    gathered = hvd.allgather(rows, name=name)
    return list(tf.split(gathered, counts.numpy().tolist(), axis=0))


def _members(group: WorkerGroup | None) -> tuple[int, object]:
    """How many workers a collective among `group` (all when None) has, and its set."""
    if group is None:
        return hvd.size(), hvd.global_process_set
    return group.size, group.process_set or hvd.global_process_set


def alltoall(tensor: tf.Tensor, name: str | None = None,
             group: WorkerGroup | None = None) -> tf.Tensor:
    """`tensor`'s first axis cut into one equal part per worker, part r sent to worker r;
    returns the parts this worker got, in rank order, in the same shape. Any dtype Horovod
    carries (int8 among them), eager or traced. With one worker it returns the input.
    `group`: among those workers only, ranked by `WorkerGroup.index`."""
    workers, process_set = _members(group)
    if workers == 1:
        return tensor
    return tf.reshape(hvd.alltoall(tensor, name=name, process_set=process_set), tensor.shape)


def allgather(tensor: tf.Tensor, name: str | None = None,
              group: WorkerGroup | None = None) -> tf.Tensor:
    """Every worker's `tensor` (all of one shape), concatenated along the first axis in
    rank order, on every worker; any dtype Horovod carries, eager or traced. `group`: as
    for `alltoall`."""
    workers, process_set = _members(group)
    if workers == 1:
        return tensor
    gathered = hvd.allgather(tensor, name=name, process_set=process_set)
    return tf.reshape(gathered, [workers * tensor.shape[0], *tensor.shape[1:]])


def average_scalars(values: Mapping[str, float], name: str = "scalars") -> dict[str, float]:
    """Mean over workers of each named number; every worker must pass the same names."""
    keys = sorted(values)
    if not keys:
        return {}
    stacked = tf.constant([float(values[k]) for k in keys], dtype=tf.float64)
    (mean,) = average([stacked], name=name)
    return dict(zip(keys, (float(v) for v in mean.numpy())))


def broadcast(tensors: Sequence[tf.Tensor], root_rank: int = 0,
              name: str | None = None) -> list[tf.Tensor]:
    """Each tensor as `root_rank` holds it, on every worker. Bit-exact for any dtype."""
    tensors = list(tensors)
    if hvd.size() == 1 or not tensors:
        return tensors
    prefix = name or "broadcast"
    return [hvd.broadcast(t, root_rank=root_rank, name=f"{prefix}_{i}")
            for i, t in enumerate(tensors)]


def broadcast_object(obj, root_rank: int = 0, name: str | None = None):
    """A picklable Python object from `root_rank` to every worker."""
    if hvd.size() == 1:
        return obj
    return hvd.broadcast_object(obj, root_rank=root_rank, name=name)


# --- elastic training (horovodrun --min-np/--max-np --host-discovery-script) ---


class ElasticState(ObjectState):
    """What survives a change of workers: these variables plus named Python values.

    `commit()` keeps an in-memory copy and checks whether hosts were added; after a
    failure every worker goes back to its last commit, then all take rank 0's.
    """

    def __init__(self, variables, **values):
        self._variables = list(variables)
        self._saved = None
        super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank, **values)
        self._save_variables()

    def _save_variables(self):
        self._saved = [tf.identity(tf.convert_to_tensor(v)) for v in self._variables]

    def save(self):
        self._save_variables()
        super().save()

    def restore(self):
        for variable, value in zip(self._variables, self._saved):
            variable.assign(value)
        super().restore()

    def sync(self):
        values = broadcast([tf.convert_to_tensor(v) for v in self._variables], name="elastic_sync")
        for variable, value in zip(self._variables, values):
            variable.assign(value)
        self._save_variables()
        super().sync()


# What a failed Horovod op's error says: Horovod's own shutdown notice, or, when the op
# itself saw the peer go, only gloo's transport error ("[.../gloo/transport/tcp/pair.cc:589]
# Read error [198.18.0.3]:16051: Connection reset by peer"), which names no Horovod.
LOST_PEER_MARKERS = ("Horovod", "gloo/transport")
# What an op on a host group says once Horovod has shut down after a lost peer: the
# shutdown forgets the process sets (launch/patches/0004), and an op checks that its set
# exists before it checks for a shutdown. So a step whose within-host average is enqueued
# just after the loss fails with this, not with the shutdown's notice: a race, which a
# hierarchical elastic job lost now and then, and then ended on this error.
FORGOTTEN_PROCESS_SET = "Process set provided does not exist"


def is_lost_peer(exc: BaseException) -> bool:
    """True for the error a Horovod op raises once a peer has gone (its connection closed,
    or Horovod shut down after another rank's failure)."""
    if isinstance(exc, HorovodInternalError):
        return True
    message = exc.message or "" if isinstance(exc, tf.errors.OpError) else ""
    if FORGOTTEN_PROCESS_SET in message:
        # The ops use only the host groups registered here: one goes missing only when
        # Horovod shuts down. Without any, the error is a real one and stays.
        return _host_group is not None and _host_group.process_set is not None
    return any(marker in message for marker in LOST_PEER_MARKERS)


def elastic_run(func):
    """Run `func(state)` again after every change of workers, as `hvd.elastic.run` does.

    Horovod 0.28.1's own wrapper recognises only plain allreduce, allgather and
    broadcast failures and silently returns None on any other error; ours treats
    every failed Horovod op (grouped allreduce included) as a lost peer and lets all
    other errors through.
    """

    def wrapper(state, *args, **kwargs):
        try:
            return func(state, *args, **kwargs)
        except tf.errors.OpError as exc:
            if is_lost_peer(exc):
                raise HorovodInternalError(exc) from exc
            raise

    def reset():
        global _host_group, _peer_group
        hvd.shutdown()
        # Horovod forgets its process sets when it shuts down, and the hosts may have
        # changed (one lost, one taken back): start again as a worker that joins does, in
        # `init`, so both make the host groups in the same collective calls.
        _host_group = _peer_group = None
        init(host_groups=_wants_host_groups)

    return run_fn(wrapper, reset)
