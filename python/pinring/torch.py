"""``pinring.torch.DataLoader``: keep your ``Dataset``, drop the DataLoader around it.

    from pinring.torch import DataLoader          # instead of torch.utils.data.DataLoader
    loader = DataLoader(dataset, batch_size=256, shuffle=True, num_workers=8)
    for images, labels in loader:                 # CUDA tensors, already on the device
        ...

It takes ``torch.utils.data.DataLoader``'s arguments and yields what the default collate would
yield (lists for tuples, dicts, namedtuples, tensors for numbers and arrays), as tensors on
``device``. Underneath:

- ``num_workers`` worker processes (started with ``spawn``, so CUDA is safe) run the dataset's
  ``__getitem__`` and write each sample straight into a slot of a pinring ring, through NumPy
  views of the slot (``pinring.Producer``): no pickling, no queue, no pin-memory thread.
- A pinring daemon on a thread of this process (embedded mode) uploads the slots into device
  batch buffers; with ``ring=`` the loader attaches to a daemon running as a service instead.
- The sample layout (fields, dtypes, shapes) is inferred from ``dataset[0]``; every other sample
  must match it, and the error names the index and both shapes when it does not.
- A worker that dies is restarted, and the batch part it held is made again (the ring's leases);
  an exception in ``__getitem__`` reaches the loop with the worker's traceback.

The order of samples is pinring's plan (``docs/PYTHON.md``, "Order"): the same batches as
PyTorch's with ``shuffle=False``; with ``shuffle=True`` every epoch is a permutation of the
dataset, reproducible from ``seed`` and the epoch, but not PyTorch's permutation.
"""

from __future__ import annotations

import collections.abc
import logging
import multiprocessing
import os
import queue as _queue
import random
import shutil
import tempfile
import threading
import time
import traceback
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch

from pinring import _native
from pinring.loader import checked_state

__all__ = ["DataLoader", "WorkerInfo", "get_worker_info"]

log = logging.getLogger("pinring.torch")

# Epochs a loader's plan covers unless told otherwise: each ``for`` takes one.
DEFAULT_EPOCHS = 100_000
# How long the loop waits for a batch before it looks at the workers again (seconds). Batches
# arrive as soon as they are made; this only bounds how late a worker's error or death is seen.
_POLL = 0.1
# Workers are looked at after this long even while batches flow (seconds).
_CHECK_EVERY = 0.5

_NUMPY_DTYPES: Dict[np.dtype, str] = {
    np.dtype(np.uint8): "u8",
    np.dtype(np.int8): "i8",
    np.dtype(np.int16): "i16",
    np.dtype(np.uint16): "u16",
    np.dtype(np.int32): "i32",
    np.dtype(np.uint32): "u32",
    np.dtype(np.int64): "i64",
    np.dtype(np.uint64): "u64",
    np.dtype(np.float16): "f16",
    np.dtype(np.float32): "f32",
    np.dtype(np.float64): "f64",
    np.dtype(np.bool_): "bool",
}
_TORCH_DTYPES: Dict[Any, str] = {
    torch.uint8: "u8",
    torch.int8: "i8",
    torch.int16: "i16",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float32: "f32",
    torch.float64: "f64",
    torch.bool: "bool",
}
for _name, _code in (("uint16", "u16"), ("uint32", "u32"), ("uint64", "u64")):
    if hasattr(torch, _name):
        _TORCH_DTYPES[getattr(torch, _name)] = _code
_ITEMSIZE = {"u8": 1, "i8": 1, "bool": 1, "i16": 2, "u16": 2, "f16": 2, "bf16": 2,
             "i32": 4, "u32": 4, "f32": 4, "i64": 8, "u64": 8, "f64": 8}


# -- the sample layout -----------------------------------------------------------------------


class _Leaf(NamedTuple):
    path: str  # where it sits in the sample, for messages: "[0]", "['image']"
    dtype: str  # pinring's dtype name
    shape: Tuple[int, ...]  # per sample


def _describe(value: Any) -> Optional[Tuple[str, Tuple[int, ...]]]:
    """(dtype, shape) of a value that can be a leaf of a batch; None if it cannot."""
    if isinstance(value, torch.Tensor):
        dt = _TORCH_DTYPES.get(value.dtype)
        return None if dt is None else (dt, tuple(value.shape))
    if isinstance(value, (np.ndarray, np.generic)):
        dt = _NUMPY_DTYPES.get(value.dtype)
        return None if dt is None else (dt, tuple(value.shape))
    # bool before int: bool is an int. As torch's default collate: bool, int64, float64.
    if isinstance(value, bool):
        return "bool", ()
    if isinstance(value, int):
        return "i64", ()
    if isinstance(value, float):
        return "f64", ()
    return None


