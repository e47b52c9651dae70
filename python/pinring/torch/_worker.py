"""The workers of ``pinring.torch.DataLoader``: each a process (or the thread of
``num_workers=0``) that joins the ring as a ``pinring.Producer``, claims parts, fills them from
the dataset through the sample layout, and commits them; what ``get_worker_info()`` says inside
one."""

from __future__ import annotations

import os
import pickle
import random
import select
import threading
import time
import traceback
from typing import Any, Callable, Dict, Iterable, Iterator, List, NamedTuple, Optional, Tuple

import torch

from pinring import _native
from pinring.torch._layout import PROBES, _Layout, _Packer, _write, layout_of, samples_layout
from pinring.torch._orders import OrderTable
from pinring.torch._stream import EndTable, StreamMaker, first_samples

# How long a wait lasts before the waiter looks again (seconds): a worker's claim waits one of
# these before it looks at the stop flag; the loop waits one for a batch before it looks at the
# workers. Batches arrive as soon
# as they are made; this only bounds how late a worker's error or death is seen.
_POLL = 0.1


class WorkerInfo(NamedTuple):
    """What ``get_worker_info()`` returns inside a worker (as torch's ``WorkerInfo``)."""

    id: int
    num_workers: int
    seed: int
    dataset: Any


_worker_info: Optional[WorkerInfo] = None


def get_worker_info() -> Optional[WorkerInfo]:
    """Inside a pinring worker: its id, the number of workers, its seed and its dataset copy.
    None in the training process."""
    return _worker_info


def _set_torch_worker_info(info: WorkerInfo) -> None:
    """Makes ``torch.utils.data.get_worker_info()`` say what it says in one of torch's
    workers: datasets that split their work or open per-worker files by worker id read it from
    torch, not from pinring."""
    from torch.utils.data._utils import worker as torch_worker

    torch_worker._worker_info = torch_worker.WorkerInfo(
        id=info.id, num_workers=info.num_workers, seed=info.seed, dataset=info.dataset
    )


class _Orders:
    """A worker's reading of the sampler's drawn orders (``_orders.OrderTable``): the sample
    indices of a part, from the order of its epoch (the last one read kept)."""

    def __init__(self, path: str, positions: int, depth: int, batches_per_epoch: int) -> None:
        self.table = OrderTable.open(path, positions, depth)
        self.batches_per_epoch = batches_per_epoch
        self.epoch = -1
        self.order: Any = None

    def indices(self, part: Any) -> List[int]:
        epoch = part.batch // self.batches_per_epoch
        if epoch != self.epoch:
            order = self.table.order(epoch)
            if order is None:
                raise RuntimeError(
                    f"the sampler's order of epoch {epoch} was not drawn when part {part.seq} "
                    "of it was claimed: a bug in pinring (the training process draws every "
                    "epoch the ring lets workers reach before they reach it)"
                )
            self.epoch, self.order = epoch, order
        return [int(self.order[p]) for p in part.indices]


class _WorkerArgs(NamedTuple):
    # The ring's ticket (its name, and where an anonymous one is opened: its daemon's
    # /proc/<pid>/fd/<fd>); None while the ring does not exist yet (an early worker's).
    ring: Optional[_native.RingTicket]
    dataset: Any
    layout: Optional[_Layout]
    collate_fn: Optional[Callable[[List[Any]], Any]]
    worker_init_fn: Optional[Callable[[int], None]]
    worker_id: int
    num_workers: int
    seed: int
    wait: float
    # A sampler's drawn order (_orders): the table's path, positions per epoch, depth and the
    # plan's batches per epoch; None: the plan's indices are the samples'.
    orders: Optional[Tuple[str, int, int, int]] = None
    # batch_size=None: collate_fn (if any) converts each sample, as torch's does.
    unbatched: bool = False
    # An IterableDataset (_stream): the end table's path, the batch size, drop_last, the first
    # batch of the for and the worker's saved place (a resumed state's, or None); None: a
    # map-style dataset, sample indices from the plan.
    stream: Optional[Tuple[str, int, bool, int, Optional[Dict[str, Any]]]] = None
    # A worker started before its ring exists (_pool.EarlyWorkers): what it reads first (worker
    # 0: the samples the layout is learned from, which it reports; another: sample "index"),
    # and the socket its ring comes on (``go``); None: the ring is in the fields above.
    early: Optional[Dict[str, Any]] = None
    go: int = -1


