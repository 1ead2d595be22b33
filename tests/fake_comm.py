"""A fake `hvdtrain.comm` for testing multi-worker logic in one process.

`FakeComm(workers=K, rank=r)` is a world of K workers seen from worker r: inside `with`,
every public function of `hvdtrain.comm` is replaced, so code that calls `comm.average(...)`
(module lookups, as all of hvdtrain does) talks to the fake. The test says what the other
K - 1 workers hand to each collective, by the collective's name:

    with FakeComm(workers=3, rank=0) as world:
        world.hold("model_state", {1: [w1, m1, v1], 2: [w2, m2, v2]})
        averager.average()

The fake is strict: a collective whose other workers' values were not held fails with
`MissingPeerValues`, and held values of the wrong ranks, count, shape or keys fail too, so a
test cannot pass on the one-worker identity. Functions of `comm` that need a real Horovod
(elastic runs) fail when called. The `horovodrun` suites stay the integration layer: they
run the real collectives; this fake only lets the logic around them run at K > 1 in
`make test-fast`.

Collectives work eagerly and inside `tf.function`, there as a `tf.py_function` that asks
the world installed when the graph *runs*: a round traced in one test world and run in the
next uses the next one's values, as a real op would. Each call is recorded in `calls` with
what this worker sent. `sent_by` runs code as another rank and returns what it sent, so a
test can hold, for the other workers, what the same code sends from their state rather than
writing the encoding down (`hold_sent`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf

from hvdtrain import comm

# Functions of comm that touch no Horovod: they run as they are under the fake.
PURE = frozenset({"flatten", "unflatten", "fusion_is_off", "is_lost_peer"})
FAKE_PREFIX = "fake_"  # FakeComm's method fake_X stands in for comm.X

# Held by `sent_by`'s world: every other worker sends what this one does.
ECHO = object()

# What the other workers hold for one collective: {rank: values}, or a function of this
# worker's own values (as numpy) giving that mapping.
Held = Mapping[int, Any] | Callable[[Any], Mapping[int, Any]]


class FakeCommError(AssertionError):
    # Autograph lets it through as it is, rather than as its StagingError, while tracing.
    ag_pass_through = True


class MissingPeerValues(FakeCommError):
    """A collective ran whose other workers' values the test did not give."""


class BadPeerValues(FakeCommError):
    """The values held for the other workers could not be what they send."""


@dataclass(frozen=True)
class Call:
    kind: str          # the comm function: "average", "total", "broadcast", ...
    name: str | None   # the collective's name, which keys the held values
    sent: Any          # what this worker handed to it (numpy arrays, rows, dict, object)
    fp16: bool = False


# comm's own public functions (and its class that needs Horovod), read before any fake
# replaced them, so that fake worlds can nest.
COMM_FUNCTIONS = tuple(name for name, value in vars(comm).items()
                       if not name.startswith("_") and callable(value)
                       and getattr(value, "__module__", None) == comm.__name__
                       and name != "WorkerGroup")


def _refuse(name: str) -> Callable:
    def refused(*args, **kwargs):
        raise FakeCommError(f"hvdtrain.comm.{name} needs a real Horovod; "
                                f"FakeComm does not fake it")
    return refused


def _fp16_reduce(values: list[np.ndarray], average: bool) -> np.ndarray:
    """As Horovod's fp16 compression: each worker's tensor, and the result, in float16."""
    total = np.sum([v.astype(np.float16).astype(np.float32) for v in values], axis=0)
    result = total.astype(np.float16)
    if average:
        result = (result.astype(np.float32) / len(values)).astype(np.float16)
    return result.astype(values[0].dtype)


def _reduce(values: list[np.ndarray], average: bool, fp16: bool) -> np.ndarray:
    if fp16 and np.issubdtype(values[0].dtype, np.floating):
        return _fp16_reduce(values, average)
    total = np.sum(values, axis=0, dtype=values[0].dtype)
    return (total / len(values)).astype(values[0].dtype) if average else total


_installed: list[FakeComm] = []  # the worlds entered and not yet left, innermost last


def _installed_world() -> FakeComm:
    if not _installed:
        raise MissingPeerValues("a collective traced under FakeComm ran outside any FakeComm")
    return _installed[-1]


def _group_ranks(world: FakeComm, group) -> list[int]:
    ranks = sorted(range(world.workers) if group is None else group.ranks)
    if world.rank not in ranks:
        raise BadPeerValues(f"this worker (rank {world.rank}) is not in the group {ranks}")
    return ranks


