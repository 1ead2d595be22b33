"""K workers in threads of one process, each with its own `hvdtrain.comm` world, whose
collectives meet the other threads' for real.

`tests/fake_comm.py` runs one worker against values the test holds for the others; this
runs all K workers at once, so code whose later collectives depend on earlier ones
(`LocalSGD` inside `model.fit`: rounds, reports, the outer step) runs whole, as torchft
tests its manager with workers in threads. Each thread's `comm.*` calls go to its own
`ThreadWorker` (a `FakeComm` whose peers' values come from the other threads), and every
collective waits for the other threads' call of the same name, group and turn.

    results = run_workers(3, lambda rank: train_and_return_weights(rank))

Functions are run eagerly inside (`tf.config.run_functions_eagerly`): a collective inside
a traced function would wait on one of TensorFlow's few inter-op threads, and K waiting
at once could take them all. The horovodrun suites keep the traced path and the real
collectives covered.
"""

from __future__ import annotations

import collections
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

import tensorflow as tf

from fake_comm import COMM_FUNCTIONS, FAKE_PREFIX, PURE, Call, FakeComm, FakeCommError
from hvdtrain import comm
from hvdtrain.keras import overlap

# Seconds a collective waits for its peers before the test fails as hung.
WAIT_SECONDS = 120
# Each worker thread's world (and that of the rounds' threads it starts).
_THIS_THREAD = threading.local()


class CollectiveHung(FakeCommError):
    """A collective's peers never came (a deadlock in the code under test), or one of the
    other threads failed."""


class Rendezvous:
    """Where the threads' collectives meet: each posts its value under the collective's
    key and waits for the peers it needs."""

    def __init__(self, wait: float = WAIT_SECONDS):
        self.wait = wait
        self._posted: dict[tuple, dict[int, Any]] = collections.defaultdict(dict)
        self._changed = threading.Condition()
        self._failed: str | None = None

    def post(self, key: tuple, rank: int, value: Any) -> None:
        with self._changed:
            self._posted[key][rank] = value
            self._changed.notify_all()

    def exchange(self, key: tuple, rank: int, value: Any, wanted: set[int]) -> dict[int, Any]:
        with self._changed:
            self._posted[key][rank] = value
            self._changed.notify_all()
            came = self._changed.wait_for(
                lambda: self._failed or wanted <= set(self._posted[key]), timeout=self.wait)
            if self._failed:
                raise CollectiveHung(f"collective {key[1]!r}: {self._failed}")
            if not came:
                missing = sorted(wanted - set(self._posted[key]))
                raise CollectiveHung(f"collective {key[1]!r} (turn {key[-1]}) of rank {rank} "
                                     f"waited {self.wait:g} s for ranks {missing}")
            return {r: self._posted[key][r] for r in wanted}

    def fail(self, why: str) -> None:
        with self._changed:
            self._failed = why
            self._changed.notify_all()


class ThreadWorker(FakeComm):
    """Worker `rank` of a threaded world: a FakeComm whose peers are the other threads."""

    def __init__(self, workers: int, rank: int, rendezvous: Rendezvous,
                 hosts: Sequence[Sequence[int]] | None = None):
        super().__init__(workers, rank, hosts)
        self.rendezvous = rendezvous
        self._turns: collections.Counter = collections.Counter()

    def _turn(self, *key) -> tuple:
        turn = self._turns[key]
        self._turns[key] += 1
        return (*key, turn)

    def _held_for(self, name):
        return True  # the peers are live: nothing is held

    def _peer_values(self, name, own, wanted: set[int], exact: bool = True):
        key = self._turn("group", name, frozenset(wanted | {self.rank}))
        return self.rendezvous.exchange(key, self.rank, own, set(wanted))

    def _from_root(self, name, own, root: int):
        key = self._turn("broadcast", name)
        if self.rank == root:
            self.rendezvous.post(key, root, own)
            return own
        return self.rendezvous.exchange(key, self.rank, own, {root})[root]

    def fake_broadcast(self, tensors, root_rank=0, name=None):
        def run(world, own):
            world.calls.append(Call("broadcast", name, own))
            theirs = world._from_root(name, own, root_rank)
            return own if theirs is own else world._like(own, theirs, name, root_rank)
        return self._run(run, tensors, name)

    def fake_broadcast_object(self, obj, root_rank=0, name=None):
        self.calls.append(Call("broadcast_object", name, obj))
        return self._from_root(name, obj, root_rank)


def run_workers(workers: int, work: Callable[[int], Any],
                hosts: Sequence[Sequence[int]] | None = None,
                wait: float = WAIT_SECONDS) -> list[Any]:
    """`work(rank)` in `workers` threads, each in its own world of the job; their results
    in rank order. The first failure is raised (the others stop at their next collective)."""
    rendezvous = Rendezvous(wait)
    local = _THIS_THREAD
    results: list[Any] = [None] * workers
    failures: dict[int, BaseException] = {}

    def as_worker(rank: int) -> None:
        local.world = ThreadWorker(workers, rank, rendezvous, hosts)
        try:
            results[rank] = work(rank)
        except BaseException as exc:  # noqa: BLE001  (re-raised in the caller)
            failures[rank] = exc
            rendezvous.fail(f"rank {rank} failed: {type(exc).__name__}: {exc}")

    saved = {name: getattr(comm, name) for name in COMM_FUNCTIONS if name not in PURE}
    eager = tf.config.functions_run_eagerly()
    try:
        for name in saved:
            setattr(comm, name, _dispatched(name, local))
        # An overlapped round runs in a thread of the worker's own: it is that worker.
        overlap.ThreadPoolExecutor = _pool_of_the_submitter(local)
        tf.config.run_functions_eagerly(True)
        threads = [threading.Thread(target=as_worker, args=(rank,), name=f"worker-{rank}")
                   for rank in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        tf.config.run_functions_eagerly(eager)
        overlap.ThreadPoolExecutor = ThreadPoolExecutor
        for name, value in saved.items():
            setattr(comm, name, value)
    if failures:
        rank = min(failures, key=lambda r: isinstance(failures[r], CollectiveHung))
        raise failures[rank]
    return results


def this_worker() -> ThreadWorker:
    """The world of the worker whose thread calls, inside `run_workers`: e.g. to give it a
    new `world_id`, as an elastic reset gives the workers it keeps."""
    return _THIS_THREAD.world


def _dispatched(name: str, local: threading.local) -> Callable:
    def call(*args, **kwargs):
        fake = getattr(local.world, FAKE_PREFIX + name, None)
        if fake is None:
            raise FakeCommError(f"comm.{name} needs a real Horovod; the threaded world has none")
        return fake(*args, **kwargs)
    return call


def _pool_of_the_submitter(local: threading.local) -> type:
    """A ThreadPoolExecutor whose tasks run in the world of the thread that submitted them."""
    class InWorkersWorld(ThreadPoolExecutor):
        def submit(self, fn, /, *args, **kwargs):
            world = local.world

            def as_the_worker(*args, **kwargs):
                local.world = world
                return fn(*args, **kwargs)
            return super().submit(as_the_worker, *args, **kwargs)
    return InWorkersWorld
