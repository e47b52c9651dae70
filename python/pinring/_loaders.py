"""The ``pinring-loader`` processes that ``pinring.Loader(loaders=N)`` starts beside its
embedded daemon, and their supervision by ``pinring run``'s own books (``_native.Supervisor``):
a loader killed by a signal is started again (each loader up to 5 times in any 60 s), a loader
that fails (bad data: exit 3, and every other code but 0 and 5) is raised in the training loop
with its own message, and all of them stop with the loader.

They die with the training process without help: their daemon is a thread of it, and a loader
whose daemon is gone exits (``PeerDied``, exit 5) within a quarter of a second
(docs/RELIABILITY.md). They take no config: each adopts the spec its daemon stored in the ring.
Their logs are memfds (``pinring._memfd``): nothing of theirs is on disk for a killed trainer to
leave behind."""

from __future__ import annotations

import os
import subprocess
import time
from typing import List, Optional, Sequence

from pinring import _memfd, _native
from pinring._programs import program

# How long close() waits for loaders to leave after SIGTERM before it kills them.
_STOP_GRACE = 1.0


class _Loaders:
    def __init__(self, n: int, ticket: _native.RingTicket,
                 cpus: Optional[Sequence[int]]) -> None:
        """Starts ``n`` loaders of the ring ``ticket`` names (at its path, an anonymous
        ring's), each adopting the spec the ring's daemon stored in it (``pinring-loader`` with no
        ``--config``); each loader's stdout and stderr go into a memfd of its own. On any
        failure, stops those already started."""
        if n < 1:
            raise _native.UsageError(f"loaders={n}: start at least 1 loader, or pass loaders=0")
        self._cpus = list(cpus) if cpus is not None else None
        if self._cpus is not None and not self._cpus:
            raise _native.UsageError("loaders_cpus=[]: name at least one CPU, or leave it out")
        self.procs: List[Optional["subprocess.Popen[bytes]"]] = [None] * n
        self._logs: List[Optional[int]] = [None] * n
        self._argv = program("pinring-loader") + ["--ring", ticket.ring, "--wait-secs", "60"]
        if ticket.path is not None:
            self._argv += ["--ring-path", ticket.path]
        self._books = _native.Supervisor(n, time.monotonic())
        self.finished = [False] * n
        try:
            for i in range(n):
                self._start(i)
        except BaseException:
            self.stop()
            raise

    def _start(self, i: int) -> None:
        log = _memfd.holding(f"pinring-loader-{i}-log")
        try:
            p = subprocess.Popen(self._argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                 env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")})
        except BaseException:
            os.close(log)
            raise
        old, self._logs[i] = self._logs[i], log
        if old is not None:
            os.close(old)
        if self._cpus is not None:
            try:
                os.sched_setaffinity(p.pid, {self._cpus[i % len(self._cpus)]})
            except OSError as e:
                p.kill()
                p.wait()
                raise _native.UsageError(
                    f"loaders_cpus={self._cpus}: cannot pin loader {i} to CPU "
                    f"{self._cpus[i % len(self._cpus)]} ({e}); name CPUs this process may use "
                    f"({sorted(os.sched_getaffinity(0))})"
                ) from None
        self.procs[i] = p

    def _last_lines(self, i: int) -> str:
        """What loader ``i`` printed last, as the end of a message: ``": its last lines:\n..."``,
        or ``" (it printed nothing)"``."""
        log = self._logs[i]
        tail = "" if log is None else _memfd.tail(log)
        return f"; its last lines:\n{tail}" if tail else " (it printed nothing)"

    def check(self) -> None:
        """Looks at every loader and does what ``pinring run`` does (``_native.Supervisor``):
        restarts one killed by a signal, leaves one that finished (exit 0) or saw its daemon go
        (exit 5), and raises for any other (the loader's own code and its last lines). Of
        several that ended together, one that failed for its own reason (bad data, exit 3) is
        raised before one that found the ring gone while starting (exit 4)."""
        ended = []
        for i, p in enumerate(self.procs):
            if p is None or self.finished[i]:
                continue
            code = p.poll()
            if code is not None:
                ended.append((code == 4, i, p, code))
        for _, i, p, code in sorted(ended, key=lambda e: (e[0], e[1])):
            what = self._books.ended(i, p.pid, code, time.monotonic())
            if what == "restart":
                self._start(i)
            elif what == "leave":
                self.finished[i] = True
            else:
                self.finished[i] = True
                failure = self._books.failure()
                assert failure is not None
                exit_code, sentence = failure
                message = sentence + self._last_lines(i)
                try:
                    err = _native._error_for_exit(exit_code, message)
                except ValueError:
                    err = _native.InternalError(message)
                raise err

    def pids(self) -> List[int]:
        return [p.pid for p in self.procs if p is not None and p.poll() is None]

    def stop(self) -> None:
        """SIGTERM to every loader; SIGKILL to those still there after ``_STOP_GRACE``."""
        live = [p for p in self.procs if p is not None and p.poll() is None]
        for p in live:
            try:
                p.terminate()
            except OSError:
                pass
        deadline = time.monotonic() + _STOP_GRACE
        for p in live:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for fd in self._logs:
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._logs = [None] * len(self._logs)
