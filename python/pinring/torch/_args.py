"""``pinring.torch.DataLoader``'s arguments: torch's refusals in torch's order and words (scripts
and torch's own tests match them), pinring's own ranges, which sampler pinring's plan stands
for, the plan's and the workers' seeds, and the device."""

from __future__ import annotations

import os
import warnings
from typing import Any, Dict, List, Optional, Tuple

import torch

from pinring import _device, _dist, _native
from pinring.loader import DEFAULT_EPOCHS


class Default:
    """An argument's default value, told apart from the same value passed: with ``ring=`` a
    default gives way to the ring's setting, a value passed must agree with it."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return repr(self.value)


# Defaults of arguments a ring's config may decide (typed Any: each stands for its value).
ONE: Any = Default(1)
FALSE: Any = Default(False)
TRUE: Any = Default(True)
EPOCHS: Any = Default(DEFAULT_EPOCHS)

# Where the ring's config holds what an argument sets: argument -> (section, key).
RING_KEYS: Dict[str, Tuple[str, str]] = {
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


def refuse_as_torch(dataset: Any, stream: bool, batch_size: Any, shuffle: Any, sampler: Any,
                    batch_sampler: Any, drop_last: Any, ring: Optional[str], rank: Optional[int],
                    world_size: Optional[int]) -> None:
    """Raises torch's error for arguments torch's DataLoader refuses together (torch's order and
    words), and pinring's for those an iterable dataset has no plan for."""
    if stream:
        for arg, value, unset in (("shuffle", shuffle, shuffle in (None, False)),
                                  ("sampler", sampler, sampler is None),
                                  ("batch_sampler", batch_sampler, batch_sampler is None)):
            if not unset:
                raise _native.UsageError(
                    f"DataLoader with IterableDataset: expected unspecified {arg} option, "
                    f"but got {arg}={value!r}"
                )
        for arg, value in (("ring", ring), ("rank", rank), ("world_size", world_size)):
            if value is not None:
                raise _native.UsageError(
                    f"pinring.torch.DataLoader({arg}={value!r}) with an IterableDataset: the "
                    "dataset's own __iter__ picks its samples (split by torch.distributed's "
                    "rank there, and by get_worker_info() per worker), so there is no plan "
                    f"of sample indices to {'attach to' if arg == 'ring' else 'shard'}; "
                    f"leave {arg} out"
                )
    elif not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        raise _native.UsageError(
            f"pinring.torch.DataLoader takes a map-style dataset (__getitem__ and __len__) "
            f"or a torch.utils.data.IterableDataset; a {type(dataset).__name__} is neither: "
            "add __getitem__ and __len__, or derive it from IterableDataset"
        )
    if sampler is not None and shuffle:
        raise _native.UsageError("sampler option is mutually exclusive with shuffle")
    if batch_sampler is not None and (
        not isinstance(batch_size, Default) and batch_size != 1 or shuffle or
        sampler is not None or not isinstance(drop_last, Default) and drop_last
    ):
        raise _native.UsageError(
            "batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, "
            "and drop_last"
        )
    if batch_size is None and not isinstance(drop_last, Default) and drop_last:
        raise _native.UsageError(
            "batch_size=None option disables auto-batching and is mutually exclusive with "
            "drop_last"
        )


