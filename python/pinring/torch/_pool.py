"""The workers of one pass of a ``pinring.torch.DataLoader`` over its ring: started together
(forked from the zygote, or threads of this process with ``num_workers=0``), their reports
read, the dead ones restarted, and all of them stopped within a deadline.

The pool raises what a worker reported, and names a worker that died; it never stops the
loader itself: the loader stops everything (workers, its consumer, the embedded daemon) when a
call here raises.
"""

from __future__ import annotations

import inspect
import logging
import pickle
import queue as _queue
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, TypeVar

from pinring import _native
from pinring.torch import _procs
from pinring.torch._worker import _Worker

log = logging.getLogger("pinring.torch")

# How long a stopping worker is given to leave by itself before it is killed (seconds).
STOP_GRACE = 0.4


class WorkerPool:
    """The workers of one pass. ``spawn(worker_id, reports, stop_flag)`` starts one worker (a
    ``_Worker``) that reports on ``reports`` and looks at ``stop_flag`` between parts. ``restarts`` counts the workers restarted over the loader's life, this pass
    included; ``lease_text()`` names the ring's lease for the warnings."""

    def __init__(self, spawn: Callable[[int, Any, Any], _Worker], reports: Any, stop_flag: Any,
                 ring_name: str, max_restarts: int, restarts: int,
                 lease_text: Callable[[], str], stream: bool = False) -> None:
        # The loader's methods, held weakly: the loader holds its pool, and a pool holding the
        # loader back would keep a loader its script has dropped alive, with its workers and
        # daemon, until the cycle collector ran.
        self._spawn_worker = _weakly(spawn)
        self.reports = reports
        self.stop_flag = stop_flag
        self.ring_name = ring_name
        self.max_restarts = max_restarts
        self.restarts = restarts
        self._lease_text = _weakly(lease_text)
        # An iterable dataset's workers: never restarted (_stream; a dead one is an error).
        self.stream = stream
        # Their streams' places after each batch: worker -> batch -> snapshot (_stream).
        self.states: Dict[int, Dict[int, Any]] = {}
        self.workers: List[_Worker] = []
        self.done: Set[int] = set()  # ids of workers that saw the plan end
        # Why a worker left: the ring's error under its claim (its type, its report).
        self.left: Dict[int, Tuple[Any, str]] = {}
        self.last_check = time.monotonic()

    @classmethod
    def start(cls, zygote: Optional[_procs.Zygote], count: int,
              spawn: Callable[[int, Any, Any], _Worker],
              **kwargs: Any) -> "WorkerPool":
        """Starts ``count`` workers: processes forked from ``zygote``, or, without one, a thread
        of this process (``num_workers=0``)."""
        if zygote is None:
            reports: Any = _queue.SimpleQueue()
            stop_flag: Any = threading.Event()
        else:
            reports = _procs.Reports()
            stop_flag = _procs.StopFlag()
            zygote.session(reports, stop_flag)
        pool = cls(spawn, reports, stop_flag, **kwargs)
        pool.workers = [pool.spawn(i) for i in range(count)]
        pool.last_check = time.monotonic()
        return pool

    def spawn(self, worker_id: int) -> _Worker:
        """Starts worker ``worker_id`` (again)."""
        self.done.discard(worker_id)
        self.left.pop(worker_id, None)
        return self._spawn_worker(worker_id, self.reports, self.stop_flag)

    def alive(self) -> int:
        """Workers still running."""
        return sum(w.exitcode() is None for w in self.workers)

    def check(self, restart: bool = True, idle: bool = False,
              between: Callable[[], None] = lambda: None) -> None:
        """Raises a worker's exception; calls ``between`` (the loader's look at the ring's
        leases); restarts workers that died, and workers that ended with no report while the
        ring still runs (``restart=False``: the ring has just ended under the loop, so a
        worker's leaving is no news). A worker that ended because the ring failed under its
        claim is not restarted: the loop's own wait fails the same way; ``idle`` (the loop has
        just waited for a batch in vain) with every worker ended and one of them so, that
        failure is raised.

        Exit codes are read before the reports: a worker reports, then ends, so one seen ended
        has its report in the queue already. The other way round, a worker that reports and
        ends between the two looks would seem to have ended with no report."""
        self.last_check = time.monotonic()
        codes = [w.exitcode() for w in self.workers]
        self.read_reports()
        between()
        if not restart:
            return
        for i, (w, code) in enumerate(zip(self.workers, codes)):
            worker_id = w.args.worker_id
            ended = worker_id in self.done or worker_id in self.left
            if code is None or (code == 0 and ended):
                continue
            if code == 0:
                how = (
                    "exited with status 0 while the ring still needed it, with no error reported "
                    "(os._exit() in the dataset's code or in worker_init_fn, or in a library "
                    "they call, does this)"
                )
                fix = (
                    "a worker's process must live until the loader stops it: remove the call "
                    "that ends it"
                )
            else:
                how = _how(code)
                fix = (
                    "a dataset that crashes the interpreter at some index does this: run it "
                    "with num_workers=0 to see where"
                )
            if self.stream:
                raise _native.PeerDied(
                    f"{_procs.torch_words(w.pid, code)}pinring DataLoader worker {worker_id} {how}, "
                    "while iterating its copy of "
                    "the IterableDataset: its place in its stream is lost, and a worker started "
                    "again would iterate its share from the start (its samples twice), so an "
                    f"iterable dataset's workers are not restarted; {fix}"
                )
            if self.restarts >= self.max_restarts:
                raise _native.PeerDied(
                    f"{_procs.torch_words(w.pid, code)}pinring DataLoader worker {worker_id} {how}, "
                    f"after {self.restarts} "
                    f"restarts of workers (max_worker_restarts={self.max_restarts}); {fix}"
                )
            self.restarts += 1
            log.warning(
                "pinring DataLoader worker %d %s; restarted it (%d of %d restarts); the batch "
                "part it held is made again", worker_id, how, self.restarts, self.max_restarts,
            )
            self.workers[i] = self.spawn(worker_id)
        reported = self.done.union(self.left)
        if idle and self.left and all(
            code is not None and w.args.worker_id in reported
            for w, code in zip(self.workers, codes)
        ):
            worker_id, (exc_type, why) = next(iter(self.left.items()))
            _reraise(exc_type, (
                f"pinring DataLoader worker {worker_id} ended because ring {self.ring_name!r} "
                f"failed under its claim ({why}), and no worker is left to make batches; that "
                "failure (the ring's daemon gone or stopped) must be fixed first"
            ))

    def forget_states(self, worker: int, batch: int) -> None:
        """Drops worker ``worker``'s stream places older than ``batch`` (its batch just taken:
        a state saved from now on names this one or a later one)."""
        states = self.states.get(worker)
        if states:
            for b in [b for b in states if b < batch]:
                del states[b]

    def read_reports(self) -> None:
        """Takes every report the workers sent; raises a worker's exception."""
        while not self.reports.empty():
            worker_id, kind, index, exc_type, message = self.reports.get()
            if kind == "done":
                self.done.add(worker_id)
                continue
            if kind == "state":
                # The stream's place after batch ``index``, pickled by the worker.
                self.states.setdefault(worker_id, {})[index] = pickle.loads(exc_type)
                continue
            if kind == "ring":
                self.left[worker_id] = (exc_type, message)
                continue
            if kind == "reclaimed":
                log.warning(
                    "pinring DataLoader worker %d: %s. Loading it took longer than the ring's "
                    "lease (%s), so its samples are loaded again; each time a part outlives the "
                    "lease its work is lost: pass lease_ms= longer than the slowest part takes "
                    "(or raise daemon.lease_ms in the ring's config with ring=)",
                    worker_id, message, self._lease_text(),
                )
                continue
            _reraise(exc_type, message)

    def stop(self, late: Callable[[], None] = lambda: None, grace: float = STOP_GRACE) -> None:
        """Stops every worker: each looks at the flag between parts, and one still inside the
        dataset's code after ``grace`` (``STOP_GRACE``; 0 at Ctrl-C) is killed (it only writes host memory, and a part it
        held is the ring's to make again). Then ``late`` (the loader's last look at the leases)
        and the reports that came meanwhile are read, their errors dropped: a worker's error
        after the loop ended is not raised."""
        if self.stop_flag is not None:
            self.stop_flag.set()
        deadline = time.monotonic() + grace
        for w in self.workers:
            w.wait(deadline)
        for w in self.workers:
            w.kill()
        for w in self.workers:
            w.wait(time.monotonic() + STOP_GRACE)
        self.workers = []
        try:
            late()
            self.read_reports()
        except Exception:  # noqa: BLE001 - a worker's error after the loop ended is not raised
            pass
        if isinstance(self.reports, _procs.Reports):
            self.reports.close()
            self.stop_flag.close()
        self.reports = self.stop_flag = None


