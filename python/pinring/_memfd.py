"""Text kept in memfds instead of files: the configs that ``pinring.Loader`` and
``pinring.torch.DataLoader`` hand to their daemons, loaders and workers, and the loaders' logs.
A memfd has no name on disk and is freed with the last process holding it, so a trainer ended
in any way (SIGKILL included) leaves none of them behind. A process opens one at
``/proc/<pid>/fd/<fd>`` of a process holding it (``/proc/self/fd/<fd>`` for its own, or a
child's given the descriptor with ``pass_fds``), as the anonymous ring is opened."""

from __future__ import annotations

import mmap
import os
from typing import Optional, Tuple


def holding(label: str, text: str = "") -> int:
    """A new memfd (close-on-exec) labelled ``label``, holding ``text``; its descriptor."""
    fd = os.memfd_create(label, os.MFD_CLOEXEC)
    data = text.encode()
    try:
        while data:
            data = data[os.write(fd, data):]
    except BaseException:
        os.close(fd)
        raise
    return fd


def new_table(label: str, size: int) -> Tuple[mmap.mmap, int]:
    """A new memfd (close-on-exec) labelled ``label`` of ``size`` zero bytes, mapped shared and
    writable: the map and the descriptor (which keeps it alive for the processes that open it
    at ``path``)."""
    fd = holding(label)
    try:
        os.ftruncate(fd, size)
        return mmap.mmap(fd, size), fd
    except BaseException:
        os.close(fd)
        raise


def open_table(at: str, size: int, what: str, writable: bool) -> mmap.mmap:
    """The table another process made with ``new_table``, mapped from ``at`` (its
    ``/proc/<pid>/fd/<fd>``); a ``RingError`` naming ``what`` if it is not ``size`` bytes."""
    from pinring import _native

    fd = os.open(at, (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC)
    try:
        found = os.fstat(fd).st_size
        if found != size:
            raise _native.RingError(
                f"{what} at {at} holds {found} bytes, not {size}: it is not this loader's"
            )
        return mmap.mmap(fd, size, prot=mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0))
    finally:
        os.close(fd)


def path(fd: int, pid: Optional[int] = None) -> str:
    """Where a process opens memfd ``fd`` of process ``pid`` (None: its own)."""
    return f"/proc/{'self' if pid is None else pid}/fd/{fd}"


def tail(fd: int, lines: int = 12, limit: int = 8192) -> str:
    """The last ``lines`` lines of what was written into memfd ``fd`` (of its last ``limit``
    bytes), read without moving its offset; "" if it holds nothing or is gone."""
    try:
        size = os.fstat(fd).st_size
        data = os.pread(fd, min(size, limit), max(0, size - limit))
    except OSError:
        return ""
    text = data.decode("utf-8", "replace")
    return "\n".join(text.strip().splitlines()[-lines:])
