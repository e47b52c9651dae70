"""An ``IterableDataset`` through the ring, in torch's order.

torch's DataLoader gives each worker its own copy of an iterable dataset (``get_worker_info()``
says which worker it is, so the dataset can split its stream) and yields the workers' batches
round-robin: batch ``r`` of worker 0, of worker 1, ..., then batch ``r + 1`` of each; a worker
whose stream has ended is passed over, and each worker's last batch may be short (or dropped,
with ``drop_last``). pinring keeps that order with the ring's plan as a numbering only:

* worker ``w`` of ``W`` makes every batch ``b`` with ``b % W == w`` (the ring's claim kept to
  those batches, ``Producer(only_batches=(w, W))``), its ``k``-th batch from its stream being
  batch ``w + k * W``; the plan's sample ids are not used;
* a batch has the plan's ``batch_size`` rows in the ring; a short one has only its first rows
  filled, and every batch after a worker's stream ended is empty (its slot committed unwritten);
* how many rows the short batch has, and which batch it is, the worker writes into an end table
  (``EndTable``, a memfd the training process made, one entry per worker) before it commits the
  batch's parts, so the training process, which reads the entry after the batch reached it, sees
  it; it yields the short batch's rows, skips the empty ones, and ends the ``for`` once every
  worker's stream has ended;
* each ``for`` runs its own workers and ring (as torch's workers are made anew for each epoch
  unless ``persistent_workers``): each worker iterates its dataset copy from the start.

What an iterable dataset keeps and what it cannot is in docs/PYTHON.md ("Iterable datasets").
"""

from __future__ import annotations

import mmap
import random
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

from pinring import _memfd, _native

# The plan of one for over an iterable dataset: a numbering of batches only, so many short
# epochs (the plan's memory grows with an epoch's samples, not with the epochs): 2**12 batches
# in each of 10**5 epochs. A stream that is longer ends with an error naming it.
STREAM_EPOCH_BATCHES = 1 << 12
STREAM_EPOCHS = 100_000


def stream_plan(batch_size: int) -> "Tuple[int, int]":
    """(samples per epoch, epochs) of the plan of one for over an iterable dataset."""
    return batch_size * STREAM_EPOCH_BATCHES, STREAM_EPOCHS


class EndTable:
    """Per worker, where its stream ended: ``[batch, rows]`` (int64), ``batch`` -1 while it
    runs. ``batch`` is the worker's first batch that is not full, ``rows`` its rows (0 for an
    empty one); every batch of the worker after it is empty."""

    def __init__(self, table: mmap.mmap, workers: int) -> None:
        self.workers = int(workers)
        self._map = table
        self._rows = np.frombuffer(self._map, dtype=np.int64).reshape(self.workers, 2)

    @classmethod
    def create(cls, workers: int) -> "Tuple[EndTable, int]":
        """A new table in a memfd (close-on-exec), no worker ended; the table and the memfd."""
        table, fd = _memfd.new_table("pinring-torch-stream-ends", 16 * workers)
        ends = cls(table, workers)
        ends._rows[:, 0] = -1
        return ends, fd

    @classmethod
    def open(cls, path: str, workers: int) -> "EndTable":
        """The table the training process made, from its ``/proc/<pid>/fd/<fd>``."""
        table = _memfd.open_table(path, 16 * workers,
                                  f"the stream-end table of {workers} workers", writable=True)
        return cls(table, workers)

    def end(self, worker: int, batch: int, rows: int) -> None:
        """Worker ``worker``'s stream ended at ``batch`` (``rows`` rows): rows first, the batch
        last, so a batch seen vouches for its rows."""
        self._rows[worker, 1] = rows
        self._rows[worker, 0] = batch

    def ended(self, worker: int) -> Optional[Tuple[int, int]]:
        """``(batch, rows)`` where worker ``worker``'s stream ended, or None while it runs."""
        batch = int(self._rows[worker, 0])
        if batch < 0:
            return None
        return batch, int(self._rows[worker, 1])


