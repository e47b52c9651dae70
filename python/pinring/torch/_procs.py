"""How ``pinring.torch.DataLoader``'s worker processes are made, watched and ended.

Every worker is forked from a **zygote**: a single-threaded process that holds the loader's
dataset and does nothing but fork workers when asked, reap them and report how each ended. The
zygote is made before the loader's daemon starts, so no worker is ever a copy of a process with
pinring's threads running or its rings' files open (a thread's lock or a ring's file lock would
be copied held).

- ``fork`` (torch's default on Linux up to Python 3.13): the zygote is forked from the training
  process, so the dataset reaches it, and every worker, by inheritance: nothing is pickled. If
  this process already holds pinring rings or threads (another loader's daemon runs), the zygote
  is forked from a zygote made earlier instead, and the dataset is pickled to it once.
- ``spawn`` and ``forkserver``: multiprocessing starts the zygote with that method, the dataset is
  pickled once into a memfd that the zygote reads, and the workers are forked from the zygote,
  all at once. The zygote imports the script's main module as multiprocessing's children do;
  a script without ``if __name__ == "__main__":`` would start a loader again from there, which
  the zygote detects: it ends with ``NO_MAIN_GUARD``, and the training process raises a
  ``UsageError`` that says so.

Nothing outlives the training process: a zygote watches it through a pidfd and, when it ends in
any way (SIGKILL included), kills its workers and ends; a worker has ``PR_SET_PDEATHSIG``
(SIGKILL) on its zygote. Zygotes and workers ignore SIGINT: Ctrl-C is the training process's to
handle, and it stops them. Reports travel over a ``SOCK_SEQPACKET`` socket (one message per
report, never interleaved), the stop flag is a byte of a shared memfd: no semaphore, no named
object.
"""

from __future__ import annotations

import contextlib
import gc
import mmap
import multiprocessing
import os
import pickle
import select
import signal
import socket
import sys
import threading
import time
import warnings
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Tuple

from pinring import _native

# A zygote that found itself imported by a script with no main guard ends with this status.
NO_MAIN_GUARD = 86
# Seconds the training process waits for a zygote's answer before it calls the zygote hung.
_ANSWER_WAIT = 60.0
# The name of a zygote started by multiprocessing.
_ZYGOTE_NAME = "pinring-zygote"
# The largest report a worker sends (a traceback is cut to fit).
_REPORT_MAX = 64 * 1024


class Payload(NamedTuple):
    """What a zygote holds for its workers: the same for every worker and every start."""

    dataset: Any
    collate_fn: Any
    worker_init_fn: Any


class HeldDataset:
    """Stands in a sibling's payload for the dataset of the zygote that forks it, which holds
    the same object (``Zygote._fork``)."""


def start_method(asked: Any) -> str:
    """The start method for ``multiprocessing_context``: None is the one torch's DataLoader
    would use (multiprocessing's default on this Python: ``fork`` on Linux up to 3.13,
    ``forkserver`` from 3.14); a context or a method's name is that method."""
    if asked is None:
        method = multiprocessing.get_start_method()
    elif isinstance(asked, str):
        method = asked
    elif callable(getattr(asked, "get_start_method", None)):
        method = asked.get_start_method()
    else:
        raise _native.UsageError(
            "multiprocessing_context option should be a valid context object or a string "
            f"specifying the start method, but got multiprocessing_context={asked!r}"
        )
    if method not in ("fork", "spawn", "forkserver"):
        raise _native.UsageError(
            "multiprocessing_context option should specify a valid start method in "
            f"['fork', 'spawn', 'forkserver'], but got multiprocessing_context={asked!r} "
            "(None: multiprocessing's default, as torch's DataLoader)"
        )
    return method


def loading_main_module() -> bool:
    """Whether this process is a spawned (or forkserver) child still importing the training
    script as its main module: a loader started there comes from a script without a main
    guard."""
    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))


def refuse_in_zygote_import() -> None:
    """Ends a zygote that is importing a training script which starts a loader at its top level
    (no main guard): its status tells the training process, which raises the error there."""
    if loading_main_module() and multiprocessing.current_process().name == _ZYGOTE_NAME:
        sys.stderr.write(f"pinring: {no_main_guard_error('spawn')}\n")
        sys.stderr.flush()
        os._exit(NO_MAIN_GUARD)