# The fields of _WorkerArgs an early worker learns when its ring exists (EarlyWorkers.adopt).
RING_ARGS = ("ring", "layout", "orders", "stream")


def _worker_main(args: _WorkerArgs, errors: Any, stop: Any) -> None:
    """A worker process (or the thread of ``num_workers=0``): claims parts of the ring's
    batches until the plan ends, fills them from the dataset, commits them. An exception in the
    user's code is sent to the training process with its traceback, and the worker ends.

    Reports to the training process (``errors``), as ``(worker_id, kind, index, type, text)``:
    ``"error"`` (an exception, or a commit refused for another reason than a reclaim; the loop
    raises it), ``"reclaimed"`` (a commit refused with ``PartReclaimed`` because the daemon took
    the part back after the lease; the worker goes on claiming, as the Rust loader does, and the
    part is made again), ``"ring"`` (the ring failed under a claim; the worker ends and is not
    restarted) and ``"done"`` (the plan ended; the worker ends). A worker that ends without a
    report while the loader runs is restarted (``DataLoader._check_workers``)."""
    _Run(args, errors, stop).run()


class _Run:
    """One worker's run (``_worker_main``); ``stage`` and ``index`` say where it is, for the
    report of an exception."""

    def __init__(self, args: _WorkerArgs, errors: Any, stop: Any) -> None:
        self.args, self.errors, self.stop = args, errors, stop
        self.stage = "starting"
        self.index = -1

    def run(self) -> None:
        try:
            self._set_up()
            if self.args.early is not None:
                # Worker 0 learns the layout from sample 0 and the probes; another loads one.
                self.stage, self.index = ("learning", 0) if self.args.worker_id == 0 else (
                    "loading", int(self.args.early["index"]))
                ring = _first_sample_then_ring(self.args, self.errors, self.stop, self)
                if ring is None:
                    return  # the loader stopped before its ring was made, or worker 0 failed
                self.args = self.args._replace(early=None, **ring)
            self.stage = "attaching"
            producer = self._producer()
            try:
                self._parts(producer)
            finally:
                producer.close()
        except BaseException as e:  # noqa: BLE001 - everything reaches the training loop
            self._failed(e)

    def _set_up(self) -> None:
        """Worker info, seeds, one intra-op thread, ``worker_init_fn``, as torch's workers."""
        global _worker_info
        args = self.args
        if args.num_workers > 0:
            _worker_info = WorkerInfo(args.worker_id, args.num_workers, args.seed, args.dataset)
            _set_torch_worker_info(_worker_info)
            random.seed(args.seed)
            torch.manual_seed(args.seed)
            torch.set_num_threads(1)
        if args.worker_init_fn is not None:
            self.stage = "worker_init_fn"
            args.worker_init_fn(args.worker_id)

    def _producer(self) -> Any:
        """This worker's ``Producer`` on the ring."""
        args = self.args
        # The workers start together: each keeps to its own share of the slots from its first
        # claim, so it writes (and counts in its PSS) only those pages of the ring.
        workers = max(1, args.num_workers)
        # An iterable dataset's worker makes its own batches: every workers-th (_stream).
        keep: Dict[str, Any] = {} if args.stream is None else {
            "only_batches": (args.worker_id, workers)}
        # No config: the worker adopts the spec the ring's daemon stored in it.
        ticket = args.ring
        assert ticket is not None, "a worker joins once its ring exists"
        return _native.Producer(
            ticket.ring, wait=args.wait, path=ticket.path,
            peers=args.num_workers if args.num_workers > 1 and args.stream is None else None,
            **keep,
        )

    def _report_state(self, batch: int, snapshot: Dict[str, Any]) -> None:
        """Sends where this worker's stream stands after ``batch``: pickled once, here, its
        size checked, and sent as bytes (the pool unpickles it)."""
        data = pickle.dumps(snapshot)
        size = len(data)
        if size > _STATE_MAX:
            raise _native.UsageError(
                f"the state of worker {self.args.worker_id}'s stream after batch {batch} (its "
                f"dataset's or iterator's state_dict()) pickles to {size} bytes, over the "
                f"{_STATE_MAX} a worker may report: keep a position in it, not the data"
            )
        self.errors.put((self.args.worker_id, "state", batch, data, ""))

    def _streaming(self, position: int) -> None:
        self.index = position

    def _loaded(self, indices: Any) -> Iterator[Any]:
        """The samples at ``indices``, loaded one by one as they are taken."""
        for i in indices:
            self.stage, self.index = "loading", int(i)
            yield self.args.dataset[i]

    def _fill(self, samples: Iterable[Any], first: int, views: List[Any],
              packer: Optional[_Packer], collate: Any) -> None:
        """Writes a part's ``samples`` (the first of them sample ``first``) into its
        ``views``: each sample in its row, through ``collate`` with ``batch_size=None``;
        or, with a collate_fn, what it makes of them all (a short batch of an iterable
        dataset: its first rows; the rest stay unwritten)."""
        layout = self.args.layout
        assert layout is not None
        if collate is None or self.args.unbatched:
            for j, sample in enumerate(samples):
                if collate is not None:
                    self.stage = "collating"
                    sample = collate(sample)
                _write(layout, sample, views, j, self.index, None, packer)
            return
        listed = list(samples)
        if listed:
            self.stage, self.index = "collating", first
            rows = [None if v is None else v[:len(listed)] for v in views]
            _write(layout, collate(listed), rows, None, self.index, len(listed))

    def _parts(self, producer: Any) -> None:
        """Claims, fills and commits parts until the plan ends or the stop flag is set."""
        args, errors, stop = self.args, self.errors, self.stop
        thread = args.num_workers == 0
        layout = args.layout
        assert layout is not None, "a worker joins its ring with the layout"
        orders = None if args.orders is None else _Orders(*args.orders)
        maker = None
        if args.stream is not None:
            self.stage = "streaming"
            workers = max(1, args.num_workers)
            maker = StreamMaker(
                args.dataset, args.worker_id, workers, args.stream[1], args.stream[2],
                EndTable.open(args.stream[0], workers), report=self._report_state,
                first_batch=args.stream[3], restore=args.stream[4],
            )
        while not stop.is_set():
            self.stage = "claiming"
            try:
                part = producer.claim(_POLL)
            except _native.Timeout:
                continue  # no free slot yet: look at the stop flag, wait again
            if part is None:
                errors.put((args.worker_id, "done", -1, None, ""))
                return
            claimed = time.monotonic()
            views = layout.part_views(part.fields, thread)
            # Ragged fields and str: the part's samples packed into their arenas; with a
            # ragged field, a collate_fn runs in the training process, on the whole batch.
            packer = _Packer(part.first_in_batch, len(part.indices)) if (
                layout.any_packed) else None
            collate = None if layout.collate_in_trainer else args.collate_fn
            if maker is not None:
                self.stage = "streaming"
                first = part.first_in_batch
                mine = maker.samples(part.batch, self._streaming)[
                    first:first + len(part.indices)]
                self._fill(mine, self.index, views, packer, collate)
                at, origin = self.index, f"row {first} of worker {args.worker_id}'s batch"
            else:
                indices = part.indices if orders is None else orders.indices(part)
                self._fill(self._loaded(indices), indices[0] if len(indices) else -1, views,
                           packer, collate)
                at = part.indices[0] if len(part.indices) else -1
                origin = f"sample {at}"
            del views
            self.stage = "committing"
            try:
                part.commit()
            except _native.PartReclaimed as e:
                if stop.is_set():
                    return  # the loader is closing: the ring ended under the commit
                # The lease ran out before the commit: the daemon has taken the part back
                # and has it made again (an iterable dataset's worker claims it again and
                # writes it from the samples its maker kept). As the Rust loader: say so,
                # go on claiming. (Any other error of the commit, a part too large for its
                # slot, is an "error".)
                errors.put((
                    args.worker_id, "reclaimed", at, None,
                    f"part {part.seq} (batch {part.batch}, {len(part.indices)} samples from "
                    f"{origin}) took {time.monotonic() - claimed:.1f} s from claim to "
                    f"commit: {e}",
                ))
                continue
            if maker is not None:
                maker.committed(part.batch, len(part.indices))
            self.index = -1

    def _failed(self, e: BaseException) -> None:
        """Reports the exception that ended this worker, saying where it came."""
        stage, index, worker_id = self.stage, self.index, self.args.worker_id
        if isinstance(e, _native.PinringError) and stage == "claiming":
            # The ring ended or failed under the claim (the loader is closing, the daemon is
            # gone): the consumer sees the same; the report says why this worker ended.
            _put(self.errors, (worker_id, "ring", index, type(e), f"{type(e).__name__}: {e}"))
            return
        text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        place = {
            "loading": f" while loading sample {index}",
            "learning": f" while loading sample {index} (to learn the batches' fields)",
            "streaming": f" while iterating its dataset (sample {index} of its stream)",
            "collating": f" in collate_fn for a part from sample {index}",
            "worker_init_fn": " in worker_init_fn",
            "attaching": " while joining the ring",
            "waiting": " while waiting for its ring",
        }.get(stage, "")
        message = (
            f"Caught {type(e).__name__} in pinring DataLoader worker {worker_id}{place}.\n"
            f"Original {text}"
        )
        message += _fork_note(e)
        _put(self.errors, (worker_id, "error", index, type(e), message))


