"""``pinring.torch.DataLoader`` itself: its arguments (torch's, and a ring's settings), the
embedded daemon or the attached ring, the workers' lives, the loop that yields the batches as
the sample's tree of tensors, and its state for resuming."""

from __future__ import annotations

import logging
import os
import time
import warnings
import weakref
from collections import deque
from typing import (Any, Callable, Dict, Generic, Iterator, List, Literal, Optional, Set, Tuple,
                    TypeVar)

import torch

from pinring import _dist, _memfd, _native
from pinring.loader import checked_state, torch_tensors
from pinring.torch import _procs
from pinring.torch._args import (EPOCHS, FALSE, ONE, RING_KEYS, TRUE, Default, plan_of_sampler,
                                 parse_device, refuse_as_torch, refuse_out_of_range,
                                 refuse_workers, seeds, unwrapped, warn_on_workers_beyond_cpus)
from pinring.torch._layout import _Layout, _rebuild
from pinring.torch._layout import PROBES, samples_layout
from pinring.torch._layout import layout_of as _layout_of
from pinring.torch._orders import OrderTable
from pinring.torch._pool import STOP_GRACE, EarlyWorkers, WorkerPool, _reraise
from pinring.torch._stream import (STREAM_EPOCH_BATCHES, STREAM_EPOCHS, EndTable, StreamBook,
                                   StreamState, first_samples, stateful, stream_plan)
from pinring.torch._worker import _POLL, RING_ARGS, _Worker, _WorkerArgs, fork_args

log = logging.getLogger("pinring.torch")

# Workers are looked at after this long even while batches flow (seconds).
_CHECK_EVERY = 0.5


_T_co = TypeVar("_T_co", covariant=True)

# The attributes torch's DataLoader refuses to have assigned after it is made: they decide the
# plan (here, the ring's), which a later assignment would not reach.
_FIXED_AFTER_INIT = frozenset(
    ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers")
)

# Loaders whose workers fork from this process (num_workers > 0, "fork") and that have no
# zygote yet: the first loader to start its daemon forks their zygotes first (_start_pieces).
_WAITING_FOR_ZYGOTE: "weakref.WeakSet[DataLoader[Any]]" = weakref.WeakSet()


def fork_waiting_zygotes() -> None:
    """Before pinring's threads start in this process (a loader's daemon or consumer, a
    ``pinring.Loader``'s embedded daemon), after which no zygote can be forked from it: forks
    the zygotes of the live loaders that fork theirs and have none yet. A validation loader
    made beside a training loader then keeps its dataset by inheritance, as it was now, where
    it would otherwise be pickled to a sibling zygote (slow for a large dataset, impossible for
    one that holds a lambda)."""
    if _native._live_rings() != 0:
        return
    for loader in list(_WAITING_FOR_ZYGOTE):
        if loader._zygote is None:
            loader._ensure_zygote()