_R = TypeVar("_R")


def _weakly(fn: Callable[..., _R]) -> Callable[..., _R]:
    """``fn``, holding its object weakly when it is a bound method."""
    if not inspect.ismethod(fn):
        return fn
    ref: "weakref.WeakMethod[Callable[..., _R]]" = weakref.WeakMethod(fn)

    def call(*args: Any) -> _R:
        method = ref()
        if method is None:
            raise ReferenceError("pinring DataLoader: the loader of this worker pool is gone")
        return method(*args)

    return call


def _how(code: int) -> str:
    if code < 0:
        import signal

        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with status {code}"


def _reraise(exc_type: Any, message: str) -> None:
    if exc_type is KeyError:
        # KeyError's str() quotes its argument; keep the traceback readable, as torch does.
        class _KeyErrorMessage(str):
            def __repr__(self) -> str:
                return self

        message = _KeyErrorMessage(message)
    # The worker's own type, else the nearest builtin type it derives from that can be built
    # from a message (NumPy's MemoryError takes a shape and a dtype: MemoryError).
    for t in _own_then_builtin(exc_type):
        try:
            exc = t(message)
        except Exception:
            continue
        if isinstance(exc, BaseException):
            raise exc
    raise RuntimeError(message)


def _own_then_builtin(exc_type: Any) -> List[Any]:
    """``exc_type``, then its builtin bases (``MemoryError``, ``OSError``, ...) nearest first;
    none for no type."""
    if not isinstance(exc_type, type) or not issubclass(exc_type, BaseException):
        return []
    plain = (Exception, BaseException, object)
    return [exc_type] + [t for t in exc_type.__mro__[1:]
                         if t.__module__ == "builtins" and t not in plain]


def builtin_base(exc_type: Any) -> Any:
    """The nearest builtin exception type ``exc_type`` derives from (itself if builtin): what a
    worker sends for a type that does not pickle."""
    for t in _own_then_builtin(exc_type):
        if t.__module__ == "builtins":
            return t
    return None
