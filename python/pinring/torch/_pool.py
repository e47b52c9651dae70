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
import os
import pickle
import queue as _queue
import select
import socket
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
    ``_Worker``) that reports on ``reports`` and looks at ``stop_flag`` between parts.
    ``books`` (``_native.Supervisor``, policy ``"workers"``, or ``"stream"`` for an iterable
    dataset's) are the loader's restart books, which live across its passes: they say whether a
    worker that ended is started again and count the restarts over the loader's life;
    ``lease_text()`` names the ring's lease for the warnings."""

    def __init__(self, spawn: Callable[[int, Any, Any], _Worker], reports: Any, stop_flag: Any,
                 ring_name: str, books: _native.Supervisor,
                 lease_text: Callable[[], str]) -> None:
        # The loader's methods, held weakly: the loader holds its pool, and a pool holding the
        # loader back would keep a loader its script has dropped alive, with its workers and
        # daemon, until the cycle collector ran.
        self._spawn_worker = _weakly(spawn)
        self.reports = reports
        self.stop_flag = stop_flag
        self.ring_name = ring_name
        # A new run of the books: a failure booked in an earlier pass is forgotten, the
        # restarts stay counted.
        self.books = books
        books.next_run()
        self._lease_text = _weakly(lease_text)
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
              session: Optional[Tuple[_procs.Reports, _procs.StopFlag]] = None,
              **kwargs: Any) -> "WorkerPool":
        """Starts ``count`` workers: processes forked from ``zygote``, or, without one, a thread
        of this process (``num_workers=0``). ``session``: the reports and stop flag that
        workers already forked (``EarlyWorkers.hand_over``) report on and look at."""
        reports: Any
        stop_flag: Any
        if session is not None:
            reports, stop_flag = session
        elif zygote is None:
            reports = _queue.SimpleQueue()
            stop_flag = threading.Event()
        else:
            reports = _procs.Reports()
            stop_flag = _procs.StopFlag()
            zygote.session(reports, stop_flag)
        pool = cls(spawn, reports, stop_flag, **kwargs)
        try:
            for i in range(count):
                pool.workers.append(pool.spawn(i))
        except BaseException:
            pool.stop(grace=0)  # the workers started, the reports and the stop flag
            raise
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
            if self.books.ended(worker_id, w.pid, code, time.monotonic()) == "restart":
                log.warning(
                    "pinring DataLoader worker %d %s; restarted it (%d of %d restarts); the "
                    "batch part it held is made again", worker_id, how, self.books.restarts,
                    self.books.max_restarts,
                )
                self.workers[i] = self.spawn(worker_id)
                continue
            # An iterable dataset's workers are never restarted (_stream: a dead one is an
            # error); a map-style dataset's, until max_worker_restarts are spent.
            if self.books.policy == "stream":
                raise _native.PeerDied(
                    f"{_procs.torch_words(w.pid, code)}pinring DataLoader worker {worker_id} {how}, "
                    "while iterating its copy of "
                    "the IterableDataset: its place in its stream is lost, and a worker started "
                    "again would iterate its share from the start (its samples twice), so an "
                    f"iterable dataset's workers are not restarted; {fix}"
                )
            raise _native.PeerDied(
                f"{_procs.torch_words(w.pid, code)}pinring DataLoader worker {worker_id} {how}, "
                f"after {self.books.restarts} "
                f"restarts of workers (max_worker_restarts={self.books.max_restarts}); {fix}"
            )
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
            if kind == "layout":
                continue  # an early worker's (EarlyWorkers.layout takes the one that counts)
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


