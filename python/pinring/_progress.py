"""The one-line progress view of ``pinring.Loader(progress=...)``.

    pinring epoch 2  412/1251  33% [00:12<00:25]  1520.3 batch/s  21.4 GB/s  bound: loaders

Batches/s counts the batches the loop took; GB/s and the verdict come from the ring's own
counters (``Consumer.status()``, what ``pinring status`` reads) over the last interval, judged by
the same code as ``pinring status`` (``_native.bound``):

* ``loaders``: the daemon waited for batches: add loaders, or make them faster;
* ``upload``: loaders waited for free slots while the copy to the device was busy;
* ``consumer``: loaders waited for free slots held by batches the training step (the ring's
  consumer) has not released: the step is the limit, which is where a fed GPU should be;
* ``balanced``: neither side waited much; ``idle``: nothing moved;
* ``unknown``: the loaders' own figures the verdict weighs failed the daemon's check (another
  process wrote into the ring), so there is no verdict.

The words are the daemon summary's ``bound`` and ``pinring status``'s, one vocabulary.

On a terminal the line is redrawn in place every 0.5 s, as tqdm's is; elsewhere (``progress=True``
with stderr a file or a pipe) one line is written every 10 s.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Dict, Optional, TextIO

from pinring import _native

def _clock(seconds: float) -> str:
    s = int(max(0.0, seconds))
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60:02d}:{rest % 60:02d}"


def _bytes_rate(gbps: float) -> str:
    return f"{gbps:.1f} GB/s" if gbps >= 1 else f"{gbps * 1e3:.0f} MB/s"


class Progress:
    """Draws the line for one loader; ``update`` after each batch, ``end_epoch`` at an epoch's end."""

    def __init__(self, stream: Optional[TextIO] = None, interval: Optional[float] = None) -> None:
        self._out: TextIO = sys.stderr if stream is None else stream
        self._tty = bool(getattr(self._out, "isatty", lambda: False)())
        self._interval = interval if interval is not None else (0.5 if self._tty else 10.0)
        self._last: Optional[Dict[str, Any]] = None  # the ring's counters at the last draw
        self._last_t = 0.0
        self._last_batches = 0
        self._batches = 0
        self._epoch_start: Optional[float] = None
        self._rate = 0.0
        self._gbps = 0.0
        self._bound = "idle"
        self._drawn = False

    def update(self, consumer: _native.Consumer, epoch: int, index: int, per_epoch: int) -> None:
        """Batch ``index`` of epoch ``epoch`` (of ``per_epoch``) was taken."""
        now = time.monotonic()
        if self._epoch_start is None:
            self._epoch_start = now
            self._last_t = now
            self._last = self._read(consumer)
        self._batches += 1
        if now - self._last_t < self._interval and index + 1 < per_epoch:
            return
        snap = self._read(consumer)
        seconds = now - self._last_t
        if self._last is not None and snap is not None and seconds > 0:
            a, b = self._last, snap

            def d(key: str) -> float:
                return max(0.0, float(b[key]) - float(a[key]))

            self._gbps = d("bytes_out") / seconds / 1e9
            untrusted = [f for s in (a, b) for f in s.get("untrusted", [])
                         if f.startswith("loader_")]
            self._bound = "unknown" if untrusted else _native.bound(
                seconds, int(d("delivered")), d("daemon_wait_seconds"),
                d("loader_wait_seconds"), d("loader_busy_seconds"), d("upload_seconds"))
            self._rate = (self._batches - self._last_batches) / seconds
        self._last, self._last_t, self._last_batches = snap, now, self._batches
        self._draw(epoch, index + 1, per_epoch, now)

    @staticmethod
    def _read(consumer: _native.Consumer) -> Optional[Dict[str, Any]]:
        try:
            snap: Dict[str, Any] = json.loads(consumer.status())
            return snap
        except _native.PinringError:
            return None  # a closed consumer: the line keeps its last figures

    def _draw(self, epoch: int, done: int, per_epoch: int, now: float) -> None:
        assert self._epoch_start is not None
        elapsed = now - self._epoch_start
        left = (per_epoch - done) / self._rate if self._rate > 0 else 0.0
        width = len(str(per_epoch))
        line = (f"pinring epoch {epoch}  {done:>{width}}/{per_epoch} {100 * done // per_epoch:3d}% "
                f"[{_clock(elapsed)}<{_clock(left)}]  {self._rate:.1f} batch/s  "
                f"{_bytes_rate(self._gbps)}  bound: {self._bound}")
        try:
            if self._tty:
                self._out.write("\r" + line + "\x1b[K")
            else:
                self._out.write(line + "\n")
            self._out.flush()
        except (OSError, ValueError):
            return  # a closed or broken stderr never stops the loop
        self._drawn = True

    def end_epoch(self) -> None:
        """The epoch is over, or the loader closed: the line stays, and the next epoch draws a
        new one."""
        if self._drawn and self._tty:
            try:
                self._out.write("\n")
                self._out.flush()
            except (OSError, ValueError):
                pass
        self._drawn = False
        self._epoch_start = None
        self._batches = self._last_batches = 0
        self._rate = 0.0