def no_main_guard_error(method: str) -> Exception:
    return _native.UsageError(
        f"pinring.torch.DataLoader: workers started with {method!r} import this script again, "
        "and this script starts the loader at its top level, so each worker would start another "
        "loader. Put the training code under `if __name__ == \"__main__\":`, or pass "
        "multiprocessing_context=\"fork\" (the workers then inherit the dataset and never "
        "import the script)"
    )


# -- the reports and the stop flag -------------------------------------------------------------


class Reports:
    """Workers' reports to the training process: one pickled tuple per ``SOCK_SEQPACKET``
    message. ``put`` in a worker; ``empty``/``get`` in the training process, never blocking."""

    def __init__(self) -> None:
        self.reader, self.writer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.reader.setblocking(False)
        self._pending: List[Any] = []

    def empty(self) -> bool:
        if not self._pending:
            try:
                data = self.reader.recv(_REPORT_MAX + 4096)
            except BlockingIOError:
                return True
            self._pending.append(pickle.loads(data))
        return False

    def get(self) -> Any:
        if self.empty():
            raise IndexError("no report")
        return self._pending.pop(0)

    def close(self) -> None:
        self.reader.close()
        self.writer.close()


class _ReportWriter:
    """A worker's end of ``Reports``."""

    def __init__(self, fd: int) -> None:
        self.sock = socket.socket(fileno=fd)

    def put(self, report: Tuple[Any, ...]) -> None:
        data = pickle.dumps(report)
        if len(data) > _REPORT_MAX:
            worker_id, kind, index, exc_type, text = report
            cut = text[-(_REPORT_MAX // 2):]
            data = pickle.dumps((worker_id, kind, index, exc_type, "[...]\n" + cut))
        self.sock.send(data)


class StopFlag:
    """A byte of a shared memfd: the training process sets it, workers look at it."""

    def __init__(self, fd: Optional[int] = None) -> None:
        if fd is None:
            fd = os.memfd_create("pinring-stop", os.MFD_CLOEXEC)
            os.ftruncate(fd, mmap.PAGESIZE)
        self.fd = fd
        self.map = mmap.mmap(fd, mmap.PAGESIZE)

    def set(self) -> None:
        self.map[0] = 1

    def clear(self) -> None:
        self.map[0] = 0

    def is_set(self) -> bool:
        return self.map[0] != 0

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)


# -- messages between the training process and a zygote ---------------------------------------


def _send(sock: socket.socket, msg: Tuple[Any, ...], fds: Tuple[int, ...] = ()) -> None:
    data = pickle.dumps(msg)
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def _recv(sock: socket.socket) -> Tuple[Optional[Tuple[Any, ...]], List[int]]:
    """(message, fds), or (None, []) at the end of the stream: the peer closed its end, with
    messages it never read (ECONNRESET on a ``SOCK_SEQPACKET`` socket: a training process
    interrupted while its zygote's exit reports were on the way) or without."""
    try:
        data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 8)
    except ConnectionResetError:
        return None, []
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    return pickle.loads(data), fds