def _first_sample_then_ring(args: _WorkerArgs, errors: Any, stop: Any,
                            run: "_Run") -> Optional[Dict[str, Any]]:
    """An early worker's start (``args.early``; ``_pool.EarlyWorkers``): worker 0 learns the
    layout from the samples ``args.early`` names and reports it (``"layout"``: the pickled
    result of ``_layout_job``'s shape), another worker loads its sample; then each waits for its
    ring's fields (``RING_ARGS``) on ``args.go``. None where no ring comes: the socket closed
    empty (the loader stopped first), the stop flag set, or worker 0's layout refused."""
    job = args.early
    assert job is not None
    if args.worker_id == 0:
        try:
            result: Tuple[str, Any, str] = ("ok", layout_of(
                args.dataset, args.collate_fn, job["unbatched"], job["str_bytes"],
                job["ragged"], job["ragged_bytes"], job["probe"]), "")
        except _native.PinringError as e:
            result = ("usage", type(e), str(e))
        data = pickle.dumps(result)
        if len(data) > _STATE_MAX:
            # No ring carries so many fields (pinring's limit is far below): say so here, where
            # the report that would carry them cannot.
            n = len(result[1].declared) if result[0] == "ok" else 0
            data = pickle.dumps(("usage", _native.UsageError,
                                 f"dataset[0] makes {n} fields of the ring, whose description "
                                 f"pickles to {len(data)} bytes: far more than a ring carries; "
                                 "return fewer arrays, or group them into one array"))
        errors.put((0, "layout", 0, data, ""))
        if result[0] != "ok":
            return None
    else:
        # Read and let go: a dataset whose __getitem__ waits until every worker is inside it
        # (a barrier) lets worker 0's sample 0 through only once each worker has come.
        args.dataset[job["index"]]
    run.stage, run.index = "waiting", -1
    # The message is its length (8 bytes) and its pickle: read to its length, not to the
    # socket's end, which a process forked from the training process meanwhile may hold open.
    data = b""
    size = None
    while not stop.is_set() and (size is None or len(data) < size):
        ready, _, _ = select.select([args.go], [], [], _POLL)
        if not ready:
            continue
        chunk = os.read(args.go, 1 << 16)
        if not chunk:
            break
        data += chunk
        if size is None and len(data) >= 8:
            size = 8 + int.from_bytes(data[:8], "little")
    os.close(args.go)
    if size is None or len(data) < size or stop.is_set():
        return None
    ring: Dict[str, Any] = pickle.loads(data[8:size])
    return ring