def _flatten(value: Any, path: str, leaves: List[Any], paths: List[str]) -> Any:
    """Appends the leaves of ``value`` in order; returns the tree to rebuild it with."""
    if isinstance(value, collections.abc.Mapping):
        keys = list(value.keys())
        kids = [_flatten(value[k], f"{path}[{k!r}]", leaves, paths) for k in keys]
        return ("map", type(value), keys, kids)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        kids = [_flatten(v, f"{path}.{f}", leaves, paths) for f, v in zip(value._fields, value)]
        return ("namedtuple", type(value), kids)
    if isinstance(value, (tuple, list)):
        kids = [_flatten(v, f"{path}[{i}]", leaves, paths) for i, v in enumerate(value)]
        return ("seq", kids)
    leaves.append(value)
    paths.append(path)
    return ("leaf", len(leaves) - 1)


def _rebuild(tree: Any, tensors: Sequence[Any]) -> Any:
    kind = tree[0]
    if kind == "leaf":
        return tensors[tree[1]]
    if kind == "seq":
        # As torch's default collate: a tuple or a list of fields becomes a list.
        return [_rebuild(t, tensors) for t in tree[1]]
    if kind == "namedtuple":
        return tree[1](*(_rebuild(t, tensors) for t in tree[2]))
    _, cls, keys, kids = tree
    items = {k: _rebuild(t, tensors) for k, t in zip(keys, kids)}
    try:
        return cls(items)
    except TypeError:
        return items


class _Layout:
    """Fields of a batch as inferred from one sample (or one collated part of one sample)."""

    def __init__(self, sample: Any, collated: bool) -> None:
        leaves: List[Any] = []
        paths: List[str] = []
        self.tree = _flatten(sample, "", leaves, paths)
        self.leaves: List[_Leaf] = []
        for value, path in zip(leaves, paths):
            where = path or "the sample"
            d = _describe(value)
            if d is None:
                raise _native.UsageError(
                    f"{where} of {'collate_fn([dataset[0]])' if collated else 'dataset[0]'} is a "
                    f"{type(value).__name__}{_dtype_note(value)}; pinring batches hold fixed-shape "
                    "numbers, NumPy arrays and tensors: return one of those (or leave the field "
                    "out)"
                )
            dtype, shape = d
            if collated:
                if len(shape) == 0 or shape[0] != 1:
                    raise _native.UsageError(
                        f"{where} of collate_fn([dataset[0]]) has shape {list(shape)}; collate_fn "
                        "runs in the workers on the samples of a batch part, and each array it "
                        "returns must have the part's samples as its first dimension (1 here)"
                    )
                shape = shape[1:]
            self.leaves.append(_Leaf(path, dtype, tuple(int(s) for s in shape)))
        if not self.leaves:
            raise _native.UsageError("dataset[0] holds no arrays or numbers: nothing to batch")
        # Field names in the ring: leaf numbers. Fields are declared largest element first, so
        # every field's chunk in a slot starts aligned to its element size.
        order = sorted(range(len(self.leaves)), key=lambda i: -_ITEMSIZE[self.leaves[i].dtype])
        self.names = [f"f{i}" for i in range(len(self.leaves))]
        self.declared = [(self.names[i], self.leaves[i]) for i in order]

    def toml_fields(self) -> str:
        rows = ",\n".join(
            f'  {{ name = "{name}", dtype = "{leaf.dtype}", shape = {list(leaf.shape)} }}'
            for name, leaf in self.declared
        )
        return f"fields = [\n{rows},\n]"

    def check(self, index: int, value: Any, leaf: _Leaf, n: Optional[int]) -> None:
        """Raises ``UsageError`` when ``value`` (of sample ``index``, or of a collated part of
        ``n`` samples) does not match the layout."""
        d = _describe(value)
        # A sample's element has the leaf's shape; a collated part's has n rows of it.
        want_shape = leaf.shape if n is None else (n, *leaf.shape)
        if d is not None and d == (leaf.dtype, want_shape):
            return
        where = leaf.path or "the sample"
        what = f"sample {index}" if n is None else f"collate_fn's output for a part from sample {index}"
        if d is None:
            got = f"a {type(value).__name__}{_dtype_note(value)}"
        else:
            got = f"{d[0]} of shape {list(d[1])}"
        want = f"{leaf.dtype} of shape {list(want_shape)}"
        raise _native.UsageError(
            f"{where} of {what} is {got}, but dataset[0] made it {want}: every sample must have "
            "the same fields, dtypes and shapes (pad, crop or resize in the dataset, or batch "
            "them in a collate_fn that returns fixed shapes)"
        )


def _dtype_note(value: Any) -> str:
    dt = getattr(value, "dtype", None)
    return "" if dt is None else f" of dtype {dt}"


# -- the workers -----------------------------------------------------------------------------


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


