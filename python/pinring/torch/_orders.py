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
from typing import Optional

import numpy as np

from pinring import _memfd


class OrderTable:
    """``depth`` rows of ``positions`` sample indices (int64), each headed by its epoch."""

    def __init__(self, table: mmap.mmap, positions: int, depth: int) -> None:
        self.positions = int(positions)
        self.depth = int(depth)
        self._map = table
        values = np.frombuffer(self._map, dtype=np.int64)
        self._heads = values[: self.depth]
        self._rows = values[self.depth:].reshape(self.depth, self.positions)

    @classmethod
    def create(cls, positions: int, depth: int) -> "tuple[OrderTable, int]":
        """A new table in a memfd (close-on-exec), every row empty; the table and the memfd."""
        table, fd = _memfd.new_table("pinring-torch-orders", 8 * depth * (1 + positions))
        orders = cls(table, positions, depth)
        orders._heads[:] = -1
        return orders, fd

    @classmethod
    def open(cls, path: str, positions: int, depth: int) -> "OrderTable":
        """The table the training process made, read-only, from its ``/proc/<pid>/fd/<fd>``."""
        table = _memfd.open_table(
            path, 8 * depth * (1 + positions),
            f"the sample-order table of {depth} epochs of {positions} positions", writable=False,
        )
        return cls(table, positions, depth)

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