# The largest state a worker's stream may report after a batch (pickled), within a report.
_STATE_MAX = 60 * 1024


def _layout_job(dataset: Any, collate_fn: Optional[Callable[[List[Any]], Any]],
                worker_init_fn: Optional[Callable[[int], None]],
                job: Dict[str, Any]) -> Tuple[str, Any, str]:
    """In a process forked from the zygote, set up as worker 0 is (its worker info, seeds and
    ``worker_init_fn``): the layout of an iterable dataset's batches, from the first samples of
    the first worker whose stream has one (each worker set up in turn), so that the training
    process never runs the dataset's code when it has workers, as torch's never does. (A
    map-style dataset's worker 0 learns it itself: ``_first_sample_then_ring``.) Returns
    ``("ok", layout, "")``, ``("empty", None, "")`` where every stream is empty, ``("usage",
    error type, message)`` for what pinring cannot batch, or ``("error", type, message)`` for
    an exception of the dataset's code, as a worker reports it."""
    global _worker_info
    stage = "starting"
    try:
        _worker_info = WorkerInfo(0, job["num_workers"], job["seed"], dataset)
        _set_torch_worker_info(_worker_info)
        random.seed(job["seed"])
        torch.manual_seed(job["seed"])
        # One intra-op thread, as a worker (and torch's workers): this process is forked from
        # a zygote forked from the training process, whose OpenMP pool, if it ran one, does
        # not survive the fork; a parallel op here (filling a large tensor) hung on it.
        torch.set_num_threads(1)
        if worker_init_fn is not None:
            stage = "worker_init_fn"
            worker_init_fn(0)
        stage = "loading"

        # The first sample of the first worker whose stream has one (worker 0's, unless its
        # share of the stream is empty), each set up as that worker.
        def setup(worker: int, seed: int) -> None:
            global _worker_info
            nonlocal stage
            _worker_info = WorkerInfo(worker, job["num_workers"], seed, dataset)
            _set_torch_worker_info(_worker_info)
            if worker_init_fn is not None and worker > 0:
                stage = "worker_init_fn"
                worker_init_fn(worker)
            stage = "loading"

        samples = first_samples(dataset, job["num_workers"], job["seed"], setup,
                                PROBES if job["probe"] else 1)
        if not samples:
            return "empty", None, ""
        return "ok", samples_layout(samples, collate_fn, job["unbatched"], job["str_bytes"],
                                    job["ragged"], job["ragged_bytes"]), ""
    except _native.PinringError as e:
        return "usage", type(e), str(e)
    except BaseException as e:  # noqa: BLE001 - everything reaches the training loop
        from pinring.torch._pool import builtin_base

        text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        place = " in worker_init_fn" if stage == "worker_init_fn" else " while loading sample 0"
        message = (
            f"Caught {type(e).__name__} in pinring DataLoader worker 0{place} (to learn the "
            f"batches' fields).\nOriginal {text}"
        ) + _fork_note(e)
        exc_type: Any = type(e)
        try:
            pickle.dumps(exc_type)
        except Exception:  # noqa: BLE001 - a type that does not pickle: its builtin base
            exc_type = builtin_base(exc_type)
        return "error", exc_type, message