class StreamBook:
    """The training process's reading of one ``for``: for each batch that reaches it, how many
    of its rows to yield, and whether every worker's stream has ended."""

    def __init__(self, table: EndTable, batch_size: int,
                 resume: Optional["StreamState"] = None) -> None:
        self.table = table
        self.batch_size = batch_size
        # The workers whose streams ended, each worker's last batch taken (yielded or skipped),
        # and the batch after the last: a resumed state's to begin with.
        self.done: set[int] = set() if resume is None else set(resume.done)
        self.last: Dict[int, int] = {}
        self.next_batch = 0 if resume is None else resume.next_batch

    def rows(self, batch: int) -> int:
        """Rows of ``batch`` to yield (0: skip it); marks its worker done at its end."""
        w = batch % self.table.workers
        self.last[w] = batch
        self.next_batch = batch + 1
        ended = self.table.ended(w)
        if ended is None or batch < ended[0]:
            return self.batch_size
        self.done.add(w)
        return ended[1] if batch == ended[0] else 0

    @property
    def finished(self) -> bool:
        return len(self.done) == self.table.workers


def stateful(obj: Any) -> bool:
    """Whether ``obj`` keeps torchdata's ``Stateful`` protocol (``state_dict()`` and
    ``load_state_dict(state)``)."""
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None))


