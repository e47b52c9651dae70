"""Sample orders that a torch sampler draws, for ``pinring.torch.DataLoader``'s workers.

pinring's own plan (identity, a seeded shuffle, ``DistributedSampler``'s shards) is computed
the same way in every process, so the workers need nothing from the training process. Any other
``sampler`` or ``batch_sampler`` draws its order in the training process, as torch's DataLoader
does; the plan then runs over positions (identity, one shard) and a worker turns position ``p``
of epoch ``e`` into ``order[e][p]``, read from a table that the training process fills:

* the table is a memfd (nothing on disk, gone with the last process holding it), opened by the
  workers at ``/proc/<pid>/fd/<fd>``, as the loader's ring and config are;
* it holds ``depth`` epochs' orders in rotation, epoch ``e`` in row ``e % depth``, each row
  headed by the epoch it holds (-1: none yet), written after the row's indices;
* the training process fills epochs ahead of its loop, as far as the ring lets workers run
  ahead of it (``DataLoader._publish_orders``), so a worker never finds its epoch missing; one
  that does reports it as an error rather than use another epoch's order.
"""

from __future__ import annotations

import mmap
import os
from typing import Optional

import numpy as np

from pinring import _memfd, _native


class OrderTable:
    """``depth`` rows of ``positions`` sample indices (int64), each headed by its epoch."""

    def __init__(self, fd: int, positions: int, depth: int, writable: bool) -> None:
        self.positions = int(positions)
        self.depth = int(depth)
        size = 8 * self.depth * (1 + self.positions)
        self._map = mmap.mmap(fd, size, prot=mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0))
        table = np.frombuffer(self._map, dtype=np.int64)
        self._heads = table[: self.depth]
        self._rows = table[self.depth:].reshape(self.depth, self.positions)

    @classmethod
    def create(cls, positions: int, depth: int) -> "tuple[OrderTable, int]":
        """A new table in a memfd (close-on-exec), every row empty; the table and the memfd."""
        fd = _memfd.holding("pinring-torch-orders")
        try:
            os.ftruncate(fd, 8 * depth * (1 + positions))
            table = cls(fd, positions, depth, writable=True)
        except BaseException:
            os.close(fd)
            raise
        table._heads[:] = -1
        return table, fd

    @classmethod
    def open(cls, path: str, positions: int, depth: int) -> "OrderTable":
        """The table the training process made, read-only, from its ``/proc/<pid>/fd/<fd>``."""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            want = 8 * depth * (1 + positions)
            if size != want:
                raise _native.RingError(
                    f"the sample-order table at {path} holds {size} bytes, not the {want} of "
                    f"{depth} epochs of {positions} positions: it is not this loader's"
                )
            return cls(fd, positions, depth, writable=False)
        finally:
            os.close(fd)

    def publish(self, epoch: int, order: np.ndarray) -> None:
        """Epoch ``epoch``'s order: its indices first, then the row's head."""
        row = epoch % self.depth
        self._heads[row] = -1
        self._rows[row, :] = order
        self._heads[row] = epoch

    def order(self, epoch: int) -> Optional[np.ndarray]:
        """Epoch ``epoch``'s order (a copy), or None if its row holds another epoch."""
        row = epoch % self.depth
        if int(self._heads[row]) != epoch:
            return None
        order = self._rows[row].copy()
        # The row may have been refilled while it was copied: only a head still naming the
        # epoch after the copy vouches for it.
        return order if int(self._heads[row]) == epoch else None