class _Fd:
    """A file descriptor handed to a process that multiprocessing starts (its ``DupFd``)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> Any:
        from multiprocessing import reduction

        return (_Fd._rebuild, (reduction.DupFd(self.fd),))

    @staticmethod
    def _rebuild(dup: Any) -> "_Fd":
        return _Fd(dup.detach())


# -- the zygote, from the training process's side ----------------------------------------------


class Zygote:
    """A zygote, as the training process sees it: asks it for workers, learns how they end."""

    # Zygotes of this process that still run, any of which can make a sibling.
    _alive: List["Zygote"] = []
    _lock = threading.Lock()

    def __init__(self, payload: Payload, method: str) -> None:
        self.method = method
        # The dataset this zygote holds (as it was when the zygote was made): a loader made
        # later over the same object has its zygote forked from this one, nothing pickled.
        self.dataset = payload.dataset
        self.proc: Any = None
        self.pid = 0
        self.codes: Dict[int, Optional[int]] = {}  # worker pid -> exit code (None: alive)
        self._forked: Dict[int, int] = {}  # worker_id -> pid, answered
        self.dead = False
        self.child_pid = 0
        me = os.pidfd_open(os.getpid())
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            if method == "fork":
                self._fork(payload, ours, theirs, me)
            else:
                self._spawn(payload, ours, theirs, me)
        finally:
            theirs.close()
            os.close(me)
        self.ctl = ours
        msg = self._answer("ready")
        self.pid = msg[1]
        with Zygote._lock:
            Zygote._alive.append(self)

    def _fork(self, payload: Payload, ours: socket.socket, theirs: socket.socket, me: int) -> None:
        if _native._live_rings() == 0:
            # Nothing of pinring's runs here: fork this process (the dataset is inherited).
            others = [z.ctl.fileno() for z in Zygote._alive]
            with warnings.catch_warnings(), _frozen():
                # Python 3.12 warns of any fork of a process with threads (torch's, CUDA's).
                # The child runs only the zygote's loop (sockets, select, fork, pickle): no lock
                # of those threads is taken there, and os.fork holds the import lock across the
                # fork; what must not be copied, pinring's threads and rings, is not running
                # (_live_rings() is 0).
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
            if pid == 0:
                try:
                    _child_of_trainer(ours, others)
                    _serve(theirs, me, payload)  # never returns
                finally:
                    os._exit(1)
            self.child_pid = pid
            return
        with Zygote._lock:
            alive = [z for z in Zygote._alive if not z.dead]
        if not alive:
            # pinring threads run here and no zygote exists: start a clean one as spawn does.
            self.method = "spawn"
            self._spawn(payload, ours, theirs, me)
            return
        # pinring threads run here: a clean zygote forks the new one; the payload is pickled
        # once, into a memfd. A zygote that holds this very dataset forks it with its own copy:
        # only the collate_fn and worker_init_fn are pickled.
        holder = next((z for z in alive if z.dataset is payload.dataset), None)
        memfd = _pickled(payload if holder is None else payload._replace(dataset=HeldDataset()),
                         sibling=True)
        try:
            _send((holder or alive[0]).ctl, ("sibling",), (theirs.fileno(), memfd, me))
        finally:
            os.close(memfd)

    def _spawn(self, payload: Payload, ours: socket.socket, theirs: socket.socket, me: int) -> None:
        memfd = _pickled(payload)
        try:
            ctx: Any = multiprocessing.get_context(self.method)
            self.proc = ctx.Process(
                target=_spawned_zygote, args=(_Fd(theirs.fileno()), _Fd(memfd), _Fd(me)),
                name=_ZYGOTE_NAME, daemon=True,
            )
            self.proc.start()
        finally:
            os.close(memfd)

    def _answer(self, kind: str, wait: Optional[float] = _ANSWER_WAIT,
                late: Optional[Exception] = None) -> Tuple[Any, ...]:
        """Reads messages until one of `kind` comes (taking the exit reports on the way), for
        `wait` seconds (None: as long as the zygote lives); then raises `late`, or PeerDied."""
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            left = 0.1 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                if late is not None:
                    raise late
                raise _native.PeerDied(
                    f"pinring DataLoader's zygote (pid {self.pid}) did not answer within "
                    f"{wait:.0f} s"
                )
            ready, _, _ = select.select([self.ctl], [], [], min(left, 0.1))
            if not ready:
                self._check_spawned()
                continue
            msg, _ = _recv(self.ctl)
            if msg is None:
                self._ended()
                self._check_spawned(ended=True)
                raise _native.PeerDied(
                    "pinring DataLoader's zygote (the process its workers are forked from) ended "
                    "unexpectedly; the log above may say why"
                )
            self._take(msg)
            if msg[0] == kind:
                return msg

    def _check_spawned(self, ended: bool = False) -> None:
        if self.proc is None:
            return
        if ended:
            self.proc.join(5.0)
        code = self.proc.exitcode
        if code == NO_MAIN_GUARD:
            self.dead = True
            raise no_main_guard_error(self.method)
        if code is not None:
            self.dead = True
            raise _native.PeerDied(
                f"pinring DataLoader's zygote, started with {self.method!r}, exited with status "
                f"{code} before it was ready (the dataset could not be unpickled there?); the "
                "log above says why"
            )

    def _take(self, msg: Tuple[Any, ...]) -> None:
        if msg[0] == "exit":
            _, pid, code = msg
            self.codes[pid] = code
        elif msg[0] == "forked":
            self.codes.setdefault(msg[2], None)

    def _ended(self) -> None:
        self.dead = True
        for pid, code in self.codes.items():
            if code is None:
                self.codes[pid] = -signal.SIGKILL  # PR_SET_PDEATHSIG
        with Zygote._lock:
            if self in Zygote._alive:
                Zygote._alive.remove(self)

    def pump(self) -> None:
        """Takes every message waiting (exit reports), without blocking."""
        while not self.dead:
            ready, _, _ = select.select([self.ctl], [], [], 0)
            if not ready:
                return
            msg, _ = _recv(self.ctl)
            if msg is None:
                self._ended()
                return
            self._take(msg)

    def session(self, reports: Reports, stop: StopFlag) -> None:
        """Hands the zygote this start's report socket and stop flag, which its next workers
        get."""
        _send(self.ctl, ("session",), (reports.writer.fileno(), stop.fd))

    def layout(self, job: Dict[str, Any], wait: Optional[float]) -> Tuple[str, Any, str]:
        """The dataset's layout, learned in a process the zygote forks and sets up as worker 0
        (``_worker._layout_job``, whose result this is).
        Waits ``wait`` seconds (None: as long as the zygote and that process live)."""
        if self.dead:
            raise _native.PeerDied("pinring DataLoader's zygote has ended: no worker can be made")
        _send(self.ctl, ("layout", job))
        result: Tuple[str, Any, str] = self._answer("layout", wait, layout_timeout(wait))[1]
        return result

    def fork(self, args: Dict[str, Any], go: Optional[int] = None) -> int:
        """Has the zygote fork a worker with ``args`` (``_worker._WorkerArgs``'s, less what the
        zygote holds); ``go``: the worker's end of a socket it waits on for its ring
        (``_pool.EarlyWorkers``). Returns the worker's pid."""
        if self.dead:
            raise _native.PeerDied("pinring DataLoader's zygote has ended: no worker can be made")
        _send(self.ctl, ("fork", args), () if go is None else (go,))
        return int(self._answer("forked")[2])

    def exitcode(self, pid: int) -> Optional[int]:
        self.pump()
        return self.codes.get(pid, -signal.SIGKILL)

    def kill(self, pid: int) -> None:
        if not self.dead and self.codes.get(pid, 0) is None:
            try:
                _send(self.ctl, ("kill", pid))
            except OSError:
                pass

    def wait(self, pid: int, deadline: float) -> Optional[int]:
        """Waits until worker `pid` has ended or `deadline` (time.monotonic) passes."""
        while not self.dead and self.codes.get(pid, 0) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select([self.ctl], [], [], left)
            if ready:
                self.pump()
        return self.exitcode(pid)

    def close(self) -> None:
        """Ends the zygote and its workers."""
        with Zygote._lock:
            if self in Zygote._alive:
                Zygote._alive.remove(self)
        if not self.dead:
            self.dead = True
            try:
                _send(self.ctl, ("end",))
            except OSError:
                pass
        self.ctl.close()
        if self.proc is not None:
            self.proc.join(2.0)
            if self.proc.exitcode is None:
                self.proc.kill()
                self.proc.join(2.0)
        elif self.child_pid:
            _reap(self.child_pid, 2.0)