class _WorkerArgs(NamedTuple):
    ring: str
    config: str
    dataset: Any
    layout: _Layout
    collate_fn: Optional[Callable[[List[Any]], Any]]
    worker_init_fn: Optional[Callable[[int], None]]
    worker_id: int
    num_workers: int
    seed: int
    wait: float


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
    global _worker_info
    index = -1
    stage = "starting"
    try:
        if args.num_workers > 0:
            _worker_info = WorkerInfo(args.worker_id, args.num_workers, args.seed, args.dataset)
            random.seed(args.seed)
            torch.manual_seed(args.seed)
            torch.set_num_threads(1)
        if args.worker_init_fn is not None:
            stage = "worker_init_fn"
            args.worker_init_fn(args.worker_id)
        stage = "attaching"
        producer = _native.Producer(args.ring, config=args.config, wait=args.wait)
        layout = args.layout
        try:
            while not stop.is_set():
                stage = "claiming"
                try:
                    part = producer.claim(_POLL * 5)
                except _native.Timeout:
                    continue  # no free slot yet: look at the stop flag, wait again
                if part is None:
                    errors.put((args.worker_id, "done", -1, None, ""))
                    return
                claimed = time.monotonic()
                views = [_view(part.fields[name]) for name in layout.names]
                if args.collate_fn is None:
                    for j, index in enumerate(part.indices):
                        stage = "loading"
                        sample = args.dataset[index]
                        _write(layout, sample, views, j, index, None)
                else:
                    index = part.indices[0]
                    stage = "loading"
                    samples = [args.dataset[i] for i in part.indices]
                    stage = "collating"
                    _write(layout, args.collate_fn(samples), views, None, index, len(samples))
                del views
                stage = "committing"
                try:
                    part.commit()
                except _native.PartReclaimed as e:
                    if stop.is_set():
                        return  # the loader is closing: the ring ended under the commit
                    # The lease ran out before the commit: the daemon has taken the part back
                    # and has it made again. As the Rust loader: say so, go on claiming. (Any
                    # other error of the commit, a part too large for its slot, is an "error".)
                    first = part.indices[0] if len(part.indices) else -1
                    errors.put((
                        args.worker_id, "reclaimed", first, None,
                        f"part {part.seq} (batch {part.batch}, {len(part.indices)} samples from "
                        f"sample {first}) took {time.monotonic() - claimed:.1f} s from claim to "
                        f"commit: {e}",
                    ))
                index = -1
        finally:
            producer.close()
    except BaseException as e:  # noqa: BLE001 - everything reaches the training loop
        if isinstance(e, _native.PinringError) and stage == "claiming":
            # The ring ended or failed under the claim (the loader is closing, the daemon is
            # gone): the consumer sees the same; the report says why this worker ended.
            _put(errors, (args.worker_id, "ring", index, type(e), f"{type(e).__name__}: {e}"))
            return
        text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        where = {
            "loading": f" while loading sample {index}",
            "collating": f" in collate_fn for a part from sample {index}",
            "worker_init_fn": " in worker_init_fn",
            "attaching": " while joining the ring",
        }.get(stage, "")
        message = (
            f"Caught {type(e).__name__} in pinring DataLoader worker {args.worker_id}{where}.\n"
            f"Original {text}"
        )
        _put(errors, (args.worker_id, "error", index, type(e), message))


def _put(errors: Any, report: Tuple[int, str, int, Any, str]) -> None:
    """Sends a worker's report; without the exception's type where that does not pickle."""
    try:
        errors.put(report)
    except Exception:
        errors.put(report[:3] + (None,) + report[4:])


def _view(field: Any) -> Any:
    """A writable view of a part's field: NumPy, or torch for bf16 (NumPy has no bf16)."""
    if field.dtype == "bf16":
        return torch.from_dlpack(field)
    return np.from_dlpack(field)


def _write(layout: _Layout, value: Any, views: List[Any], j: Optional[int], index: int,
           n: Optional[int]) -> None:
    """Writes one sample (at row ``j``) or one collated part (``n`` rows) into the part."""
    leaves: List[Any] = []
    _flatten(value, "", leaves, [])
    if len(leaves) != len(layout.leaves):
        raise _native.UsageError(
            f"sample {index} has {len(leaves)} arrays or numbers, but dataset[0] has "
            f"{len(layout.leaves)}: every sample must have the same structure"
        )
    for value, leaf, view in zip(leaves, layout.leaves, views):
        layout.check(index, value, leaf, n)
        if isinstance(value, torch.Tensor):
            if value.device.type != "cpu":
                raise _native.UsageError(
                    f"{leaf.path or 'the sample'} of sample {index} is on {value.device}; a "
                    "worker's samples must be CPU tensors (the upload is pinring's job)"
                )
            if isinstance(view, torch.Tensor):
                src = value
            else:
                src = value.detach().numpy()
        else:
            src = torch.as_tensor(value) if isinstance(view, torch.Tensor) else value
        if j is None:
            view[...] = src
        else:
            view[j] = src


# -- the loader ------------------------------------------------------------------------------