class EarlyWorkers:
    """A map-style loader's workers at its first start, forked before its ring exists, so that
    the batches' fields come from the first worker's first samples and every worker's first
    sample is read in that worker, all of them at once, as in torch's DataLoader: a dataset
    whose ``__getitem__`` waits until every worker is inside it (a barrier) starts, and a
    resource a dataset opens in its first ``__getitem__`` is opened once, in the process that
    keeps it.

    Each is set up as its worker (worker info, seeds, ``worker_init_fn``, once); worker 0 reads
    the samples the layout is learned from (``layout``), each other worker one sample, which it
    lets go (these reads are the only ones not delivered); then each waits on its own socket for
    its ring (``adopt``). Those not adopted end with ``close``."""

    def __init__(self, zygote: _procs.Zygote, args: Callable[[int], Dict[str, Any]],
                 count: int) -> None:
        self.zygote = zygote
        self.reports: Optional[_procs.Reports] = _procs.Reports()
        self.stop_flag: Optional[_procs.StopFlag] = _procs.StopFlag()
        zygote.session(self.reports, self.stop_flag)
        # worker id -> (pid, this process's end of the socket its ring goes over)
        self.waiting: Dict[int, Tuple[int, socket.socket]] = {}
        try:
            for worker_id in range(count):
                end, go = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    pid = zygote.fork(args(worker_id), go=go.fileno())
                except BaseException:
                    end.close()
                    raise
                finally:
                    go.close()
                self.waiting[worker_id] = (pid, end)
        except BaseException:
            self.close()
            raise

    def layout(self, wait: Optional[float], late: Exception) -> Tuple[str, Any, str]:
        """Worker 0's layout, as ``_worker._layout_job`` returns one: ``("ok", layout, "")``,
        ``("usage", type, message)``, or ``("error", type, message)`` for an exception in any
        worker's first sample (or worker 0's death). Waits ``wait`` seconds (None: as long as
        worker 0 lives), then raises ``late``."""
        assert self.reports is not None
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            # A worker reports, then ends: the exits are looked at first, then the reports.
            codes = {k: self.zygote.exitcode(pid) for k, (pid, _) in self.waiting.items()}
            while not self.reports.empty():
                worker_id, kind, _, what, message = self.reports.get()
                if kind == "layout":
                    result: Tuple[str, Any, str] = pickle.loads(what)
                    return result
                if kind == "error":
                    return "error", what, message
            # Any worker ended without a report: worker 0 cannot be waited for (a dataset whose
            # __getitem__ waits for every worker would wait for good).
            for worker_id, code in sorted(codes.items()):
                if code is not None:
                    pid = self.waiting[worker_id][0]
                    return "error", RuntimeError, _procs.died_learning_layout(pid, code,
                                                                              worker_id)
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise late
            # A report, or the zygote's word of a worker's end (or the zygote's own).
            select.select([self.reports.reader, self.zygote.ctl], [], [], left)

    def adopt(self, worker_id: int, ring: Dict[str, Any]) -> Optional[int]:
        """Sends waiting worker ``worker_id`` its ``ring`` (``_worker.RING_ARGS``); its pid, or
        None where there is none waiting (a worker is forked instead). A worker that cannot
        take it (it died meanwhile) is killed and its pid returned all the same: the pool sees
        it ended and restarts it as any worker that dies, counted and said."""
        pid, end = self.waiting.pop(worker_id, (0, None))
        if end is None:
            return None
        data = pickle.dumps(ring)
        data = len(data).to_bytes(8, "little") + data  # its length first: _worker reads to it
        try:
            # The socket takes it at once (a layout is a few kB): a worker still inside its
            # first sample reads it after. MSG_NOSIGNAL: a dead worker's end is an error here,
            # never a SIGPIPE, whatever the script made of that signal.
            sent = end.send(data, socket.MSG_NOSIGNAL | socket.MSG_DONTWAIT) == len(data)
        except OSError:
            sent = False
        finally:
            end.close()
        if not sent:
            self.zygote.kill(pid)
        return pid

    def hand_over(self) -> Tuple[_procs.Reports, _procs.StopFlag]:
        """The reports and stop flag of these workers, for the pool that adopts them."""
        assert self.reports is not None and self.stop_flag is not None
        session = (self.reports, self.stop_flag)
        self.reports = self.stop_flag = None
        return session

    def close(self) -> None:
        """Ends the workers not adopted: the stop flag set and their sockets closed (each ends
        at once when it has let its first sample go), then killed after ``STOP_GRACE``."""
        if self.stop_flag is not None:
            self.stop_flag.set()
        for _, end in self.waiting.values():
            end.close()
        deadline = time.monotonic() + STOP_GRACE
        for pid, _ in self.waiting.values():
            if self.zygote.wait(pid, deadline) is None:
                self.zygote.kill(pid)
        self.waiting = {}
        if self.reports is not None and self.stop_flag is not None:
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