class FakeComm:
    """A world of `workers` workers in which this process is `rank` (see the module doc).

    `hosts`: the ranks of each host (by default one host of them all), for `host_group`,
    `local_rank` and `local_size`. `peers`: a function of a collective's name giving what
    `hold` would (or None when it has nothing for that name)."""

    def __init__(self, workers: int, rank: int = 0, hosts: Sequence[Sequence[int]] | None = None,
                 peers: Callable[[str | None], Held | None] | None = None):
        if workers < 2 or not 0 <= rank < workers:
            raise ValueError(f"a fake world needs K >= 2 workers and 0 <= rank < K, "
                             f"got K={workers}, rank={rank}")
        self.workers, self.rank = workers, rank
        self.hosts = [tuple(h) for h in hosts] if hosts is not None else [tuple(range(workers))]
        if sorted(r for h in self.hosts for r in h) != list(range(workers)):
            raise ValueError(f"hosts {self.hosts} do not split ranks 0..{workers - 1}")
        self.peers = peers
        self.world_id = 1
        self.calls: list[Call] = []
        self._held: dict[str | None, Held] = {}
        self._saved: dict[str, Any] = {}

    # --- what the test says ---

    @property
    def others(self) -> tuple[int, ...]:
        return tuple(r for r in range(self.workers) if r != self.rank)

    def hold(self, name: str | None, peers: Held) -> None:
        """What the other workers hand to the collective `name`, by rank: for average,
        total and broadcast a sequence of arrays (one per tensor); for gather_rows an array;
        for average_scalars a dict; for broadcast_object the object. Or a function of this
        worker's own values (numpy) giving that mapping."""
        self._held[name] = peers

    def hold_sent(self, sent: Mapping[int, Mapping[str | None, Any]]) -> None:
        """Hold, for every collective, what each other worker sent to it: `sent` maps a
        rank to that worker's `sent_by`."""
        for name in {name for by_name in sent.values() for name in by_name}:
            self.hold(name, {rank: by_name[name] for rank, by_name in sent.items()})

    def sent(self, name: str | None) -> Any:
        """What this worker handed to the last collective called `name`."""
        for call in reversed(self.calls):
            if call.name == name:
                return call.sent
        raise MissingPeerValues(f"no collective named {name!r} ran "
                                f"(ran: {[c.name for c in self.calls]})")

    # --- installing ---

    def __enter__(self) -> FakeComm:
        _installed.append(self)
        for name in COMM_FUNCTIONS:
            if name in PURE:
                continue
            fake = getattr(self, FAKE_PREFIX + name, None)
            self._saved[name] = getattr(comm, name)
            setattr(comm, name, fake if fake is not None else _refuse(name))
        return self

    def __exit__(self, *exc) -> None:
        for name, value in self._saved.items():
            setattr(comm, name, value)
        self._saved.clear()
        _installed.remove(self)


    # --- comm's functions, as seen from this worker ---

    def fake_init(self, fuse_tensors: bool = True, host_groups: bool = False) -> None:
        """Nothing to start: the fake world exists from `__enter__`."""

    def fake_world_id(self) -> int:
        return self.world_id

    def fake_rank(self) -> int:
        return self.rank

    def fake_size(self) -> int:
        return self.workers

    def fake_is_chief(self) -> bool:
        return self.rank == 0

    def _my_host(self) -> tuple[int, ...]:
        return next(h for h in self.hosts if self.rank in h)

    def fake_local_rank(self) -> int:
        return self._my_host().index(self.rank)

    def fake_local_size(self) -> int:
        return len(self._my_host())

    def fake_host_group(self) -> comm.WorkerGroup:
        return comm.WorkerGroup(self._my_host(), len(self.hosts))

    def fake_host_count(self) -> int:
        return len(self.hosts)

    def fake_average(self, tensors, name=None, fp16=False, flat=None, group=None):
        ranks = tuple(range(self.workers)) if group is None else tuple(group.ranks)
        return self._allreduce("average", tensors, name, fp16, ranks)

    def fake_total(self, tensors, name=None, flat=None):
        return self._allreduce("total", tensors, name, False, tuple(range(self.workers)))

    def fake_broadcast(self, tensors, root_rank=0, name=None):
        def run(world, own):
            world.calls.append(Call("broadcast", name, own))
            if root_rank == world.rank:
                return own
            theirs = world._peer_values(name, own, {root_rank}, exact=False)[root_rank]
            return world._like(own, theirs, name, root_rank)
        return self._run(run, tensors, name, needs_peers=root_rank != self.rank)

    def fake_broadcast_object(self, obj, root_rank=0, name=None):
        self.calls.append(Call("broadcast_object", name, obj))
        if root_rank == self.rank:
            return obj
        return self._peer_values(name, obj, {root_rank}, exact=False)[root_rank]

    def fake_gather_rows(self, rows, name=None):
        own = tf.convert_to_tensor(rows).numpy()
        held = self._peer_values(name, own, set(self.others))
        gathered = []
        for r in range(self.workers):
            theirs = own if r == self.rank else np.asarray(held[r], own.dtype)
            if theirs.shape[1:] != own.shape[1:]:
                raise BadPeerValues(f"gather_rows {name!r}: rank {r}'s rows have shape "
                                    f"{theirs.shape}, this worker's {own.shape}")
            gathered.append(tf.constant(theirs))
        self.calls.append(Call("gather_rows", name, own))
        return gathered

    def fake_average_scalars(self, values, name="scalars"):
        own = {k: float(v) for k, v in values.items()}
        if not own:
            return {}
        held = self._peer_values(name, own, set(self.others))
        for r, theirs in held.items():
            if set(theirs) != set(own):
                raise BadPeerValues(f"average_scalars {name!r}: rank {r} holds "
                                    f"{sorted(theirs)}, this worker {sorted(own)}")
        self.calls.append(Call("average_scalars", name, own))
        return {k: float(np.mean([own[k]] + [float(held[r][k]) for r in sorted(held)]))
                for k in own}

    def fake_peer_group(self) -> comm.WorkerGroup | None:
        sizes = {len(h) for h in self.hosts}
        if len(self.hosts) < 2 or len(sizes) != 1 or sizes == {1}:
            return None
        place = self._my_host().index(self.rank)
        return comm.WorkerGroup(tuple(h[place] for h in self.hosts), len(self.hosts))

    def fake_alltoall(self, tensor, name=None, group=None):
        """Part i (of one equal part per worker of `group`, by default all, along the first
        axis) of every such worker's tensor goes to its i-th worker, in rank order: this
        worker gets its part of each."""
        ranks = _group_ranks(self, group)

        def run(world, own):
            by_rank = world._by_rank("alltoall", name, own, ranks)
            place = ranks.index(world.rank)
            return [np.concatenate([np.split(by_rank[r][0], len(ranks))[place] for r in ranks])]
        return self._run(run, [tensor], name)[0]

    def fake_allgather(self, tensor, name=None, group=None):
        ranks = _group_ranks(self, group)

        def run(world, own):
            by_rank = world._by_rank("allgather", name, own, ranks)
            return [np.concatenate([by_rank[r][0] for r in ranks])]
        shape = tf.TensorShape([len(ranks) * tensor.shape[0], *tensor.shape[1:]])
        return self._run(run, [tensor], name, shapes=[shape])[0]

    # --- the machinery ---

    def _by_rank(self, kind: str, name, own: list[np.ndarray], ranks=None,
                 fp16: bool = False) -> dict[int, list[np.ndarray]]:
        """The values of every worker of `ranks` (by default all) for the collective `name`,
        this one's included; the call is recorded."""
        everyone = ranks is None or len(ranks) == self.workers
        ranks = range(self.workers) if ranks is None else ranks
        wanted = set(ranks) - {self.rank}
        # Workers of a group make their collective under the name another group uses too
        # (each within its own process set): the held sends of all of them may be given.
        held = self._peer_values(name, own, wanted, exact=everyone)
        by_rank = {r: self._like(own, held[r], name, r) for r in wanted}
        by_rank[self.rank] = own
        self.calls.append(Call(kind, name, own, fp16))
        return by_rank

    def _allreduce(self, kind: str, tensors, name, fp16: bool, ranks: tuple[int, ...]):
        if self.rank not in ranks:
            raise BadPeerValues(f"{kind} {name!r}: this worker (rank {self.rank}) is not in "
                                f"the group {ranks}")
        if len(ranks) == 1:
            return list(tensors)  # a group of one: comm skips the collective too

        def run(world, own):
            by_rank = world._by_rank(kind, name, own, ranks, fp16)
            return [_reduce([by_rank[r][i] for r in ranks], kind == "average", fp16)
                    for i in range(len(own))]
        return self._run(run, tensors, name)

    def _run(self, fn, tensors, name, needs_peers: bool = True,
             shapes=None) -> list[tf.Tensor]:
        """`fn(world, values)` on the tensors' values (numpy): now when eager, or when the
        graph runs, in the world installed then (a traced round outlives the world it was
        traced in, and must use the values held for the round that runs it). `shapes`: the
        outputs' (by default the inputs')."""
        tensors = [tf.convert_to_tensor(t) for t in tensors]
        if not tensors:
            return []
        if tf.executing_eagerly():
            return [tf.convert_to_tensor(v) for v in fn(self, [t.numpy() for t in tensors])]
        if needs_peers:  # fail while tracing, with our message rather than TF's wrapping
            self._held_for(name)
        outputs = tf.py_function(lambda *ts: fn(_installed_world(), [t.numpy() for t in ts]),
                                 tensors, [t.dtype for t in tensors])
        for output, shape in zip(outputs, shapes or [t.shape for t in tensors]):
            output.set_shape(shape)
        return list(outputs)

    def _held_for(self, name) -> Held:
        held = self._held.get(name)
        if held is None and self.peers is not None:
            held = self.peers(name)
        if held is None:
            raise MissingPeerValues(
                f"collective {name!r}: the test holds no values of the other workers for it "
                f"(it holds: {sorted(map(repr, self._held))})")
        return held

    def _peer_values(self, name, own, wanted: set[int], exact: bool = True) -> Mapping[int, Any]:
        held = self._held_for(name)
        if held is ECHO:
            return dict.fromkeys(wanted, own)
        if callable(held):
            held = held(own)
        if (set(held) != wanted) if exact else not wanted <= set(held):
            raise BadPeerValues(f"collective {name!r}: values held for ranks {sorted(held)}, "
                                f"but it needs ranks {sorted(wanted)}")
        return held

    @staticmethod
    def _like(own: list[np.ndarray], theirs, name, rank: int) -> list[np.ndarray]:
        """Another worker's values as this worker's dtypes; their count and shapes must match."""
        if isinstance(theirs, (np.ndarray, tf.Tensor)) or len(theirs) != len(own):
            raise BadPeerValues(f"collective {name!r}: rank {rank} must hold a list of "
                                f"{len(own)} values, one per tensor this worker sends")
        converted = []
        for i, (mine, value) in enumerate(zip(own, theirs)):
            value = np.asarray(value, dtype=mine.dtype)
            if value.shape != mine.shape:
                raise BadPeerValues(f"collective {name!r}: rank {rank}'s value {i} has shape "
                                    f"{value.shape}, this worker's {mine.shape}")
            converted.append(value)
        return converted