@contextlib.contextmanager
def _frozen() -> Iterator[None]:
    """Around a fork: every object of this process moves to the garbage collector's permanent
    generation (``gc.freeze``), so a child never collects its copy of one. A copied object whose
    finaliser ran in a worker (a batch tensor of an earlier loader, in a reference cycle that was
    garbage) would run the parent's teardown there: join a thread that does not exist in the
    child (a panic, then SIGSEGV, seen on the H200) or free CUDA memory of the parent's context.
    The parent's objects are collectable again after the fork (``gc.unfreeze``)."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()  # in the parent: a child never comes back here (it ends in os._exit)


def _reap(pid: int, wait: float) -> None:
    deadline = time.monotonic() + wait
    fd = os.pidfd_open(pid)
    try:
        while True:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return
            select.select([fd], [], [], left)
    except ChildProcessError:
        return
    finally:
        os.close(fd)


def _pickled(payload: Payload, sibling: bool = False) -> int:
    """The payload pickled once, in a memfd (``sibling``: for a zygote forked from another
    one, this process running pinring threads)."""
    fd = os.memfd_create("pinring-dataset", os.MFD_CLOEXEC)
    try:
        with os.fdopen(os.dup(fd), "wb") as f:
            pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        os.close(fd)
        # The same type, so `except` clauses written for torch's DataLoader still match.
        raise type(e)(f"{e}: {_unpicklable_note(payload, sibling)}") from e
    return fd


def _unpicklable_note(payload: Payload, sibling: bool) -> str:
    """What to do about a payload that does not pickle, naming the part that does not."""
    culprits = []
    for name in Payload._fields:
        try:
            pickle.dumps(getattr(payload, name), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001 - any failure names the part
            culprits.append("dataset" if name == "dataset" else name)
    which = " and ".join(culprits) or "the dataset, collate_fn or worker_init_fn"
    if sibling:
        return (
            f"pinring.torch.DataLoader could not pickle its {which} to start its workers: this "
            "loader was made while another loader of this process ran, so its workers come "
            "from a fresh zygote the running loader's forks, and what they need is pickled to "
            "it. Make this loader before the other's first for (its zygote is then forked from "
            "this process and inherits them), or define them at a module's top level, not in a "
            "function or as a lambda"
        )
    return (
        f"pinring.torch.DataLoader could not pickle its {which} to start its workers (with the "
        "'spawn' and 'forkserver' start methods they are pickled once to a fresh zygote "
        "process): define them at a module's top level, not in a function or as a lambda, or "
        "pass multiprocessing_context='fork'"
    )


def _unpickled(fd: int) -> Payload:
    with os.fdopen(fd, "rb") as f:
        f.seek(0)
        size = os.fstat(f.fileno()).st_size
        with mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as m:
            payload: Payload = pickle.loads(m)
            return payload


# -- the zygote, inside ----------------------------------------------------------------------


def _child_of_trainer(ours: socket.socket, others: List[int]) -> None:
    """Right after the fork of a zygote from the training process: lets go of the training
    process's ends of its sockets."""
    ours.close()
    for fd in others:
        try:
            os.close(fd)
        except OSError:
            pass


