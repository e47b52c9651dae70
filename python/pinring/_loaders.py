"""The ``pinring-loader`` processes that ``pinring.Loader(loaders=N)`` starts beside its
embedded daemon, and their supervision: a loader killed by a signal is started again (each
loader up to ``_RESTARTS`` times in any ``_RESTART_WINDOW`` seconds, as ``pinring run``'s), a
loader that fails (bad data: exit 3, and every other code) is
raised in the training loop with its own message, and all of them stop with the loader.

They die with the training process without help: their daemon is a thread of it, and a loader
whose daemon is gone exits (``PeerDied``, exit 5) within a quarter of a second
(docs/RELIABILITY.md). Their config and their logs are memfds (``pinring._memfd``): nothing of
theirs is on disk for a killed trainer to leave behind."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import deque
from typing import Deque, List, Optional, Sequence

from pinring import _memfd, _native
from pinring._programs import program

# Restarts of one killed loader allowed in any window of _RESTART_WINDOW seconds, as
# ``pinring run`` allows each of its loaders (docs/RELIABILITY.md, "Restarts").
_RESTARTS = 5
_RESTART_WINDOW = 60.0
# How long close() waits for loaders to leave after SIGTERM before it kills them.
_STOP_GRACE = 1.0


class _Loaders:
    def __init__(self, n: int, ring: str, path: Optional[str], config: str,
                 cpus: Optional[Sequence[int]]) -> None:
        """Starts ``n`` loaders of ring ``ring`` (at ``path``, an anonymous ring's) on the
        config text ``config`` (the daemon's own, resolved), held in a memfd that every loader
        gets as ``--config /proc/self/fd/N``; each loader's stdout and stderr go into a memfd of
        its own. On any failure, stops those already started."""
        if n < 1:
            raise _native.UsageError(f"loaders={n}: start at least 1 loader, or pass loaders=0")
        self._cpus = list(cpus) if cpus is not None else None
        if self._cpus is not None and not self._cpus:
            raise _native.UsageError("loaders_cpus=[]: name at least one CPU, or leave it out")
        self.procs: List[Optional["subprocess.Popen[bytes]"]] = [None] * n
        self._logs: List[Optional[int]] = [None] * n
        self._config = _memfd.holding("pinring-loaders-config", config)
        # The loaders' own descriptor of the same number (pass_fds keeps it).
        self._argv = program("pinring-loader") + ["--ring", ring, "--config",
                                                   _memfd.path(self._config), "--wait-secs", "60"]
        if path is not None:
            self._argv += ["--ring-path", path]
        self._restarts: List[Deque[float]] = [deque() for _ in range(n)]
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
                                 pass_fds=(self._config,),
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
        """Looks at every loader: restarts one killed by a signal, raises for one that failed.
        Of several failed loaders, one that failed for its own reason (bad data, exit 3) is
        raised before those that only saw their daemon stop the run (exit 5, or 4 for one that
        was starting and found the ring gone)."""
        failed = []
        for i, p in enumerate(self.procs):
            if p is None or self.finished[i]:
                continue
            code = p.poll()
            if code is None:
                continue
            if code == 0:
                self.finished[i] = True  # the daemon ended the run
            elif code < 0:
                self._restart(i, p, code)
            else:
                failed.append((code in (4, 5), i, p, code))
        if failed:
            _, i, p, code = min(failed)
            log = self._logs[i]
            tail = "" if log is None else _memfd.tail(log)
            message = (f"loader {i} (pid {p.pid}) failed with exit code {code}:\n{tail}" if tail
                       else f"loader {i} (pid {p.pid}) failed with exit code {code} (it printed "
                       "nothing)")
            try:
                err = _native._error_for_exit(code, message)
            except ValueError:
                err = _native.InternalError(message)
            raise err

    def _restart(self, i: int, p: "subprocess.Popen[bytes]", code: int) -> None:
        now = time.monotonic()
        restarts = self._restarts[i]
        while restarts and now - restarts[0] > _RESTART_WINDOW:
            restarts.popleft()
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        if len(restarts) >= _RESTARTS:
            raise _native.PeerDied(
                f"loader {i} (pid {p.pid}) was killed by {name}, its {_RESTARTS + 1}th death "
                f"within {_RESTART_WINDOW:.0f} s after {_RESTARTS} restarts: not restarting it "
                "again (look for what kills it: the OOM killer, a watchdog)"
                f"{self._last_lines(i)}"
            )
        restarts.append(now)
        self._start(i)

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
        for fd in [self._config, *self._logs]:
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._logs = [None] * len(self._logs)
        self._config = -1