def sent_by(rank: int, workers: int, run: Callable[[], Any],
            **world_options) -> dict[str | None, Any]:
    """What worker `rank` of `workers` hands to each collective, by name, when it runs
    `run()`: the same code, run as that worker, so a test need not write down what the
    code sends. Its peers echo what it sends, since the collectives' results are thrown
    away: `run` should make no collective that depends on an earlier one's result.
    `world_options`: FakeComm's other arguments (`hosts`)."""
    return _sent_given(rank, workers, run, {}, world_options)


def settled_sends(workers: int, make_run: Callable[[int], Callable[[], Any]],
                  passes: int = 2, **world_options) -> dict[int, dict[str | None, Any]]:
    """What every worker hands to each collective, by rank and name, where a later send
    depends on an earlier collective's result (a compressed round's allgather sends the
    sum of what its alltoall brought, `hvdtrain.keras.compressed_rounds`). Each pass runs
    every worker's `make_run(k)()` in a world whose peers send what they sent in the pass
    before (at first, echo): `passes` is one more than the longest chain of such
    collectives. The run must leave no state that changes its next pass's sends."""
    sent: dict[int, dict[str | None, Any]] = {}
    for _ in range(passes):
        sent = {k: _sent_given(k, workers, make_run(k), sent, world_options)
                for k in range(workers)}
    return sent


def _sent_given(rank: int, workers: int, run: Callable[[], Any],
                sent: Mapping[int, Mapping[str | None, Any]], world_options) -> dict:
    world = FakeComm(workers, rank, peers=lambda name: ECHO, **world_options)
    world.hold_sent({k: by_name for k, by_name in sent.items() if k != rank})
    with world:
        run()
    return {call.name: call.sent for call in world.calls}