def _spawned_zygote(ctl: _Fd, payload: _Fd, trainer: _Fd) -> None:
    """A zygote started by multiprocessing (spawn, forkserver): reads the payload, serves."""
    sock = socket.socket(fileno=ctl.fd)
    _serve(sock, trainer.fd, _unpickled(payload.fd))


def _serve(ctl: socket.socket, trainer: int, payload: Payload) -> None:
    """The zygote's loop: forks workers on request, reports how each ends; ends (killing its
    workers) when the training process ends (`trainer`, its pidfd, is readable), when told, or
    when its socket closes. Never returns."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # What this zygote holds now (the training process's copies, the payload) is never collected
    # here or in a worker: see _frozen.
    gc.freeze()
    workers: Dict[int, int] = {}  # pidfd -> pid
    siblings: Dict[int, int] = {}  # pidfd -> pid (zygotes forked from this one)
    layouts: Dict[int, Tuple[int, List[bytes]]] = {}  # pipe -> (pid, what it sent so far)
    session: List[int] = []
    me = os.getpid()
    try:
        _send(ctl, ("ready", me))
        while True:
            watched: List[Any] = [ctl, trainer, *workers, *siblings, *layouts]
            ready, _, _ = select.select(watched, [], [])
            if trainer in ready:
                return
            for pfd in ready:
                if pfd in layouts:
                    chunk = os.read(pfd, 1 << 16)
                    if chunk:
                        layouts[pfd][1].append(chunk)
                        continue
                    pid, chunks = layouts.pop(pfd)
                    os.close(pfd)
                    _, status = os.waitpid(pid, 0)
                    _send(ctl, ("layout", _layout_result(b"".join(chunks), status, pid)))
                elif pfd in siblings:
                    os.waitpid(siblings.pop(pfd), 0)
                    os.close(pfd)
                elif pfd in workers:
                    pid = workers.pop(pfd)
                    os.close(pfd)
                    _, status = os.waitpid(pid, 0)
                    _send(ctl, ("exit", pid, os.waitstatus_to_exitcode(status)))
            if ctl not in ready:
                continue
            msg, fds = _recv(ctl)
            if msg is None or msg[0] == "end":
                return
            if msg[0] == "session":
                for fd in session:
                    os.close(fd)
                session = fds
            elif msg[0] == "kill":
                if msg[1] in workers.values():
                    os.kill(msg[1], signal.SIGKILL)
            elif msg[0] == "layout":
                r, w = os.pipe2(os.O_CLOEXEC)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    os.close(r)
                    _layout_child(me, [ctl.fileno(), trainer, *workers, *siblings, *layouts,
                                       *session], w, msg[1], payload)
                os.close(w)
                layouts[r] = (pid, [])
            elif msg[0] == "fork":
                args = msg[1]
                if fds:
                    args["go"] = fds[0]
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _worker_child(me, [ctl.fileno(), trainer, *workers, *siblings], session,
                                  args, payload)
                for fd in fds:
                    os.close(fd)
                workers[os.pidfd_open(pid)] = pid
                _send(ctl, ("forked", args["worker_id"], pid))
            elif msg[0] == "sibling":
                new_ctl, memfd, their_trainer = fds
                pid = os.fork()
                if pid == 0:
                    for fd in [ctl.fileno(), trainer, *workers, *siblings, *session]:
                        os.close(fd)
                    try:
                        theirs = _unpickled(memfd)
                        if isinstance(theirs.dataset, HeldDataset):
                            theirs = theirs._replace(dataset=payload.dataset)
                        _serve(socket.socket(fileno=new_ctl), their_trainer, theirs)
                    finally:
                        os._exit(1)
                for fd in fds:
                    os.close(fd)
                siblings[os.pidfd_open(pid)] = pid
    except BaseException:  # noqa: BLE001 - a zygote that fails ends its workers and itself
        import traceback

        traceback.print_exc()
    finally:
        for pid in workers.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for pid in workers.values():
            try:
                os.waitpid(pid, 0)
            except OSError:
                pass
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _layout_child(zygote: int, inherited: List[int], out: int, job: Dict[str, Any],
                  payload: Payload) -> None:
    """The process that learns the layout (``_worker._layout_job``), right after its fork from
    the zygote: writes the pickled result to ``out``. Never returns."""

    def body() -> None:
        from pinring.torch._worker import _layout_job

        data = pickle.dumps(_layout_job(payload.dataset, payload.collate_fn,
                                        payload.worker_init_fn, job))
        with os.fdopen(out, "wb") as f:
            f.write(data)

    _forked_child(zygote, inherited, body)


def layout_timeout(wait: Optional[float]) -> Exception:
    """The error of a layout that did not come within ``timeout=`` (``wait`` seconds)."""
    return _native.Timeout(
        f"DataLoader timed out after {wait or 0:g} seconds: pinring DataLoader's worker 0 "
        f"did not load sample 0 (which tells the batches' fields) within timeout={wait} s"
    )


def torch_words(pid: int, code: int) -> str:
    """What torch's DataLoader says of a worker that died so, for scripts that match it."""
    if code < 0:
        return f"DataLoader worker (pid {pid}) is killed by signal: {signal.strsignal(-code)}. "
    return f"DataLoader worker (pid(s) {pid}) exited unexpectedly. "