class _Default:
    """An argument's default value, told apart from the same value passed: with ``ring=`` a
    default gives way to the ring's setting, a value passed must agree with it."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return repr(self.value)


# Defaults of arguments a ring's config may decide (typed Any: each stands for its value).
_ONE: Any = _Default(1)
_FALSE: Any = _Default(False)
_TRUE: Any = _Default(True)
_EPOCHS: Any = _Default(DEFAULT_EPOCHS)

# Where the ring's config holds what an argument sets: argument -> (section, key).
_RING_KEYS: Dict[str, Tuple[str, str]] = {
    "batch_size": ("plan", "batch_size"),
    "shuffle": ("plan", "shuffle"),
    "seed": ("plan", "seed"),
    "drop_last": ("plan", "drop_last"),
    "rank": ("plan", "rank"),
    "world_size": ("plan", "world_size"),
    "epochs": ("plan", "epochs"),
    "in_order": ("ring", "in_order"),
    "prefetch": ("daemon", "prefetch"),
    "prefetch_factor": ("daemon", "prefetch"),
    "lease_ms": ("daemon", "lease_ms"),
}


class _Worker:
    """One worker: a spawned process, or the thread of ``num_workers=0``."""

    def __init__(self, ctx: Any, args: _WorkerArgs, errors: Any, stop: Any) -> None:
        self.args = args
        if args.num_workers == 0:
            self.proc: Any = threading.Thread(
                target=_worker_main, args=(args, errors, stop), name="pinring-worker",
                daemon=True,
            )
        else:
            self.proc = ctx.Process(
                target=_worker_main, args=(args, errors, stop),
                name=f"pinring-worker-{args.worker_id}", daemon=True,
            )
        self.proc.start()

    def exitcode(self) -> Optional[int]:
        if isinstance(self.proc, threading.Thread):
            return None if self.proc.is_alive() else 0
        return self.proc.exitcode

    def stop(self, deadline: float) -> None:
        self.proc.join(max(0.0, deadline - time.monotonic()))
        if isinstance(self.proc, threading.Thread) or self.proc.exitcode is not None:
            return
        # Still inside the user's __getitem__ after the ring ended: not worth waiting for.
        self.proc.kill()
        self.proc.join(5.0)


class DataLoader:
    """``torch.utils.data.DataLoader``'s arguments and batches, fed through a pinring ring.

    Each ``for`` over the loader yields one epoch of batches whose tensors are on ``device``.

    Args (as torch's, with these differences):
        dataset: a map-style dataset (``__getitem__`` and ``__len__``); its samples must have
            the fields, dtypes and shapes of ``dataset[0]``.
        batch_size, shuffle, drop_last: as torch's.
        sampler: None, a ``SequentialSampler``, a ``RandomSampler`` (without replacement) or a
            ``DistributedSampler`` (its rank, replicas, shuffle, seed and drop_last are used).
            Other samplers and ``batch_sampler`` are refused: pinring's plan decides the order.
        num_workers: worker processes running the dataset (0: a thread of this process).
        collate_fn: run in the workers on the samples of a batch part; each array it returns
            must have the part's samples as its first dimension.
        pin_memory: accepted; pinring's slots are always registered (pinned) memory.
        timeout: seconds to wait for one batch (0: as long as the workers live).
        worker_init_fn: called with the worker id in each worker, after seeding.
        multiprocessing_context: None or ``"spawn"`` (workers always start with spawn).
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
            ``dataset.kind = "external"`` with the dataset's fields) instead of running one here.
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
            tolerated over the loader's life before it raises ``PeerDied``.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: Optional[int] = _ONE,
        shuffle: Optional[bool] = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        collate_fn: Optional[Callable[[List[Any]], Any]] = None,
        pin_memory: bool = False,
        drop_last: bool = _FALSE,
        timeout: float = 0,
        worker_init_fn: Optional[Callable[[int], None]] = None,
        multiprocessing_context: Any = None,
        generator: Optional[torch.Generator] = None,
        *,
        prefetch_factor: Optional[int] = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = _TRUE,
        seed: Optional[int] = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        prefetch: Optional[int] = None,
        device: Any = None,
        ring: Optional[str] = None,
        epochs: int = _EPOCHS,
        lease_ms: Optional[int] = None,
        max_worker_restarts: int = 3,
        wait_for_ring: float = 30.0,
    ) -> None:
        del pin_memory, persistent_workers, pin_memory_device  # always pinned, always persistent
        if isinstance(dataset, torch.utils.data.IterableDataset) or not (
            hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")
        ):
            raise _native.UsageError(
                "pinring.torch.DataLoader takes a map-style dataset (__getitem__ and __len__); "
                "pinring's plan picks the sample indices, so an IterableDataset cannot be fed"
            )
        if batch_sampler is not None:
            raise _native.UsageError(
                "batch_sampler is not supported: pinring's plan makes the batches; pass "
                "batch_size, shuffle, drop_last (and a DistributedSampler or rank/world_size)"
            )
        # What the caller passed (not left at its default): with ring=, the ring's config
        # decides, and an argument passed must agree with it (_check_ring).
        given = {
            name: value for name, value in (
                ("batch_size", batch_size), ("shuffle", shuffle), ("seed", seed),
                ("drop_last", drop_last), ("rank", rank), ("world_size", world_size),
                ("epochs", epochs), ("in_order", in_order), ("prefetch", prefetch),
                ("lease_ms", lease_ms), ("device", device),
            ) if value is not None and not isinstance(value, _Default)
        }
        batch_size, drop_last, in_order, epochs = (
            v.value if isinstance(v, _Default) else v
            for v in (batch_size, drop_last, in_order, epochs)
        )
        if batch_size is None or int(batch_size) < 1:
            raise _native.UsageError(f"batch_size must be a positive integer, not {batch_size!r}")
        if lease_ms is not None and int(lease_ms) < 10:
            raise _native.UsageError(
                f"lease_ms={lease_ms}: a worker's lease on a batch part must be at least 10 ms; "
                "pass more than the slowest part takes to load (default 30000)"
            )
        if num_workers < 0:
            raise _native.UsageError(f"num_workers must be >= 0, not {num_workers}")
        if timeout < 0:
            raise _native.UsageError(f"timeout must be >= 0 seconds, not {timeout}")
        start = multiprocessing_context
        if start is not None and not isinstance(start, str):
            start = start.get_start_method()
        if start not in (None, "spawn"):
            raise _native.UsageError(
                f"multiprocessing_context {start!r}: pinring's workers start with 'spawn' (a "
                "forked worker cannot use CUDA); pass None or 'spawn'"
            )
        if sampler is not None and shuffle:
            raise _native.UsageError("sampler option is mutually exclusive with shuffle")
        sharded: Dict[str, Any] = {}
        from_sampler = set()
        if sampler is not None:
            sharded = _from_sampler(sampler, drop_last)
            for key, value in sharded.items():
                if key not in given:
                    given[key] = value
                    from_sampler.add(key)
        if prefetch is None and prefetch_factor is not None:
            given["prefetch_factor"] = prefetch_factor
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.shuffle = bool(sharded.get("shuffle", shuffle or False))
        self.drop_last = bool(drop_last)
        self.num_workers = int(num_workers)
        self.collate_fn = collate_fn
        self.timeout = float(timeout)
        self.worker_init_fn = worker_init_fn
        self.in_order = bool(in_order)
        self.rank = int(rank if rank is not None else sharded.get("rank", 0))
        self.world_size = int(world_size if world_size is not None else sharded.get("world_size", 1))
        if seed is None:
            seed = sharded.get("seed")
        if seed is None and ring is not None:
            # The ring's plan.seed is taken at the start; the user's RNG is left as it is.
            seed = 0
        elif seed is None:
            # As torch's RandomSampler: one draw from the given generator or torch's RNG.
            seed = int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())
        self.seed = int(seed) & (2**64 - 1)
        if prefetch is None and prefetch_factor is not None:
            prefetch = min(64, max(2, int(prefetch_factor) * max(1, self.num_workers)))
        self.prefetch = prefetch
        self.epochs = int(epochs)
        self.lease_ms = None if lease_ms is None else int(lease_ms)
        self._given: Dict[str, Any] = given
        self._from_sampler = (None if sampler is None else type(sampler).__name__, from_sampler)
        self.max_worker_restarts = int(max_worker_restarts)
        self.wait_for_ring = float(wait_for_ring)
        self._attached_ring = ring
        self._device = _parse_device(device)
        self._layout: Optional[_Layout] = None
        self._bpe: Optional[int] = None
        self._ppb: Optional[int] = None
        self._stood = 0  # the batch number a stopped loader stood at
        self._epoch_wanted: Optional[int] = None
        self._resume: Optional[Dict[str, int]] = None
        self._started = False
        self._daemon: Optional[_native.EmbeddedDaemon] = None
        self._consumer: Optional[_native.Consumer] = None
        self._workers: List[_Worker] = []
        self._errors: Any = None
        self._stop_flag: Any = None
        self._tmp: Optional[str] = None
        self._restarts = 0
        self._done: set = set()  # ids of workers that saw the plan end
        # Why a worker left: the ring's error under its claim (its type, its report).
        self._left: Dict[int, Tuple[Any, str]] = {}
        self._ring_settings: Dict[Tuple[str, str], Any] = {}
        self._ring_name: Optional[str] = None
        self._config_path: Optional[str] = None
        self.summary: Optional[Dict[str, Any]] = None

    # -- the plan ------------------------------------------------------------------------

    def _infer(self) -> _Layout:
        if self._layout is None:
            if len(self.dataset) == 0:
                raise _native.UsageError("the dataset is empty: nothing to load")
            sample = self.dataset[0]
            if self.collate_fn is not None:
                self._layout = _Layout(self.collate_fn([sample]), collated=True)
            else:
                self._layout = _Layout(sample, collated=False)
        return self._layout

    def _config(self, ring: str) -> str:
        layout = self._infer()
        daemon = "" if self.prefetch is None else f"prefetch = {int(self.prefetch)}\n"
        if self.lease_ms is not None:
            daemon += f"lease_ms = {self.lease_ms}\n"
        return (
            "# Made by pinring.torch.DataLoader.\n"
            f'[ring]\nname = "{ring}"\nslot_bytes = "auto"\n'
            f"in_order = {str(self.in_order).lower()}\n\n"
            f'[dataset]\nkind = "external"\nsamples = {len(self.dataset)}\n'
            f"{layout.toml_fields()}\n\n"
            f"[plan]\nbatch_size = {self.batch_size}\nshuffle = {str(self.shuffle).lower()}\n"
            f"seed = {self.seed}\nepochs = {self.epochs}\n"
            f"drop_last = {str(self.drop_last).lower()}\nrank = {self.rank}\n"
            f"world_size = {self.world_size}\n\n"
            f"[daemon]\n{daemon}"
        )

    def _shape(self) -> Tuple[int, int]:
        """(batches per epoch, seqs per batch) of the plan, before anything starts."""
        if self._bpe is None or self._ppb is None:
            if self._attached_ring is None:
                info = _native.check_config(self._config("plan"))
            else:
                c = _native.Consumer(self._attached_ring, wait_for_ring=self.wait_for_ring)
                try:
                    self._check_ring(c.config, c.device)
                    info = _native.check_config(c.config, f"ring {self._attached_ring!r}")
                finally:
                    c.close()
            self._bpe = int(info["batches_per_epoch"])
            self._ppb = int(info["parts_per_batch"])
        return self._bpe, self._ppb

    def __len__(self) -> int:
        """Batches per epoch (this rank's)."""
        return self._shape()[0]

    # -- starting and stopping -----------------------------------------------------------

    def _start(self, start_seq: int) -> None:
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
        self._tmp = tempfile.mkdtemp(prefix="pinring-torch-")
        if self._attached_ring is None:
            name = f"torch-{os.getpid()}-{id(self) & 0xFFFFFF:x}"
            text = self._config(name)
            path = os.path.join(self._tmp, "pinring.toml")
            with open(path, "w") as f:
                f.write(text)
            backend = "host" if self._device.type == "cpu" else "cuda"
            self._daemon = _native.EmbeddedDaemon(
                config=path, backend=backend, device=self._device.index or 0,
                start_seq=start_seq,
            )
            self._ring_name = self._daemon.ring
            self._consumer = _native.Consumer(self._ring_name, wait_for_ring=self.wait_for_ring)
            self._ring_settings = _settings(self._consumer.config)
        else:
            self._ring_name = self._attached_ring
            self._consumer = _native.Consumer(
                self._attached_ring, start_seq=start_seq or None, wait_for_ring=self.wait_for_ring,
            )
            text = self._consumer.config
            info = _native.check_config(text, f"ring {self._attached_ring!r}")
            _check_ring_fields(self._attached_ring, info["fields"], layout)
            self._ring_settings = self._check_ring(text, self._consumer.device)
            path = os.path.join(self._tmp, "pinring.toml")
            with open(path, "w") as f:
                f.write(text)
        self._config_path = path
        self._done = set()
        self._left = {}
        if self.num_workers == 0:
            self._errors = _queue.SimpleQueue()
            self._stop_flag = threading.Event()
            ctx = None
        else:
            ctx = multiprocessing.get_context("spawn")
            self._errors = ctx.SimpleQueue()
            self._stop_flag = ctx.Event()
        self._ctx = ctx
        self._workers = [self._spawn(i) for i in range(max(1, self.num_workers))]
        self._last_check = time.monotonic()

    def _check_ring(self, text: str, device: str) -> Dict[Tuple[str, str], Any]:
        """With ``ring=``: raises ``UsageError`` naming each argument passed that the ring's
        config (``text``, delivering to ``device``) contradicts, and a dataset of another length
        than the ring's; then takes the ring's settings as the loader's own, and returns them
        (``_settings``)."""
        settings = _settings(text)
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
            section, key = _RING_KEYS[arg]
            have = settings.get((section, key))
            mine = self.prefetch if arg == "prefetch_factor" else value
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
                setattr(self, arg, int(settings[("plan", arg)]))
        for section, arg in (("plan", "shuffle"), ("plan", "drop_last"), ("ring", "in_order")):
            if (section, arg) in settings:
                setattr(self, arg, bool(settings[(section, arg)]))
        self.prefetch = settings.get(("daemon", "prefetch"))
        self.lease_ms = settings.get(("daemon", "lease_ms"))
        self._device = torch.device(device)
        return settings

    def _spawn(self, worker_id: int) -> _Worker:
        args = _WorkerArgs(
            ring=self._ring_name or "", config=self._config_path or "", dataset=self.dataset,
            layout=self._infer(), collate_fn=self.collate_fn, worker_init_fn=self.worker_init_fn,
            worker_id=worker_id, num_workers=self.num_workers,
            seed=(self.seed + worker_id) & (2**63 - 1), wait=self.wait_for_ring,
        )
        self._done.discard(worker_id)
        self._left.pop(worker_id, None)
        return _Worker(self._ctx, args, self._errors, self._stop_flag)

    def _stop(self) -> None:
        """Detaches, stops the daemon and the workers; keeps where the loader stands."""
        if not self._started:
            return
        self._started = False
        if self._stop_flag is not None:
            self._stop_flag.set()
        if self._consumer is not None:
            try:
                self._stood = self._consumer.state()[0] // (self._ppb or 1)
            except _native.PinringError:
                pass
            self._consumer.close()
            self._consumer = None
        if self._daemon is not None:
            text = self._daemon.stop()
            self._daemon = None
            if text:
                import json

                self.summary = json.loads(text)
        deadline = time.monotonic() + 10.0
        for w in self._workers:
            w.stop(deadline)
        self._workers = []
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def close(self) -> None:
        """Stops the workers and the embedded daemon. Tensors of batches still alive stay
        valid. A later ``for`` starts them again where the loader stood."""
        self._stop()

    def __del__(self) -> None:
        try:
            self._stop()
        except Exception:
            pass

    def __enter__(self) -> "DataLoader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the workers ---------------------------------------------------------------------

    def _check_workers(self, restart: bool = True, idle: bool = False) -> None:
        """Raises a worker's exception; logs parts taken back after the lease; restarts workers
        that died, and workers that ended with no report while the ring still runs
        (``restart=False``: the ring has just ended under the loop, so a worker's leaving is no
        news). A worker that ended because the ring failed under its claim is not restarted:
        the loop's own wait fails the same way; ``idle`` (the loop has just waited for a batch
        in vain) with every worker ended and one of them so, that failure is raised.

        Exit codes are read before the reports: a worker reports, then ends, so one seen ended
        has its report in the queue already. The other way round, a worker that reports and
        ends between the two looks would seem to have ended with no report."""
        self._last_check = time.monotonic()
        codes = [w.exitcode() for w in self._workers]
        self._read_reports()
        if not restart:
            return
        for i, (w, code) in enumerate(zip(self._workers, codes)):
            worker_id = w.args.worker_id
            ended = worker_id in self._done or worker_id in self._left
            if code is None or (code == 0 and ended):
                continue
            if code == 0:
                how = (
                    "exited with status 0 while the ring still needed it, with no error reported "
                    "(os._exit() in the dataset's code or in worker_init_fn, or in a library "
                    "they call, does this)"
                )
                fix = (
                    "a worker's process must live until the loader stops it: remove the call "
                    "that ends it"
                )
            else:
                how = _how(code)
                fix = (
                    "a dataset that crashes the interpreter at some index does this: run it "
                    "with num_workers=0 to see where"
                )
            if self._restarts >= self.max_worker_restarts:
                self._stop()
                raise _native.PeerDied(
                    f"pinring DataLoader worker {worker_id} {how}, after {self._restarts} "
                    f"restarts of workers (max_worker_restarts={self.max_worker_restarts}); "
                    f"{fix}"
                )
            self._restarts += 1
            log.warning(
                "pinring DataLoader worker %d %s; restarted it (%d of %d restarts); the batch "
                "part it held is made again", worker_id, how, self._restarts,
                self.max_worker_restarts,
            )
            self._workers[i] = self._spawn(worker_id)
        reported = self._done.union(self._left)
        if idle and self._left and all(
            code is not None and w.args.worker_id in reported
            for w, code in zip(self._workers, codes)
        ):
            worker_id, (exc_type, why) = next(iter(self._left.items()))
            self._stop()
            _reraise(exc_type, (
                f"pinring DataLoader worker {worker_id} ended because ring {self._ring_name!r} "
                f"failed under its claim ({why}), and no worker is left to make batches; that "
                "failure (the ring's daemon gone or stopped) must be fixed first"
            ))

    def _read_reports(self) -> None:
        """Takes every report the workers sent; raises a worker's exception."""
        while not self._errors.empty():
            worker_id, kind, index, exc_type, message = self._errors.get()
            if kind == "done":
                self._done.add(worker_id)
                continue
            if kind == "ring":
                self._left[worker_id] = (exc_type, message)
                continue
            if kind == "reclaimed":
                log.warning(
                    "pinring DataLoader worker %d: %s. Loading it took longer than the ring's "
                    "lease (%s), so its samples are loaded again; each time a part outlives the "
                    "lease its work is lost: pass lease_ms= longer than the slowest part takes "
                    "(or raise daemon.lease_ms in the ring's config with ring=)",
                    worker_id, message, self._lease_text(),
                )
                continue
            self._stop()
            _reraise(exc_type, message)

    def _lease_text(self) -> str:
        lease = self._ring_settings.get(("daemon", "lease_ms"))
        return "daemon.lease_ms" if lease is None else f"daemon.lease_ms = {lease} ms"

    @property
    def worker_restarts(self) -> int:
        """Workers restarted after they died (or ended with status 0 and no report while the
        ring ran), over the loader's life."""
        return self._restarts

    def _next(self) -> Optional[_native.Batch]:
        assert self._consumer is not None
        waited = 0.0
        if time.monotonic() - self._last_check >= _CHECK_EVERY:
            self._check_workers()
        while True:
            try:
                return self._consumer.next_batch(_POLL)
            except _native.Timeout:
                waited += _POLL
                self._check_workers(idle=True)
                if self.timeout and waited >= self.timeout:
                    raise _native.Timeout(
                        f"pinring DataLoader: no batch within timeout={self.timeout} s (ring "
                        f"{self._ring_name!r}, "
                        f"{sum(w.exitcode() is None for w in self._workers)} workers alive)"
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
        bpe, ppb = self._shape()
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
        end = (self._consumer.state()[0] // ppb // bpe + 1) * bpe
        ended = False
        while self._consumer.state()[0] // ppb < end:
            b = self._next()
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

    def _convert(self, box: List[_native.Batch]) -> Any:
        b = box.pop()
        layout = self._infer()
        fields = b.fields
        tensors = [torch.from_dlpack(fields[name]) for name in layout.names]
        b.release()
        del b, fields
        return _rebuild(layout.tree, tensors)

    # -- checkpoints ---------------------------------------------------------------------

    def state_dict(self) -> Dict[str, int]:
        """Where the next batch comes from: ``{"seq": ..., "fingerprint": ...}``."""
        if self._consumer is not None:
            seq, fp = self._consumer.state()
            return {"seq": seq, "fingerprint": fp}
        if self._resume is not None:
            return dict(self._resume)
        raise _native.UsageError(
            "the loader is not running: state_dict() is known from the first for until close()"
        )

    def load_state_dict(self, state: Dict[str, int]) -> None:
        """Resumes at a saved state: the next batch is the one at ``state["seq"]``; a state of
        another plan is refused when the loader starts."""
        resume = checked_state(state)
        self._stop()
        self._resume = resume


def _from_sampler(sampler: Any, drop_last: bool) -> Dict[str, Any]:
    data = torch.utils.data
    if isinstance(sampler, data.DistributedSampler):
        if bool(sampler.drop_last) != bool(drop_last):
            raise _native.UsageError(
                f"DistributedSampler(drop_last={sampler.drop_last}) with DataLoader(drop_last="
                f"{drop_last}): pinring's plan has one drop_last for the rank's shard and the "
                "last batch; pass the same value to both"
            )
        return {"rank": sampler.rank, "world_size": sampler.num_replicas,
                "shuffle": sampler.shuffle, "seed": sampler.seed}
    if isinstance(sampler, data.SequentialSampler):
        return {"shuffle": False}
    if isinstance(sampler, data.RandomSampler) and not sampler.replacement and (
        sampler._num_samples is None
    ):
        return {"shuffle": True}
    raise _native.UsageError(
        f"sampler {type(sampler).__name__} is not supported: pinring's plan decides the order; "
        "pass shuffle=True/False (and seed), or a DistributedSampler, or rank/world_size"
    )


def _settings(text: str) -> Dict[Tuple[str, str], Any]:
    """The settings of a resolved config (a ring's): (section, key) -> value, for the numbers,
    booleans and strings of its top-level tables."""
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        return _scalar_lines(text)
    out: Dict[Tuple[str, str], Any] = {}
    for section, table in tomllib.loads(text).items():
        if isinstance(table, dict):
            for key, value in table.items():
                if isinstance(value, (bool, int, float, str)):
                    out[(section, key)] = value
    return out


def _scalar_lines(text: str) -> Dict[Tuple[str, str], Any]:
    """``_settings`` without tomllib: a resolved config, as pinring's daemon writes it, has one
    ``key = value`` a line, each number, boolean and plain string on the line of its key."""
    out: Dict[Tuple[str, str], Any] = {}
    section = ""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line.strip("[]").strip()
            continue
        key, eq, raw = (part.strip() for part in line.partition("="))
        if not eq or not key.replace("_", "").isalnum() or "." in section:
            continue
        value: Any
        if raw in ("true", "false"):
            value = raw == "true"
        elif len(raw) >= 2 and raw[0] == raw[-1] == '"' and "\\" not in raw:
            value = raw[1:-1]
        else:
            try:
                value = int(raw.replace("_", ""))
            except ValueError:
                try:
                    value = float(raw)
                except ValueError:
                    continue  # an array or a table: not a setting _settings returns
        out[(section, key)] = value
    return out


def _parse_device(device: Any) -> torch.device:
    if device is None:
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    if d.type not in ("cuda", "cpu"):
        raise _native.UsageError(f"device {device!r}: pinring delivers to 'cuda:N' or 'cpu'")
    return d


def _check_ring_fields(ring: str, fields: List[Tuple[str, str, List[int]]], layout: _Layout) -> None:
    want = [(name, leaf.dtype, list(leaf.shape)) for name, leaf in layout.declared]
    got = [(n, d, list(s)) for n, d, s in fields]
    if got != want:
        raise _native.RefusedError(
            f"ring {ring!r} carries fields {got}, but this dataset's samples need {want}: start "
            "its daemon with a config of dataset.kind = \"external\" and these fields"
        )


def _how(code: int) -> str:
    if code < 0:
        import signal

        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with status {code}"


def _reraise(exc_type: Any, message: str) -> None:
    if exc_type is KeyError:
        # KeyError's str() quotes its argument; keep the traceback readable, as torch does.
        class _KeyErrorMessage(str):
            def __repr__(self) -> str:
                return self

        message = _KeyErrorMessage(message)
    if exc_type is not None:
        try:
            exc = exc_type(message)
        except Exception:
            exc = None
        if isinstance(exc, BaseException):
            raise exc
    raise RuntimeError(message)