class DataLoader(Generic[_T_co]):
    """``torch.utils.data.DataLoader``'s arguments and batches, fed through a pinring ring.

    Each ``for`` over the loader yields one epoch of batches whose tensors are on ``device``.

    Args (as torch's, with these differences):
        dataset: a map-style dataset (``__getitem__`` and ``__len__``), or an
            ``IterableDataset`` (each worker iterates its own copy, batches round-robin as
            torch's; docs/PYTHON.md, "Iterable datasets"); its samples must have the fields,
            dtypes and shapes of the first.
        batch_size, shuffle, drop_last: as torch's (``batch_size=None``: each sample as
            torch's ``default_convert`` gives it, no batch dimension).
        sampler: None, or any sampler or iterable of indices. A ``SequentialSampler``, a
            ``RandomSampler`` (without replacement, every sample) or a
            ``DistributedSampler`` over the whole dataset is pinring's own plan (its rank,
            replicas, shuffle and seed are used); any other is iterated in this process, as
            torch's is, ahead of the loop (docs/PYTHON.md, "Samplers").
        batch_sampler: iterated in this process likewise; its batches must have one size (the
            last of an epoch may be smaller).
        num_workers: worker processes running the dataset (0: a thread of this process).
        collate_fn: run in the workers on the samples of a batch part; each array it returns
            must have the part's samples as its first dimension.
        pin_memory: accepted; pinring's slots are always registered (pinned) memory.
        timeout: seconds to wait for one batch (0: as long as the workers live).
        worker_init_fn: called with the worker id in each worker, after seeding.
        multiprocessing_context: how workers start: None (the start method torch's DataLoader
            would use: multiprocessing's default, ``fork`` on Linux up to Python 3.13),
            ``"fork"``, ``"spawn"``, ``"forkserver"`` or a multiprocessing context. With
            ``fork`` the workers inherit the dataset; with ``spawn``/``forkserver`` it is pickled
            once, and the script needs ``if __name__ == "__main__":`` (docs/PYTHON.md,
            "Workers").
        generator: where the shuffle seed comes from when ``seed`` is not given (not drawn
            from with ``ring=``: the ring's seed is used).
        prefetch_factor: batches per worker to keep ready; sets ``prefetch`` when that is not
            given (``prefetch_factor × num_workers``, within 2..64).
        persistent_workers: accepted; workers always live across epochs.
        in_order: False delivers batches as they are ready instead of in order.

    pinring's own:
        seed: the shuffle seed (default: drawn from torch's RNG, like torch's sampler; with
            ``ring=``, the ring's).
        rank, world_size: this process's shard (as ``DistributedSampler``).
        prefetch: device batch buffers (2..64; default: pinring's, ~64 MiB in flight).
        device: where batches go: ``"cuda"``, ``"cuda:N"``, ``"cpu"`` or a ``torch.device``
            (default: the current CUDA device if there is one, else the CPU).
        ring: attach to this ring's daemon (``pinring-daemon --sink consumer``, a config of
            ``dataset.kind = "external"`` with the dataset's fields: the ``[dataset]`` table
            ``dataset_table(dataset)`` prints) instead of running one here.
            The ring's config then decides batch_size, shuffle, seed, drop_last, rank,
            world_size, epochs, in_order, prefetch, lease_ms and device: an argument left out
            takes the ring's value, and one passed with another value raises ``UsageError``
            naming both (as does a dataset of another length than the ring's).
        epochs: epochs the plan covers (each ``for`` takes one).
        lease_ms: how long a worker may take over one batch part, from claim to commit, before
            the daemon takes the part back and has it made again (``daemon.lease_ms``, at least
            10; default 30000). A worker whose part outlived it goes on with other parts, and
            the loop logs a warning naming the part.
        max_worker_restarts: deaths of workers (or workers leaving while the ring runs)
            tolerated over the loader's life before it raises ``PeerDied`` (an iterable
            dataset's workers are never restarted: a dead one raises ``PeerDied`` at once).
        str_bytes: bytes a sample of a str or bytes field's arena in each batch part (its
            strings packed one after another; default four times dataset[0]'s, >= 256).
        ragged: field names whose shape varies from sample to sample, beside those found by
            looking at a few samples first (docs/PYTHON.md, "Ragged fields").
        ragged_bytes: a ragged field's arena, bytes per sample of a batch part.
        ragged_as: without a ``collate_fn``, a ragged field as ``"list"`` (the batch's
            tensors) or ``"jagged"`` (one nested tensor of torch's jagged layout).
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: Optional[int] = ONE,
        shuffle: Optional[bool] = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        collate_fn: Optional[Callable[[List[Any]], Any]] = None,
        pin_memory: bool = False,
        drop_last: bool = FALSE,
        timeout: float = 0,
        worker_init_fn: Optional[Callable[[int], None]] = None,
        multiprocessing_context: Any = None,
        generator: Optional[torch.Generator] = None,
        *,
        prefetch_factor: Optional[int] = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = TRUE,
        seed: Optional[int] = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        prefetch: Optional[int] = None,
        device: Any = None,
        ring: Optional[str] = None,
        epochs: int = EPOCHS,
        lease_ms: Optional[int] = None,
        max_worker_restarts: int = 3,
        wait_for_ring: float = 30.0,
        str_bytes: Optional[int] = None,
        ragged: Optional[List[str]] = None,
        ragged_bytes: Optional[int] = None,
        ragged_as: str = "list",
    ) -> None:
        del pin_memory, persistent_workers, pin_memory_device  # always pinned, always persistent
        # An IterableDataset: each worker iterates its own copy, batches interleave as torch's
        # (_stream).
        self._stream = isinstance(dataset, torch.utils.data.IterableDataset)
        refuse_as_torch(dataset, self._stream, batch_size, shuffle, sampler, batch_sampler,
                        drop_last, ring, rank, world_size)
        # Under torchrun (or a torch.distributed process group), rank and world_size left out
        # are the job's; one passed that contradicts the job is an error naming both.
        if sampler is None and batch_sampler is None and not self._stream:
            rank, world_size = _dist.shard(rank, world_size, "pinring.torch.DataLoader")
        # What the caller passed (not left at its default): with ring=, the ring's config
        # decides, and an argument passed must agree with it (_check_ring).
        given = {
            name: value for name, value in (
                ("batch_size", batch_size), ("shuffle", shuffle), ("seed", seed),
                ("drop_last", drop_last), ("rank", rank), ("world_size", world_size),
                ("epochs", epochs), ("in_order", in_order), ("prefetch", prefetch),
                ("lease_ms", lease_ms), ("device", device),
            ) if value is not None and not isinstance(value, Default)
        }
        batch_size, drop_last, in_order, epochs = (
            unwrapped(v) for v in (batch_size, drop_last, in_order, epochs)
        )
        # batch_size=None (no auto-batching): each sample is a batch of one, yielded without
        # the batch dimension, as torch's default_convert would (_convert).
        self._unbatched = batch_size is None and batch_sampler is None
        if batch_sampler is not None:
            batch_size = None
        refuse_out_of_range(batch_size, lease_ms, prefetch, epochs, str_bytes, ragged_bytes,
                            ragged, ragged_as)
        self._str_bytes = None if str_bytes is None else int(str_bytes)
        self._ragged: List[str] = [str(r) for r in (ragged or ())]
        self._ragged_bytes = None if ragged_bytes is None else int(ragged_bytes)
        self._ragged_as = ragged_as
        # Where a ragged field may be (a collate_fn, or one sample a batch: torch's default
        # collate stacks no other), the layout is learned from a few samples (_layout.PROBES).
        self._probe = collate_fn is not None or batch_size is None or batch_size == 1
        refuse_workers(num_workers, timeout, multiprocessing_context)
        self.start_method = _procs.start_method(multiprocessing_context)
        sharded, from_sampler = self._take_samplers(dataset, sampler, batch_sampler, drop_last,
                                                    ring, given)
        if prefetch is None and prefetch_factor is not None:
            given["prefetch_factor"] = prefetch_factor
        self.dataset = dataset
        self.batch_size = None if batch_size is None else int(batch_size)
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.shuffle = bool(sharded.get("shuffle", shuffle or False))
        self.drop_last = bool(drop_last)
        self.num_workers = int(num_workers)
        self.collate_fn = collate_fn
        self.timeout = float(timeout)
        self.worker_init_fn = worker_init_fn
        self.in_order = bool(in_order)
        self.rank = int(rank if rank is not None else sharded.get("rank", 0))
        self.world_size = int(world_size if world_size is not None else sharded.get("world_size", 1))
        self.seed, self._worker_seed = seeds(
            sharded.get("seed") if seed is None else seed, ring, self._stream, self.shuffle,
            generator,
        )
        if prefetch is None and prefetch_factor is not None:
            lo, hi = _native.PREFETCH_RANGE
            prefetch = min(hi, max(lo, int(prefetch_factor) * max(1, self.num_workers)))
        self.prefetch = prefetch
        self.epochs = int(epochs)
        self.lease_ms = None if lease_ms is None else int(lease_ms)
        self._given: Dict[str, Any] = given
        self._from_sampler = (None if sampler is None else type(sampler).__name__, from_sampler)
        self.max_worker_restarts = int(max_worker_restarts)
        self.wait_for_ring = float(wait_for_ring)
        self._attached_ring = ring
        self._device = parse_device(device)
        self._generator = generator
        self._init_state()
        warn_on_workers_beyond_cpus(self.num_workers)
        self._initialized = True
        self._wait_for_zygote()

    def _init_state(self) -> None:
        """The state of a loader that has not started: no layout, ring, daemon, workers or
        zygote yet."""
        self._layout: Optional[_Layout] = None
        self._bpe: Optional[int] = None
        self._ppb: Optional[int] = None
        self._stood = 0  # the batch number a stopped loader stood at
        self._epoch_wanted: Optional[int] = None
        self._resume: Optional[Dict[str, int]] = None
        self._rest_of_state = False  # load_state_dict: the next for is the saved epoch's rest
        self._started = False
        # The embedded ring's pipeline (its daemon and consumer, one native object); None with
        # ring= (the consumer alone) and between passes.
        self._daemon: Optional[_native.Pipeline] = None
        self._consumer: Optional[_native.Consumer] = None
        # The workers of the pass under way (None between passes).
        self._pool: Optional[WorkerPool] = None
        self._zygote: Optional[_procs.Zygote] = None
        # The first start's workers, forked before the ring (until the pool adopts them).
        self._early: Optional[EarlyWorkers] = None
        # The embedded ring's settings as data and their spec, resolved once (_resolve).
        self._spec: Optional[Tuple[Dict[str, Any], _native.Spec]] = None
        # The workers' restart books, over the loader's life (each pass's pool books in them):
        # every unexpected end restarts, max_worker_restarts in all; an iterable dataset's
        # workers are never restarted.
        self._books = _native.Supervisor(
            max(1, self.num_workers), time.monotonic(),
            policy="stream" if self._stream else "workers",
            max_restarts=None if self._stream else max(0, self.max_worker_restarts),
        )
        self._leases_seen = 0  # the ring's count of parts taken back after their lease, seen
        self._ring_settings: Dict[Tuple[str, str], Any] = {}
        self._ring_name: Optional[str] = None
        # What a worker joins the ring by (its name, and an anonymous ring's path).
        self._ticket: Optional[_native.RingTicket] = None
        self.summary: Optional[Dict[str, Any]] = None
        # A drawn order (_drawn_by): its table, the last epoch published in it, the orders
        # drawn before the table existed (the first, which sizes the plan), and the plan's
        # positions per epoch and batch size.
        self._orders: Optional[OrderTable] = None
        self._orders_fd: Optional[int] = None
        self._published = -1
        self._drawn: Dict[int, Any] = {}
        self._positions: Optional[int] = None
        self._plan_batch: Optional[int] = None if self._drawn_by is not None else (
            1 if self.batch_size is None else self.batch_size)
        # The batches handed out that may still hold a buffer of the ring, oldest first: weak
        # references to their tensors (_copy_out moves them out when every buffer is held).
        self._lent: deque[List[weakref.ref[torch.Tensor]]] = deque()
        self._warned_copy = False
        # An iterable dataset's end table (_stream.EndTable) and its memfd, for one for; the
        # book of the for under way; a state loaded for the next for, and while it starts.
        self._ends: Optional[EndTable] = None
        self._ends_fd: Optional[int] = None
        self._book: Optional[StreamBook] = None
        self._stream_resume: Optional[StreamState] = None
        # len(dataset) when len(loader) was asked of an iterable dataset (torch's warning).
        self._stream_len_said: Optional[int] = None
        self._resuming: Optional[StreamState] = None

    def _take_samplers(self, dataset: Any, sampler: Any, batch_sampler: Any, drop_last: Any,
                       ring: Optional[str], given: Dict[str, Any],
                       ) -> Tuple[Dict[str, Any], Set[str]]:
        """The plan's settings a sampler stands for (``plan_of_sampler``), added to ``given``
        where not passed, and which of them came from it; sets ``_drawn_by``, the sampler or
        batch_sampler whose order this process draws instead."""
        sharded: Dict[str, Any] = {}
        from_sampler: Set[str] = set()
        # A sampler or batch_sampler pinring's plan cannot express draws its order here, in
        # the training process, as torch's does (_orders); the plan then runs over positions.
        self._drawn_by: Any = batch_sampler
        if sampler is not None and batch_sampler is None and not self._stream:
            native = plan_of_sampler(sampler, bool(unwrapped(drop_last)), len(dataset))
            if native is None:
                self._drawn_by = sampler
            else:
                sharded = native
        if self._drawn_by is not None and ring is not None:
            raise _native.UsageError(
                f"pinring.torch.DataLoader(ring={ring!r}) takes its order from the ring's "
                f"plan, so a {type(self._drawn_by).__name__} cannot draw it: leave "
                f"{'batch_sampler' if batch_sampler is not None else 'sampler'} out, or run "
                "the loader without ring= (its own daemon)"
            )
        if sharded:
            for key, value in sharded.items():
                if key not in given:
                    given[key] = value
                    from_sampler.add(key)
        return sharded, from_sampler

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _FIXED_AFTER_INIT and getattr(self, "_initialized", False):
            raise _native.UsageError(
                f"{name} attribute should not be set after DataLoader is initialized: it "
                f"decides the plan the loader's ring was made for; make a new DataLoader with "
                f"{name}={value!r}"
            )
        object.__setattr__(self, name, value)

    # -- the plan ------------------------------------------------------------------------

    def _infer(self) -> _Layout:
        """The fields of the batches, from ``dataset[0]``: read by worker 0, forked before the
        ring exists (``EarlyWorkers``), when the loader has workers, so that this process never
        runs the dataset's code, as torch's DataLoader never does; by this process without. (An
        iterable dataset's: from its first sample, ``_infer_stream``.)"""
        layout = self._infer_stream() if self._stream else self._infer_indexed()
        assert layout is not None
        return layout

    def _infer_stream(self) -> Optional[_Layout]:
        """An iterable dataset's layout, from the first sample of the first worker whose stream
        has one; None while every stream is empty (asked again at the next for)."""
        if self._layout is None and self.num_workers == 0:
            # The dataset's code runs here, as it does in torch's single-process loop: the
            # random generators it draws from are left as they were, so the loop that follows
            # draws what torch's would.
            import random

            import numpy as np

            states = (torch.random.get_rng_state(), random.getstate(), np.random.get_state())
            # So is a Stateful dataset's own state: the loop iterates it from where it was.
            saved = self.dataset.state_dict() if stateful(self.dataset) else None
            try:
                samples = first_samples(self.dataset, 0, 0, lambda w, s: None,
                                        PROBES if self._probe else 1)
            finally:
                torch.random.set_rng_state(states[0])
                random.setstate(states[1])
                np.random.set_state(states[2])
                if saved is not None:
                    self.dataset.load_state_dict(saved)
            if samples:
                self._layout = samples_layout(samples, self.collate_fn, self._unbatched,
                                              self._str_bytes, self._ragged, self._ragged_bytes)
        elif self._layout is None:
            self._layout = self._infer_in_worker()
        return self._layout

    def _infer_indexed(self) -> _Layout:
        if self._layout is None:
            if self.num_workers == 0:
                self._layout = _layout_of(self.dataset, self.collate_fn, self._unbatched,
                                          self._str_bytes, self._ragged, self._ragged_bytes,
                                          self._probe)
                return self._layout
            self._layout = self._infer_from_workers()
        assert self._layout is not None
        return self._layout

    def _infer_from_workers(self) -> _Layout:
        """The layout, from worker 0's first samples: the workers forked before the ring, each
        reading a sample (``EarlyWorkers``)."""
        zygote = self._ensure_zygote()
        n = len(self.dataset)
        if n == 0:
            raise _native.UsageError("the dataset is empty: nothing to load")

        def args(worker_id: int) -> Dict[str, Any]:
            early = dict(self._layout_settings(), index=worker_id % n)
            return fork_args(self._worker_args(worker_id)._replace(early=early))

        self._close_early()
        try:
            self._early = EarlyWorkers(zygote, args, self.num_workers)
            outcome = self._early.layout(self.timeout or None,
                                         late=_procs.layout_timeout(self.timeout or None))
        except BaseException:
            # Timed out or interrupted: the zygote ends, and the workers with it.
            self._drop_zygote()
            raise
        if outcome[0] != "ok":
            self._close_early()
        layout = _layout_outcome(*outcome)
        assert layout is not None
        return layout

    def _layout_settings(self) -> Dict[str, Any]:
        """What the process that learns the layout needs of this loader's arguments."""
        return {"unbatched": self._unbatched, "str_bytes": self._str_bytes,
                "ragged": self._ragged, "ragged_bytes": self._ragged_bytes, "probe": self._probe}

    def _drop_zygote(self) -> None:
        """Ends the zygote, and every process forked from it (the first start's workers, the
        process reading a layout)."""
        self._close_early()
        if self._zygote is not None:
            self._zygote.close()
            self._zygote = None

    def _close_early(self) -> None:
        """Ends the first start's workers that no pool adopted."""
        if self._early is not None:
            early, self._early = self._early, None
            early.close()

    def _infer_in_worker(self) -> Optional[_Layout]:
        """An iterable dataset's layout, learned by a process the zygote forks and sets up as
        each worker in turn until one's stream has a sample; None when every stream is empty.
        (Its workers are not forked before the ring as a map-style dataset's are: a worker
        would have to hand the samples it drew to the worker it becomes; ARCHITECTURE.md.)"""
        zygote = self._ensure_zygote()
        try:
            outcome = zygote.layout(
                dict(self._layout_settings(), num_workers=self.num_workers,
                     seed=self._worker_seed & (2**63 - 1)),
                wait=self.timeout or None,
            )
        except BaseException:
            # Timed out or interrupted: the zygote ends, and the process reading sample 0
            # with it (it dies with its zygote).
            self._drop_zygote()
            raise
        return _layout_outcome(*outcome)

    def _wait_for_zygote(self) -> None:
        """Joins the loaders whose zygotes the next daemon to start forks first
        (``fork_waiting_zygotes``), if its workers fork from this process."""
        if self.num_workers > 0 and self.start_method == "fork":
            _WAITING_FOR_ZYGOTE.add(self)

    def _ensure_zygote(self) -> _procs.Zygote:
        """The zygote this loader's workers are forked from, made if there is none (before this
        loader's daemon starts: the workers are forked from a process that has none of its
        threads)."""
        if self._zygote is not None:
            self._zygote.pump()  # its end, if it ended, is news here
        if self._zygote is None or self._zygote.dead:
            _procs.refuse_in_zygote_import()
            _WAITING_FOR_ZYGOTE.discard(self)
            self._zygote = _procs.Zygote(
                _procs.Payload(self.dataset, self.collate_fn, self.worker_init_fn),
                self.start_method,
            )
        return self._zygote

    def _config(self, ring: str) -> Dict[str, Any]:
        """The config of this loader's ring, as data (the config file's shape: sections of
        keys), which ``_native.Spec`` resolves by the file's rules."""
        layout = self._infer()
        daemon: Dict[str, Any] = {}
        if self.prefetch is not None:
            daemon["prefetch"] = int(self.prefetch)
        if self.lease_ms is not None:
            daemon["lease_ms"] = int(self.lease_ms)
        samples, batch = self._plan_size()
        if self._stream:
            # A numbering of the workers' batches (_stream), one for long, in order.
            return {
                "ring": {"name": ring, "slot_bytes": "auto", "in_order": True},
                "dataset": {"kind": "external", "samples": samples,
                            "fields": layout.fields_data()},
                "plan": {"batch_size": batch, "epochs": stream_plan(batch)[1]},
                "daemon": daemon,
            }
        return {
            "ring": {"name": ring, "slot_bytes": "auto", "in_order": bool(self.in_order)},
            "dataset": {"kind": "external", "samples": samples,
                        "fields": layout.fields_data()},
            "plan": {"batch_size": batch, "shuffle": bool(self.shuffle),
                     "seed": int(self.seed), "epochs": int(self.epochs),
                     "drop_last": bool(self.drop_last), "rank": int(self.rank),
                     "world_size": int(self.world_size)},
            "daemon": daemon,
        }

    def _plan_size(self) -> Tuple[int, int]:
        """(samples, batch_size) of the plan: the dataset's, or with a drawn order the
        positions of one epoch and its batches' size (from the first epoch drawn)."""
        if self._stream:
            assert self._plan_batch is not None
            return stream_plan(self._plan_batch)[0], self._plan_batch
        if self._drawn_by is None:
            assert self._plan_batch is not None
            return len(self.dataset), self._plan_batch
        if self._positions is None:
            order = self._draw(0)
            self._drawn[0] = order
        assert self._positions is not None and self._plan_batch is not None
        return self._positions, self._plan_batch

    def _draw(self, epoch: int) -> Any:
        """Epoch ``epoch``'s sample order, drawn from the sampler (or batch_sampler) as torch's
        DataLoader iterates it, after ``set_epoch(epoch)`` where it (or a batch_sampler's
        sampler) has one; checked against the plan's positions and batch size."""
        import numpy as np

        drawer = self._drawn_by
        what = "batch_sampler" if self.batch_sampler is not None else "sampler"
        for obj in (drawer, getattr(drawer, "sampler", None)):
            if obj is not None and callable(getattr(obj, "set_epoch", None)):
                obj.set_epoch(epoch)
        n = len(self.dataset)
        if self.batch_sampler is not None:
            batches = [list(b) for b in drawer]
            if not batches:
                raise _native.UsageError(f"the {what} yielded no batches for epoch {epoch}")
            size = self._plan_batch if self._plan_batch is not None else len(batches[0])
            for k, b in enumerate(batches):
                if len(b) != size and (k != len(batches) - 1 or not 0 < len(b) < size):
                    raise _native.UsageError(
                        f"the batch_sampler's batch {k} of epoch {epoch} holds {len(b)} "
                        f"samples, where its first held {size}: pinring's batches have one size "
                        "(the last of an epoch may be smaller), so a batch_sampler that groups "
                        "samples into batches of different sizes (bucketing by length) cannot "
                        "be fed; pad within a fixed batch size, or drop the batch_sampler"
                    )
            order = _indices((i for b in batches for i in b), what, epoch)
        else:
            order = _indices(drawer, what, epoch)
            size = 1 if self.batch_size is None else self.batch_size
        if len(order) == 0:
            raise _native.UsageError(f"the {what} yielded no samples for epoch {epoch}")
        bad = (order < 0) | (order >= n)
        if bad.any():
            at = int(np.argmax(bad))
            raise _native.UsageError(
                f"the {what} yielded index {int(order[at])} (position {at} of epoch {epoch}), "
                f"but the dataset holds {n} samples: yield indices 0 to {n - 1}"
            )
        if self._positions is None:
            self._positions, self._plan_batch = len(order), size
        elif len(order) != self._positions:
            raise _native.UsageError(
                f"the {what} yielded {len(order)} samples for epoch {epoch}, where it yielded "
                f"{self._positions} before: pinring's plan has one length for every epoch; "
                "make the sampler yield the same number of samples each epoch"
            )
        return order

    def _publish_orders(self, through_seq: int) -> None:
        """Draws and publishes the orders of every epoch up to the one of seq ``through_seq``
        (and no further than the plan's epochs)."""
        if self._orders is None:
            return
        bpe, ppb = self._shape()
        last = min(through_seq // (bpe * ppb), self.epochs - 1)
        while self._published < last:
            epoch = self._published + 1
            order = self._drawn.pop(epoch, None)
            self._orders.publish(epoch, self._draw(epoch) if order is None else order)
            self._published = epoch

    def _orders_ahead(self) -> int:
        """How many seqs past the consumer's the orders are drawn: twice what the ring lets
        workers run ahead of it (its slots, and the batches uploaded or held in its buffers),
        and one epoch more."""
        assert self._consumer is not None
        bpe, ppb = self._shape()
        slots = int(self._ring_settings.get(("ring", "slots"), 0) or 0) or 64
        buffers = self._consumer.buffers_held[1]
        return 2 * (slots + buffers * ppb) + bpe * ppb

    def _resolve(self) -> _native.Spec:
        """The embedded ring's spec: "auto"'s slots, but no more than the workers can keep busy
        (the resolver's ``slots_for_workers``: a smaller ring is made and registered sooner).
        Resolved once for its settings: the plan's shape and the daemon take the same value."""
        local = _dist.local_rank()
        rank = "" if local is None else f"rank{local}-"
        settings = self._config(f"torch-{rank}{os.getpid()}-{id(self) & 0xFFFFFF:x}")
        if self._spec is None or self._spec[0] != settings:
            spec = _native.Spec(settings, source="pinring.torch.DataLoader",
                                workers=self.num_workers)
            self._spec = (settings, spec)
        return self._spec[1]

    def _shape(self) -> Tuple[int, int]:
        """(batches per epoch, seqs per batch) of the plan, before anything starts."""
        if self._bpe is None or self._ppb is None:
            if self._attached_ring is None:
                # The embedded ring's own spec: the slots for the workers decide "auto"'s slot
                # size, and with it the parts of a batch.
                info = self._resolve().info()
            else:
                c = _native.Consumer(self._attached_ring, wait_for_ring=self.wait_for_ring)
                try:
                    spec = c.spec
                    self._check_ring(spec.settings(), c.device)
                    info = spec.info()
                finally:
                    c.close()
            self._bpe = int(info["batches_per_epoch"])
            self._ppb = int(info["parts_per_batch"])
        return self._bpe, self._ppb

    def __len__(self) -> int:
        """Batches per epoch (this rank's). Over an iterable dataset, torch's guess from
        ``len(dataset)`` (a ``TypeError`` for a dataset without one), as torch's DataLoader."""
        if self._stream:
            n = len(self.dataset)
            # As torch's: a stream found longer than this is warned of (_iter_stream).
            self._stream_len_said = n
            if self.batch_size is None:
                return n
            return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        return self._shape()[0]

    # -- starting and stopping -----------------------------------------------------------

    def _start(self, start_seq: int) -> None:
        _procs.refuse_in_zygote_import()
        layout = self._infer()
        # Whatever fails on the way, what was started is stopped again (_stop takes each piece
        # that exists).
        self._started = True
        try:
            self._start_pieces(layout, start_seq)
        except BaseException:
            self._stop()
            raise

    def _start_pieces(self, layout: _Layout, start_seq: int) -> None:
        if self.num_workers > 0:
            self._ensure_zygote()
        fork_waiting_zygotes()
        if self._attached_ring is None:
            backend: Literal["host", "cuda"] = "host" if self._device.type == "cpu" else "cuda"
            # Anonymous: a memfd, not a name in /dev/shm, so nothing is left behind however
            # this process ends, and /dev/shm's size does not matter. The daemon runs the spec
            # as resolved (and stores it in the ring, where the workers adopt it).
            spec = self._resolve()
            self._daemon = _native.Pipeline(
                spec, backend=backend, device=self._device.index or 0, start_seq=start_seq,
                anonymous=True, wait_for_ring=self.wait_for_ring,
            )
            self._ticket = self._daemon.ticket()
            self._ring_name = self._ticket.ring
            self._consumer = self._daemon.consumer
            self._ring_settings = spec.settings()
            shape = (self._consumer.batches_per_epoch, self._consumer.parts_per_batch)
            if self._bpe is not None and shape != (self._bpe, self._ppb):
                raise _native.InternalError(
                    f"ring {self._ring_name!r} has {shape[0]} batches an epoch in {shape[1]} "
                    f"parts each, where this loader planned {self._bpe} in {self._ppb}: a bug "
                    "in pinring (the ring's config was resolved otherwise than the plan's)"
                )
        else:
            self._ring_name = self._attached_ring
            self._ticket = _native.RingTicket(self._attached_ring)
            self._consumer = _native.Consumer(
                self._attached_ring, start_seq=start_seq or None, wait_for_ring=self.wait_for_ring,
            )
            # The daemon's spec as the ring stores it: nothing parsed or resolved again.
            spec = self._consumer.spec
            info = spec.info()
            _check_ring_fields(self._attached_ring, info["fields"], layout, len(self.dataset))
            self._ring_settings = self._check_ring(spec.settings(), self._consumer.device)
        self._leases_seen = self._consumer.leases_expired
        if self._stream:
            self._ends, self._ends_fd = EndTable.create(max(1, self.num_workers))
        if self._drawn_by is not None:
            # The orders the workers will read, drawn ahead of them before any starts.
            bpe, ppb = self._shape()
            positions, _ = self._plan_size()
            depth = self._orders_ahead() // (bpe * ppb) + 3
            self._orders, self._orders_fd = OrderTable.create(positions, depth)
            self._published = start_seq // (bpe * ppb) - 1
            self._drawn = {e: o for e, o in self._drawn.items() if e > self._published}
            self._publish_orders(start_seq + self._orders_ahead())
        if self._early is not None and self._early.zygote is not self._zygote:
            self._close_early()  # its zygote ended since: workers are forked again
        self._pool = WorkerPool.start(
            self._zygote, max(1, self.num_workers), self._spawn,
            session=None if self._early is None else self._early.hand_over(),
            ring_name=self._ring_name or "", books=self._books, lease_text=self._lease_text,
        )

    def _check_ring(self, settings: Dict[Tuple[str, str], Any],
                    device: str) -> Dict[Tuple[str, str], Any]:
        """With ``ring=``: raises ``UsageError`` naming each argument passed that the ring's
        settings (``Spec.settings()``, delivering to ``device``) contradict, and a dataset of
        another length than the ring's; then takes the ring's settings as the loader's own, and
        returns them."""
        sampler, from_sampler = self._from_sampler
        wrong = []
        for arg, value in self._given.items():
            if arg == "device":
                if str(self._device) != device:
                    wrong.append(
                        f"device={value!r} (batches on {self._device}), but the ring delivers to "
                        f"{device}: pass device={device!r} or leave device out to take the ring's"
                    )
                continue
            section, key = RING_KEYS[arg]
            have = settings.get((section, key))
            mine: Any = self.prefetch if arg == "prefetch_factor" else value
            if isinstance(have, bool) or arg in ("shuffle", "drop_last", "in_order"):
                mine = bool(mine)
            elif arg == "seed":
                mine = int(mine) & (2**64 - 1)
            else:
                mine = int(mine)
            if have == mine:
                continue
            ring_has = (
                f"the ring's {section}.{key} is "
                + ("not set (pinring's default)" if have is None else repr(have))
            )
            if arg in from_sampler:
                wrong.append(
                    f"the {sampler}'s {arg} is {mine!r}, but {ring_has}: pass a sampler whose "
                    f"{arg} is {have!r}, or leave sampler out to take the ring's"
                )
            elif arg == "prefetch_factor":
                wrong.append(
                    f"prefetch_factor={value!r} asks for prefetch={mine}, but {ring_has}: leave "
                    "prefetch_factor out to take the ring's"
                )
            else:
                fix = "leave it out" if have is None else f"pass {arg}={have!r} or leave it out"
                wrong.append(f"{arg}={value!r}, but {ring_has}: {fix} to take the ring's")
        samples = settings.get(("dataset", "samples"))
        if samples is not None and samples != len(self.dataset):
            wrong.append(
                f"the dataset has {len(self.dataset)} samples, but the ring's dataset.samples is "
                f"{samples}: pass the dataset the ring was started for, or start its daemon with "
                f"dataset.samples = {len(self.dataset)}"
            )
        if wrong:
            raise _native.UsageError(
                f"ring {self._attached_ring!r} was started with other settings than this "
                "DataLoader was given (an attached loader takes the ring's): " + "; ".join(wrong)
            )
        # The arguments left out: the ring's.
        for arg in ("batch_size", "rank", "world_size", "epochs", "seed"):
            if (("plan", arg)) in settings:
                object.__setattr__(self, arg, int(settings[("plan", arg)]))
        for section, arg in (("plan", "shuffle"), ("plan", "drop_last"), ("ring", "in_order")):
            if (section, arg) in settings:
                object.__setattr__(self, arg, bool(settings[(section, arg)]))
        self.prefetch = settings.get(("daemon", "prefetch"))
        self.lease_ms = settings.get(("daemon", "lease_ms"))
        self._device = torch.device(device)
        return settings

    def _spawn(self, worker_id: int, reports: Any, stop_flag: Any) -> _Worker:
        args = self._worker_args(worker_id)
        pid = None
        if self._early is not None:
            # A worker forked before the ring: sent its ring (forked again where it cannot be).
            # A worker that could not take it (dead before) is the pool's to restart, counted.
            pid = self._early.adopt(worker_id, {k: getattr(args, k) for k in RING_ARGS})
            if not self._early.waiting:
                self._close_early()
        return _Worker(self._zygote, args, reports, stop_flag, pid=pid)

    def _worker_args(self, worker_id: int) -> _WorkerArgs:
        """Worker ``worker_id``'s arguments; the ring's are empty while it does not exist."""
        return _WorkerArgs(
            ring=self._ticket,
            dataset=self.dataset,
            layout=self._layout, collate_fn=self.collate_fn, worker_init_fn=self.worker_init_fn,
            worker_id=worker_id, num_workers=self.num_workers,
            seed=(self._worker_seed + worker_id) & (2**63 - 1), wait=self.wait_for_ring,
            orders=None if self._orders is None or self._orders_fd is None else (
                _memfd.path(self._orders_fd, os.getpid()), self._orders.positions,
                self._orders.depth, self._shape()[0],
            ),
            unbatched=self._unbatched,
            stream=None if self._ends_fd is None else (
                _memfd.path(self._ends_fd, os.getpid()), self._plan_batch or 1, self.drop_last,
                0 if self._resuming is None else self._resuming.next_batch,
                None if self._resuming is None else self._resuming.place(worker_id),
            ),
        )

    def _stop(self, grace: float = STOP_GRACE) -> None:
        """Stops the workers (giving them ``grace`` seconds to leave between parts), detaches,
        stops the daemon; keeps where the loader stands."""
        self._close_early()
        if not self._started:
            return
        self._started = False
        if self._pool is not None:
            # Late news is still news: a part taken back after its lease is logged.
            self._pool.stop(late=self._look_at_leases, grace=grace)
            self._pool = None
        if self._consumer is not None:
            try:
                self._stood = self._consumer.state()[0] // (self._ppb or 1)
            except _native.PinringError:
                pass
            self._consumer.close()
            self._consumer = None
        try:
            if self._daemon is not None:
                pipeline, self._daemon = self._daemon, None
                text = pipeline.stop()  # the consumer closed above, then the daemon's drain
                if text:
                    import json

                    self.summary = json.loads(text)
        finally:
            if self._orders_fd is not None:
                os.close(self._orders_fd)
                self._orders_fd, self._orders = None, None
            if self._ends_fd is not None:
                os.close(self._ends_fd)
                self._ends_fd, self._ends = None, None

    def close(self) -> None:
        """Stops the workers (and the zygote they are forked from) and the embedded daemon,
        within a second whatever they were doing. Tensors of batches still alive stay valid. A
        later ``for`` starts them again where the loader stood."""
        try:
            self._stop()
        finally:
            if self._zygote is not None:
                self._zygote.close()
                self._zygote = None
                self._wait_for_zygote()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self) -> "DataLoader[_T_co]":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the workers ---------------------------------------------------------------------

    def _check_workers(self, restart: bool = True, idle: bool = False) -> None:
        """The pool's check (``WorkerPool.check``), with a look at the ring's leases between its
        reading of the reports and its restarts; what it raises stops the loader first, with
        no grace for the workers (they are killed at once: the loop is ending on an error or
        Ctrl-C, and a graceful stop cost up to 0.4 s before the error reached the caller)."""
        assert self._pool is not None
        try:
            self._pool.check(restart, idle, between=self._look_at_leases)
        except BaseException:
            self._stop(grace=0.0)
            raise

    def _look_at_leases(self) -> None:
        """Warns of parts the daemon took back after their lease since the last look: the
        event itself, seen in the ring, not only the late worker's report (which comes when,
        if ever, its ``__getitem__`` returns)."""
        if self._consumer is None:
            return
        try:
            expired = self._consumer.leases_expired
        except _native.PinringError:
            return
        if expired > self._leases_seen:
            log.warning(
                "pinring DataLoader: %d batch part(s) of ring %r took longer than the ring's "
                "lease (%s) to load: the daemon took them back and has them made again (the late "
                "worker's commit is refused; its report names the part when it comes); pass "
                "lease_ms= longer than the slowest part takes (or raise daemon.lease_ms in the "
                "ring's config with ring=)",
                expired - self._leases_seen, self._ring_name, self._lease_text(),
            )
            self._leases_seen = expired

    def _lease_text(self) -> str:
        lease = self._ring_settings.get(("daemon", "lease_ms"))
        return "daemon.lease_ms" if lease is None else f"daemon.lease_ms = {lease} ms"

    @property
    def worker_restarts(self) -> int:
        """Workers restarted after they died (or ended with status 0 and no report while the
        ring ran), over the loader's life."""
        return self._books.restarts

    def _next_or_stop(self) -> Optional[_native.Batch]:
        """``_next``; Ctrl-C while waiting kills the workers at once (no grace to leave between
        parts), so the interrupt reaches the caller within the 0.1 s of the loop's wait and a
        few milliseconds more."""
        try:
            return self._next()
        except KeyboardInterrupt:
            self._stop(grace=0.0)
            raise

    def _next(self) -> Optional[_native.Batch]:
        assert self._consumer is not None
        waited = 0.0
        assert self._pool is not None
        if time.monotonic() - self._pool.last_check >= _CHECK_EVERY:
            self._check_workers()
        held, buffers = self._consumer.buffers_held
        if held >= buffers:
            self._copy_out(buffers)
        if self._orders is not None:
            self._publish_orders(self._consumer.state()[0] + self._orders_ahead())
        while True:
            try:
                return self._consumer.next_batch(_POLL)
            except _native.Timeout:
                waited += _POLL
                self._check_workers(idle=True)
                if self.timeout and waited >= self.timeout:
                    raise _native.Timeout(
                        f"DataLoader timed out after {self.timeout:g} seconds: pinring DataLoader "
                        f"had no batch within timeout={self.timeout} s (ring "
                        f"{self._ring_name!r}, "
                        f"{self._pool.alive()} workers alive)"
                    ) from None
            except _native.PinringError:
                # The ring ended under the loop: a worker's report says why, if there is one.
                self._check_workers(restart=False)
                raise

    # -- epochs --------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """The next ``for`` yields epoch ``epoch`` (as ``DistributedSampler.set_epoch``). The
        loader moves to the next epoch by itself after each ``for``; a jump elsewhere restarts
        its workers there."""
        self._epoch_wanted = int(epoch)

    def __iter__(self) -> Iterator[Any]:
        if self._stream:
            return self._iter_stream()
        return self._iter_plan()

    def _iter_stream(self) -> Iterator[Any]:
        """One for over an iterable dataset: its own workers and ring, each worker iterating
        its copy from the start; the workers' batches round-robin, short ones cut, the empty
        ones after a stream's end skipped (``_stream``)."""
        self._stop()
        resume, self._stream_resume = self._stream_resume, None
        if resume is not None:
            self._worker_seed = resume.seed
        else:
            # As torch's DataLoader, for each iterator: the workers' base seed, one draw from
            # the generator or torch's RNG.
            self._worker_seed = int(
                torch.empty((), dtype=torch.int64).random_(generator=self._generator).item()
            )
        if self._infer_stream() is None:
            return  # every worker's stream is empty
        self._resuming = resume
        try:
            self._start(0 if resume is None else resume.next_batch * self._shape()[1])
        finally:
            self._resuming = None
        assert self._ends is not None
        book = StreamBook(self._ends, self._plan_batch or 1, resume)
        self._book = book
        yielded = 0
        try:
            while not book.finished:
                b = self._next_or_stop()
                if b is None:
                    raise _native.UsageError(
                        f"pinring.torch.DataLoader: the IterableDataset's workers made "
                        f"{STREAM_EPOCH_BATCHES * STREAM_EPOCHS} batches in one for, the most one "
                        "for takes: end the stream sooner, or iterate it in several for loops"
                    )
                rows = book.rows(int(b.batch))
                assert self._pool is not None
                # The workers' reports of their streams' places, taken as they come: a worker
                # whose reports were left unread would wait on a full socket.
                self._pool.read_reports()
                self._pool.forget_states(int(b.batch) % max(1, self.num_workers), int(b.batch))
                if rows == 0:
                    b.release()
                    del b
                    continue
                box = [b]
                del b
                yielded += 1
                if self._stream_len_said is not None and yielded > self._stream_len_said:
                    _warn_stream_longer(self, yielded)
                yield self._convert(box, rows)
            self._check_workers(restart=False)
        finally:
            # The for is over (or left): its workers and ring go; the next for makes new ones
            # (after a loop left early, where it stood is the next for's start, as torch's
            # next iterator starts again; a state saved in it resumes there).
            self._book = None
            self._stop()

    def _stream_meta(self) -> Dict[str, Any]:
        """What a saved stream state must have been saved under."""
        return {"workers": max(1, self.num_workers), "batch_size": self._plan_batch or 1,
                "drop_last": bool(self.drop_last), "dataset": type(self.dataset).__qualname__}

    def _book_state(self) -> StreamState:
        """Where the for under way stands (the next for's start between fors)."""
        book, pool = self._book, self._pool
        if book is None or pool is None:
            return StreamState(self._stream_meta(), 0, self._worker_seed, [], {})
        states = {}
        for w, batch in book.last.items():
            if w not in book.done:
                # Sent by the worker before it committed the batch, so read by now.
                states[w] = pool.states[w][batch]
        return StreamState(self._stream_meta(), book.next_batch, self._worker_seed,
                           sorted(book.done), states)

    def _iter_plan(self) -> Iterator[Any]:
        bpe, ppb = self._shape()
        # The first for after load_state_dict yields the rest of the saved epoch, which is
        # nothing for a state saved after the plan's last batch; any other for at the plan's
        # end would be an epoch past it, and says so.
        rest, self._rest_of_state = self._rest_of_state, False
        if self._started:
            assert self._consumer is not None
            batch = self._consumer.state()[0] // ppb
        else:
            batch = self._resume["seq"] // ppb if self._resume is not None else self._stood
        if self._epoch_wanted is not None:
            target = self._epoch_wanted * bpe
            self._epoch_wanted = None
        elif batch % bpe == 0 or (not self._started and self._resume is not None):
            target = batch  # an epoch's start, or a saved state to resume mid-epoch
        else:
            target = (batch // bpe + 1) * bpe  # a loop left mid-epoch: the next epoch
        if self._started and target != batch:
            self._stop()
        if not self._started and self._attached_ring is None and target >= self.epochs * bpe:
            # At the plan's end (a state saved after its last batch, or set_epoch past it):
            # nothing is left to make, so nothing starts.
            if rest and target == batch:
                return
            raise self._past_the_plan(target // bpe)
        if not self._started:
            resume, self._resume = self._resume, None
            self._start(target * ppb)
            assert self._consumer is not None
            fp = self._consumer.state()[1]
            if resume is not None and fp != resume["fingerprint"]:
                self._stop()
                raise _native.RefusedError(
                    f"the state to resume from was saved under another plan (fingerprint "
                    f"{resume['fingerprint']:#x}, this loader's is {fp:#x}): the same dataset "
                    "length and fields, batch_size, shuffle, seed, drop_last, rank and "
                    "world_size are needed"
                )
        assert self._consumer is not None
        # Where the consumer stands: the target, or (attached to a ring other consumers took
        # batches from) right after the batches taken.
        first = self._consumer.state()[0] // ppb
        end = (first // bpe + 1) * bpe
        ended = False
        while self._consumer.state()[0] // ppb < end:
            b = self._next_or_stop()
            if b is None:
                ended = True  # the plan's end: workers leave, as they should
                break
            box = [b]
            del b
            # Converted and yielded in one expression: this generator keeps no reference to
            # the batch, so its buffer goes back as soon as the caller's tensors are gone.
            yield self._convert(box)
        # The epoch's end: report a worker's error, restart a dead worker for the next epoch.
        self._check_workers(restart=not ended)
        if ended and self._consumer.state()[0] // ppb == first and not rest:
            raise self._past_the_plan(first // bpe)  # the plan had ended before this for

    def _past_the_plan(self, epoch: int) -> _native.UsageError:
        """The error of a ``for`` after the plan's last epoch: not an empty epoch."""
        if self._attached_ring is None:
            covers = f"the loader's plan covers {self.epochs} epochs (epochs={self.epochs})"
            fix = "pass a larger epochs=, or leave it out for a plan without end"
        else:
            covers = (f"ring {self._attached_ring!r} runs {self.epochs} epochs (plan.epochs = "
                      f"{self.epochs})")
            fix = "start the ring's daemon with more epochs (plan.epochs in its config)"
        return _native.UsageError(
            f"pinring.torch.DataLoader: this for would be epoch {epoch}, but {covers}, all of "
            f"which were taken: {fix}"
        )

    def _convert(self, box: List[_native.Batch], rows: Optional[int] = None) -> Any:
        b = box.pop()
        layout = self._infer()
        fields = b.fields
        tensors = layout.tensors(fields, lambda carried: torch_tensors(torch, carried), rows)
        b.release()
        del b, fields
        while self._lent and not any(r() is not None for r in self._lent[0]):
            self._lent.popleft()
        if layout.any_ragged and self.batch_size == 1:
            # One sample a batch: as torch's collate stacks one, whatever its shape.
            tensors = [t[0].unsqueeze(0) if leaf.ragged else t
                       for t, leaf in zip(tensors, layout.leaves)]
        elif layout.any_ragged and self._ragged_as == "jagged" and not (
                self._unbatched or layout.collate_in_trainer):
            tensors = [_jagged(t, name) if leaf.ragged else t
                       for t, leaf, name in zip(tensors, layout.leaves, layout.names)]
        self._lent.append([weakref.ref(t) for t in _all_tensors(tensors)])
        if layout.collate_in_trainer:
            # A ragged field: the collate_fn on the whole batch's samples, here (the workers
            # carried them as they are).
            return _collate_here(layout, tensors, self.collate_fn, self._unbatched)
        if self._unbatched:
            # As torch's default_convert: the sample as it was, arrays as tensors, numbers as
            # Python numbers, no batch dimension.
            return _rebuild(layout.tree, [
                t[0].item() if number else t[0] for t, number in zip(tensors, layout.numbers)
            ])
        return _rebuild(layout.tree, tensors)

    def _copy_out(self, buffers: int) -> None:
        """The loop keeps every batch buffer of the ring (``list(loader)``, outputs collected
        over an evaluation): the oldest batches it keeps are copied out of the ring, their
        tensors moved to the copies in place (the same tensor objects, so the caller's lists
        and dicts see them), until a buffer is free. torch's DataLoader lets a script keep every
        batch; here that costs a copy per batch kept beyond the buffers, said once."""
        assert self._consumer is not None
        held = self._consumer.buffers_held[0]
        while self._lent and self._consumer.buffers_held[0] >= buffers:
            tensors = [t for t in (r() for r in self._lent.popleft()) if t is not None]
            if not tensors:
                continue
            with torch.no_grad():
                copies = [t.clone() for t in tensors]
                if copies[0].is_cuda:
                    # The daemon may upload into the buffer as soon as it is back: the copies
                    # must have read it first.
                    torch.cuda.current_stream(copies[0].device).synchronize()
                for t, c in zip(tensors, copies):
                    t.data = c
            del tensors, copies
        if self._consumer.buffers_held[0] < held and not self._warned_copy:
            self._warned_copy = True
            warnings.warn(
                f"pinring.torch.DataLoader: the loop keeps all {buffers} batch buffers of "
                "its ring (batches or tensors made from them are still alive), so the "
                "oldest batches it keeps are copied out of the ring, which costs a copy of "
                "each: drop batches once used, or pass a larger prefetch= to keep more in "
                "place",
                UserWarning,
                stacklevel=4,
            )

    # -- checkpoints ---------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """Where the next batch comes from: ``{"seq": ..., "fingerprint": ...}``; over an
        iterable dataset, each worker's place in its stream (``_stream.StreamState``)."""
        if self._stream:
            if self._book is not None and self._pool is not None:
                self._pool.read_reports()
                return self._book_state().saved()
            if self._stream_resume is not None:
                return self._stream_resume.saved()
            return self._book_state().saved()  # between fors: the next for's start
        if self._consumer is not None:
            seq, fp = self._consumer.state()
            return {"seq": seq, "fingerprint": fp}
        if self._resume is not None:
            return dict(self._resume)
        raise _native.UsageError(
            "the loader is not running: state_dict() is known from the first for until close()"
        )

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resumes at a saved state: the next batch is the one at ``state["seq"]``; a state of
        another plan is refused when the loader starts. Over an iterable dataset: the next
        ``for`` goes on where each worker's stream stood."""
        if self._stream:
            self._stop()
            self._stream_resume = StreamState.load(state, self._stream_meta())
            return
        resume = checked_state(state)
        self._stop()
        self._resume = resume
        self._rest_of_state = True


def _layout_outcome(kind: str, what: Any, text: str) -> Optional[_Layout]:
    """The layout a worker (or the process set up as one) learned, as ``_worker._layout_job``
    reports it: the layout; None where every stream is empty (``"empty"``); else the
    ``UsageError`` or the dataset's exception it reported, raised."""
    if kind == "ok":
        return what  # type: ignore[no-any-return]
    if kind == "empty":
        return None
    if kind == "usage":
        raise what(text)
    _reraise(what, text)
    raise AssertionError("unreachable")


def _indices(drawn: Any, what: str, epoch: int) -> Any:
    """The indices a sampler (``what``) drew for ``epoch``, as int64; one that is no integer (a
    list of indices, which torch's DataLoader with ``batch_size=None`` hands to ``__getitem__``
    as it is) is a ``UsageError`` (also a ``TypeError``) naming it and its position."""
    import numpy as np

    out = []
    for at, i in enumerate(drawn):
        if isinstance(i, bool) or not hasattr(i, "__index__"):
            raise _native.UsageError(
                f"the {what} yielded {i!r} (a {type(i).__name__}) at position {at} of epoch "
                f"{epoch}, where pinring's plan carries one sample index per position: yield "
                "ints; for several samples a batch, pass them as a batch_sampler (or batch_size) "
                "instead of a sampler of lists with batch_size=None"
            )
        out.append(i.__index__())
    return np.asarray(out, dtype=np.int64)


def _warn_stream_longer(loader: "DataLoader[Any]", yielded: int) -> None:
    """torch's warning (its words) for an iterable dataset that yields more than the length
    ``len(loader)`` was reckoned from."""
    text = (f"Length of IterableDataset {loader.dataset} was reported to be "
            f"{loader._stream_len_said} (when accessing len(dataloader)), but {yielded} samples "
            "have been fetched. ")
    if loader.num_workers > 0:
        text += ("For multiprocessing data-loading, this could be caused by not properly "
                 "configuring the IterableDataset replica at each worker.")
    warnings.warn(text)


def _jagged(values: List[torch.Tensor], name: str) -> torch.Tensor:
    """A ragged field's batch as one nested tensor of torch's jagged layout
    (``torch.nested.nested_tensor_from_jagged``): the values one after another (one copy on
    their device) and the offsets of each sample's first row. Only the first dimension may
    vary; a field whose other dimensions vary is a ``UsageError`` naming it."""
    rest = {tuple(v.shape[1:]) for v in values}
    if len(rest) > 1 or values[0].dim() == 0:
        raise _native.UsageError(
            f"ragged field {name!r}: its samples differ in more than their first dimension "
            f"({sorted(rest)} after it), which torch's jagged layout cannot hold: pass "
            "ragged_as=\"list\" for a list of the batch's tensors"
        )
    lengths = torch.tensor([0] + [v.shape[0] for v in values], device=values[0].device)
    return torch.nested.nested_tensor_from_jagged(torch.cat(values), lengths.cumsum(0))


def _all_tensors(values: List[Any]) -> List[torch.Tensor]:
    """The tensors among ``values`` and in their lists (a ragged field's)."""
    out: List[torch.Tensor] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, list):
            out.extend(t for t in v if isinstance(t, torch.Tensor))
    return out


def _collate_here(layout: _Layout, tensors: List[Any], collate_fn: Any, unbatched: bool) -> Any:
    """``collate_fn`` on the batch's samples rebuilt (the tree of each: its rows of the
    arrays, its ragged arrays, its str, numbers as Python numbers), or on the one sample with
    ``batch_size=None``."""
    # Each leaf's rows at once: numbers read back to the host in one copy, a tensor's rows as
    # views in one unbind (not one indexing per sample), lists (str, ragged) as they are.
    columns = [
        t.cpu().tolist() if number else (list(t.unbind(0)) if isinstance(t, torch.Tensor) else t)
        for t, number in zip(tensors, layout.numbers)
    ]
    samples = [_rebuild(layout.tree, row) for row in zip(*columns)]
    return collate_fn(samples[0] if unbatched else samples)


def dataset_table(dataset: Any, collate_fn: Optional[Callable[[List[Any]], Any]] = None,
                  str_bytes: Optional[int] = None, ragged: Optional[List[str]] = None,
                  ragged_bytes: Optional[int] = None) -> str:
    """The ``[dataset]`` table of the config of a ``pinring-daemon --sink consumer`` service
    whose ring ``DataLoader(dataset, ring=...)`` fills, as TOML text: ``kind = "external"``,
    ``samples = len(dataset)`` and the ``fields`` of ``dataset[0]`` (or of
    ``collate_fn([dataset[0]])``) as the loader names and orders them. The names are the
    sample's dict keys, tuple positions and namedtuple fields (``image``, ``0``, ``meta.h``;
    ``sample`` for one array), declared largest element first; a str (or bytes) is two fields, a
    ``u8`` arena of ``str_bytes`` per sample and ``<name>-index`` (pass the DataLoader the same
    ``str_bytes``); a ragged array (its shape varies) two fields, its arena and
    ``<name>-index`` (pass the same ``ragged`` and ``ragged_bytes``). Put it in the
    service's config, beside its ``[ring]``, ``[plan]`` and ``[daemon]`` tables::

        print(pinring.torch.dataset_table(train_set))
    """
    layout = _layout_of(dataset, collate_fn, str_bytes=str_bytes, ragged=ragged or (),
                        ragged_bytes=ragged_bytes)
    return layout.dataset_table(len(dataset))


def _check_ring_fields(ring: str, fields: List[Tuple[str, str, List[int]]], layout: _Layout,
                       samples: int) -> None:
    want = layout.ring_fields()
    got = [(n, d, list(s)) for n, d, s in fields]
    if got != want:
        raise _native.RefusedError(
            f"ring {ring!r} carries fields {got}, but this dataset's samples need {want}: start "
            "its daemon with a config whose [dataset] table is "
            "pinring.torch.dataset_table(dataset)'s:\n" + layout.dataset_table(samples)
        )