def _fork_note(e: BaseException) -> str:
    """pinring's note for torch's refusal of CUDA in a process forked after CUDA was
    initialised (the workers and the process that reads sample 0 are forked); else ""."""
    if "forked subprocess" not in str(e):
        return ""
    return (
        "pinring's workers are forked and only write host memory: the dataset must not "
        "use CUDA in __getitem__ (the batches reach the device through the ring), or "
        "pass multiprocessing_context=\"spawn\" to start the workers in a process that "
        "never initialised CUDA\n"
    )


def _put(errors: Any, report: Tuple[int, str, int, Any, str]) -> None:
    """Sends a worker's report; where the exception's type does not pickle (a class defined in
    a function), with the nearest builtin type it derives from instead (``MemoryError``)."""
    try:
        errors.put(report)
    except Exception:
        from pinring.torch._pool import builtin_base

        errors.put(report[:3] + (builtin_base(report[3]),) + report[4:])


def fork_args(args: _WorkerArgs) -> Dict[str, Any]:
    """What the zygote is sent to fork the worker ``args`` describes: all of them less what
    the zygote holds (``_procs.Payload``) and the early worker's socket (sent beside)."""
    held = ("dataset", "collate_fn", "worker_init_fn", "go")
    return {k: v for k, v in args._asdict().items() if k not in held}


class _Worker:
    """One worker: a process forked from the loader's zygote (``_procs.Zygote``), or the thread
    of ``num_workers=0`` (``zygote`` None)."""

    def __init__(self, zygote: Any, args: _WorkerArgs, errors: Any, stop: Any,
                 pid: Optional[int] = None) -> None:
        self.args = args
        self.zygote = zygote
        self.pid = 0
        self.thread: Optional[threading.Thread] = None
        if pid is not None:
            # A worker forked before the ring existed, now sent its ring (_pool.EarlyWorkers).
            self.pid = pid
        elif zygote is None:
            self.thread = threading.Thread(
                target=_worker_main, args=(args, errors, stop), name="pinring-worker",
                daemon=True,
            )
            self.thread.start()
        else:
            self.pid = zygote.fork(fork_args(args))

    def exitcode(self) -> Optional[int]:
        if self.thread is not None:
            return None if self.thread.is_alive() else 0
        code: Optional[int] = self.zygote.exitcode(self.pid)
        return code

    def wait(self, deadline: float) -> bool:
        """Waits until the worker has ended or `deadline` (time.monotonic) passes; whether it
        ended."""
        if self.thread is not None:
            self.thread.join(max(0.0, deadline - time.monotonic()))
            return not self.thread.is_alive()
        return self.zygote.wait(self.pid, deadline) is not None

    def kill(self) -> None:
        """Kills a worker process (a thread cannot be killed: it ends at its next look at the
        stop flag, or with the process)."""
        if self.thread is None:
            self.zygote.kill(self.pid)