def _layout_result(data: bytes, status: int, pid: int) -> Tuple[str, Any, str]:
    """What the layout's process sent, or why it sent nothing."""
    if data:
        try:
            result: Tuple[str, Any, str] = pickle.loads(data)
            return result
        except Exception as e:  # noqa: BLE001 - a result that does not unpickle: say so
            return "error", RuntimeError, f"the layout of the dataset could not be read: {e}"
    return "error", RuntimeError, died_learning_layout(pid, os.waitstatus_to_exitcode(status))


def died_learning_layout(pid: int, code: int, worker: int = 0) -> str:
    """What is said of worker ``worker`` (pid ``pid``) ended with ``code`` before the layout
    came (worker 0 learns it from sample 0; another loads a first sample meanwhile)."""
    how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
    what = "sample 0 (to learn the batches' fields)" if worker == 0 else "its first sample"
    return (
        f"{torch_words(pid, code)}pinring DataLoader worker {worker} {how} while loading "
        f"{what}; the log above may say why"
    )


def _worker_child(zygote: int, inherited: List[int], session: List[int], args: Dict[str, Any],
                  payload: Payload) -> None:
    """A worker, right after its fork from the zygote. Never returns."""

    def body() -> None:
        reports_fd, stop_fd = session
        from pinring.torch._worker import _WorkerArgs, _worker_main

        full = _WorkerArgs(dataset=payload.dataset, collate_fn=payload.collate_fn,
                           worker_init_fn=payload.worker_init_fn, **args)
        _worker_main(full, _ReportWriter(reports_fd), StopFlag(stop_fd))

    _forked_child(zygote, inherited, body)


def _forked_child(zygote: int, inherited: List[int], body: Callable[[], None]) -> None:
    """Runs ``body`` in a process just forked from the zygote: dies with the zygote, closes the
    zygote's own descriptors, and exits 0 after ``body`` returns, 1 (with the traceback on
    stderr) after it raises. Never returns."""
    code = 1
    try:
        if not _native._die_with_parent(int(signal.SIGKILL), zygote):
            os._exit(1)
        for fd in inherited:
            os.close(fd)
        body()
        code = 0
    except BaseException:  # noqa: BLE001
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