class StreamMaker:
    """A worker's stream, cut into its batches: batch ``b`` (``b % workers == worker``) is the
    worker's ``(b - worker) // workers``-th. Batches are drawn from the stream in order, as far
    as the part claimed needs, and kept until each of their parts was committed (a part the
    daemon took back after its lease is claimed again, and written again from what is kept).

    After each batch drawn, ``report(batch, snapshot)`` is told where the stream stands:
    ``{"drawn": samples drawn, "ended": bool}``, with the dataset's and its iterator's own
    ``state_dict()`` where they are ``Stateful``. A maker made from such a snapshot
    (``restore``, with ``first_batch`` its first batch) goes on from there: the dataset's and
    iterator's states loaded where they were saved, else the stream drawn again from its start
    and the samples drawn before skipped."""

    def __init__(self, dataset: Any, worker: int, workers: int, batch_size: int,
                 drop_last: bool, table: EndTable,
                 report: Callable[[int, Dict[str, Any]], None] = lambda b, s: None,
                 first_batch: int = 0, restore: Optional[Dict[str, Any]] = None) -> None:
        self.worker, self.workers = worker, workers
        self.batch_size, self.drop_last = batch_size, drop_last
        self.table = table
        self.dataset = dataset
        self.report = report
        # The first round whose batch is first_batch or later.
        self.next_round = max(0, -(-(first_batch - worker) // workers))
        self.kept: Dict[int, Tuple[List[Any], int]] = {}  # batch -> (samples, rows committed)
        self.drawn = 0
        self.it: Optional[Any] = None
        if restore is not None and restore.get("ended"):
            return
        if restore is not None and "dataset" in restore and stateful(dataset):
            dataset.load_state_dict(restore["dataset"])
        self.it = iter(dataset)
        if restore is None:
            return
        self.drawn = int(restore["drawn"])
        if "iter" in restore and stateful(self.it):
            self.it.load_state_dict(restore["iter"])
        elif "dataset" not in restore or not stateful(dataset):
            # Neither keeps a state: the stream again from its start, the samples drawn before
            # skipped (torchdata's StatefulDataLoader does the same).
            for _ in range(self.drawn):
                try:
                    next(self.it)
                except StopIteration:
                    self.it = None
                    break

    def snapshot(self) -> Dict[str, Any]:
        """Where the stream stands (see the class)."""
        state: Dict[str, Any] = {"drawn": self.drawn, "ended": self.it is None}
        if stateful(self.dataset):
            state["dataset"] = self.dataset.state_dict()
        if self.it is not None and stateful(self.it):
            state["iter"] = self.it.state_dict()
        return state

    def samples(self, batch: int, loading: Callable[[int], None]) -> List[Any]:
        """The samples of batch ``batch`` (fewer than ``batch_size`` at the stream's end, none
        after it); ``loading(k)`` is told the stream position before each draw."""
        if (batch - self.worker) % self.workers:
            raise _native.InternalError(
                f"worker {self.worker} of {self.workers} claimed batch {batch}, another worker's"
            )
        k = (batch - self.worker) // self.workers
        while self.next_round <= k:
            made = self.next_round * self.workers + self.worker
            got: List[Any] = []
            while self.it is not None and len(got) < self.batch_size:
                loading(self.next_round * self.batch_size + len(got))
                try:
                    got.append(next(self.it))
                    self.drawn += 1
                except StopIteration:
                    self.it = None
            if self.it is None and len(got) < self.batch_size:
                if self.drop_last:
                    got = []
                if self.table.ended(self.worker) is None:
                    self.table.end(self.worker, made, len(got))
            self.kept[made] = (got, 0)
            self.next_round += 1
            self.report(made, self.snapshot())
        if batch not in self.kept:
            raise _native.InternalError(
                f"worker {self.worker}: batch {batch} was claimed after all its parts were "
                "committed"
            )
        return self.kept[batch][0]

    def committed(self, batch: int, rows: int) -> None:
        """``rows`` rows of ``batch`` were committed; a batch whose every row is in is dropped."""
        samples, done = self.kept[batch]
        done += rows
        if done >= self.batch_size:
            del self.kept[batch]
        else:
            self.kept[batch] = (samples, done)


class StreamState:
    """Where a for over an iterable dataset stands: the next batch, the workers' base seed,
    the workers whose streams ended, and each other worker's place after its last batch taken
    (``StreamMaker.snapshot``; a worker with no batch taken yet starts from its stream's
    start). ``meta``: the workers, batch size, drop_last and dataset type it was saved under."""

    def __init__(self, meta: Dict[str, Any], next_batch: int, seed: int, done: List[int],
                 states: Dict[int, Dict[str, Any]]) -> None:
        self.meta, self.next_batch, self.seed = meta, next_batch, seed
        self.done, self.states = done, states

    def saved(self) -> Dict[str, Any]:
        """The state as ``DataLoader.state_dict()`` returns it (plain data: picklable, and
        ``torch.save``-able)."""
        return {"stream": {**self.meta, "next_batch": self.next_batch, "seed": self.seed,
                           "done": list(self.done),
                           "states": {int(w): s for w, s in self.states.items()}}}

    def place(self, worker: int) -> Optional[Dict[str, Any]]:
        """Worker ``worker``'s place to go on from (None: its stream's start)."""
        if worker in self.done:
            return {"ended": True}
        return self.states.get(worker)

    @classmethod
    def load(cls, state: Any, meta: Dict[str, Any]) -> "StreamState":
        """A state ``saved()`` made, checked against this loader's ``meta``."""
        inner = state.get("stream") if isinstance(state, dict) else None
        if not isinstance(inner, dict) or not {"next_batch", "seed", "done", "states"} <= set(inner):
            raise _native.UsageError(
                "pinring.torch.DataLoader.load_state_dict(): over an IterableDataset it takes "
                "what state_dict() of such a loader returned ({'stream': {...}}), not "
                f"{type(state).__name__} {sorted(state) if isinstance(state, dict) else ''}"
            )
        differs = [f"{k} {inner.get(k)!r} (this loader's: {v!r})"
                   for k, v in meta.items() if inner.get(k) != v]
        if differs:
            raise _native.RefusedError(
                "the state to resume from was saved by a loader over another stream: "
                + ", ".join(differs) + "; make the loader as the one that saved it"
            )
        return cls(meta, int(inner["next_batch"]), int(inner["seed"]),
                   [int(w) for w in inner["done"]],
                   {int(w): s for w, s in inner["states"].items()})


def first_samples(dataset: Any, workers: int, seed: int,
                  setup: Callable[[int, int], None], count: int) -> List[Any]:
    """The first ``count`` samples (or fewer) of the first worker whose stream has one, each
    worker's copy iterated as that worker would (``setup(worker, seed)`` sets its worker info,
    seeds and runs ``worker_init_fn`` first); empty if every stream is."""
    for w in range(max(1, workers)):
        if workers > 0:
            setup(w, seed + w)
            random.seed(seed + w)
            torch.manual_seed(seed + w)
        got: List[Any] = []
        for sample in dataset:
            got.append(sample)
            if len(got) == count:
                break
        if got:
            return got
    return []