def refuse_out_of_range(batch_size: Any, lease_ms: Optional[int], prefetch: Optional[int],
                        epochs: int, str_bytes: Optional[int], ragged_bytes: Optional[int],
                        ragged: Any, ragged_as: str) -> None:
    """Raises ``UsageError`` for a number outside what it sets can be (torch's words for
    ``batch_size``), naming the argument, its range and the fix."""
    if batch_size is not None and (
        isinstance(batch_size, bool) or not hasattr(batch_size, "__index__")
        or batch_size.__index__() < 1
    ):
        raise _native.UsageError(
            f"batch_size should be a positive integer value, but got batch_size={batch_size!r}"
        )
    if lease_ms is not None and int(lease_ms) < 10:
        raise _native.UsageError(
            f"lease_ms={lease_ms}: a worker's lease on a batch part must be at least 10 ms; "
            "pass more than the slowest part takes to load (default 30000)"
        )
    lo, hi = _native.PREFETCH_RANGE
    if prefetch is not None and not lo <= int(prefetch) <= hi:
        raise _native.UsageError(
            f"pinring.torch.DataLoader(prefetch={prefetch}): the device batch buffers must "
            f"be {lo} to {hi} (one is the batch the loop holds, the rest are uploaded ahead): "
            "pass a number in that range, or leave prefetch out"
        )
    if int(epochs) < 1:
        raise _native.UsageError(
            f"pinring.torch.DataLoader(epochs={epochs}): the plan covers at least one epoch: "
            "pass epochs >= 1, or leave it out for a plan without end"
        )
    if str_bytes is not None and not 8 <= int(str_bytes) <= 1 << 24:
        raise _native.UsageError(
            f"pinring.torch.DataLoader(str_bytes={str_bytes}): a str field's arena must have "
            "8 to 16777216 bytes a sample: pass a number in that range, or leave str_bytes "
            "out for four times dataset[0]'s string (at least 256)"
        )
    if ragged_bytes is not None and not 8 <= int(ragged_bytes) <= 1 << 30:
        raise _native.UsageError(
            f"pinring.torch.DataLoader(ragged_bytes={ragged_bytes}): a ragged field's arena "
            "holds 8 to 1073741824 bytes a sample: pass a number in that range, or leave "
            "ragged_bytes out for twice the largest of the samples pinring looks at first"
        )
    if isinstance(ragged, str):
        raise _native.UsageError(
            f"pinring.torch.DataLoader(ragged={ragged!r}): pass a list of field names, "
            f"ragged=[{ragged!r}]"
        )
    if ragged_as not in ("list", "jagged"):
        raise _native.UsageError(
            f"pinring.torch.DataLoader(ragged_as={ragged_as!r}): a ragged field comes as "
            "\"list\" (a list of the batch's tensors) or \"jagged\" (one nested tensor of "
            "torch's jagged layout): pass one of those"
        )


def refuse_workers(num_workers: int, timeout: float, multiprocessing_context: Any) -> None:
    """torch's refusals of the workers' arguments, in torch's words."""
    if num_workers < 0:
        raise _native.UsageError(
            "num_workers option should be non-negative; use num_workers=0 to disable "
            f"multiprocessing (num_workers={num_workers})"
        )
    if timeout < 0:
        raise _native.UsageError(f"timeout option should be non-negative (timeout={timeout})")
    if num_workers == 0 and multiprocessing_context is not None:
        raise _native.UsageError(
            "multiprocessing_context can only be used with multi-process loading "
            "(num_workers > 0), but got num_workers=0"
        )


def seeds(seed: Optional[int], ring: Optional[str], stream: bool, shuffle: bool,
          generator: Optional[torch.Generator]) -> Tuple[int, int]:
    """The plan's seed and the workers' base seed (worker i seeds random and torch with base +
    i), from ``seed`` (passed, or a sampler's; None: left out)."""
    worker_seed: Optional[int] = None
    if seed is None and ring is not None:
        # The ring's plan.seed is taken at the start; the user's RNG is left as it is.
        seed = 0
    elif seed is None and _dist.job() is not None:
        # Every rank must shuffle alike for the shards to be disjoint: DistributedSampler's
        # default seed, not a draw from each rank's own RNG.
        seed = 0
    elif seed is None and stream:
        # No plan of indices; the workers' base seed is drawn at each for, as torch's
        # DataLoader draws it for each iterator it makes (_iter_stream).
        seed = 0
        worker_seed = 0
    elif seed is None and not shuffle:
        # No shuffle, no seed in the plan: a loader made the same way has the same plan
        # (and fingerprint), so it loads the state of another without the RNG reseeded, as
        # torchdata's StatefulDataLoader does. The workers' base seed is still drawn, as
        # torch's DataLoader draws it, from the generator or torch's RNG.
        seed = 0
        worker_seed = _draw(generator)
    elif seed is None:
        # As torch's RandomSampler: one draw from the given generator or torch's RNG.
        seed = _draw(generator)
    plan = int(seed) & (2**64 - 1)
    return plan, plan if worker_seed is None else worker_seed


def _draw(generator: Optional[torch.Generator]) -> int:
    """One draw of a 64-bit seed from ``generator`` or torch's RNG, as torch's samplers draw."""
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def warn_on_workers_beyond_cpus(num_workers: int) -> None:
    """As torch's DataLoader: a warning when more workers are asked for than this process may
    run on (its CPU affinity), since they would only take turns on the same cores."""
    if num_workers <= 0:
        return
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 0
    if cpus and num_workers > cpus:
        warnings.warn(
            f"This DataLoader will create {num_workers} worker processes in total. Our "
            f"suggested max number of worker in current system is {cpus}, which is smaller than "
            f"what this DataLoader is going to create. Please be aware that excessive worker "
            f"creation might get DataLoader running slow or even freeze, lower the worker "
            f"number to avoid potential slowness/freeze if necessary.",
            UserWarning,
            stacklevel=3,
        )


def unwrapped(value: Any) -> Any:
    """An argument's value, a default's as it is."""
    return value.value if isinstance(value, Default) else value


def plan_of_sampler(sampler: Any, drop_last: bool, samples: int) -> Optional[Dict[str, Any]]:
    """The plan's settings that stand for ``sampler`` (over a dataset of ``samples``), where
    pinring's own plan draws the same order the same way in every process (a sequential, a
    shuffled or a DistributedSampler's sharded order, over the whole dataset); None for any
    other sampler, whose order the loader draws from it (_orders)."""
    data = torch.utils.data
    try:
        whole = len(getattr(sampler, "data_source", getattr(sampler, "dataset", ()))) == samples
    except TypeError:
        whole = False
    if not whole:
        return None
    if isinstance(sampler, data.DistributedSampler):
        if bool(sampler.drop_last) != bool(drop_last):
            # A shard padded (or cut) otherwise than the batches: drawn from the sampler.
            return None
        return {"rank": sampler.rank, "world_size": sampler.num_replicas,
                "shuffle": sampler.shuffle, "seed": sampler.seed}
    if type(sampler) is data.SequentialSampler:
        return {"shuffle": False}
    if type(sampler) is data.RandomSampler and not sampler.replacement and (
        sampler._num_samples is None
    ):
        return {"shuffle": True}
    return None


def parse_device(device: Any) -> torch.device:
    """``device=`` as a ``torch.device`` (pinring's parser, ``pinring._device``, shared with
    ``pinring.Loader``); None: the current CUDA device where torch sees one, else the CPU. A
    CUDA device where torch sees none, or beyond those it sees, is a ``BackendError`` with the
    fix, not torch's "Found no NVIDIA driver" from deep inside the first batch."""
    dev = _device.parse(device, "pinring.torch.DataLoader")
    if dev is None:
        if torch.cuda.is_available():
            return torch.device("cuda", _dist.device_index())
        return torch.device("cpu")
    if dev.kind == "cpu":
        return torch.device("cpu")
    said = f"pinring.torch.DataLoader(device={device!r})"
    if not torch.cuda.is_available():
        raise _native.BackendError(
            f"{said}: no CUDA device is usable in this process (torch.cuda.is_available() is "
            "False: no NVIDIA driver, no GPU, or CUDA_VISIBLE_DEVICES hides them): pass "
            'device="cpu" to run on pinring\'s host backend (batches as CPU tensors), or check '
            "the driver with nvidia-smi"
        )
    index = _dist.device_index() if dev.number is None else dev.number
    count = torch.cuda.device_count()
    if index >= count:
        raise _native.BackendError(
            f"{said}: CUDA device {index} does not exist: torch sees {count} (numbered from 0, "
            f'after CUDA_VISIBLE_DEVICES): pass a device below {count}, or device="cpu"'
        )
    return torch.device("cuda", index)
