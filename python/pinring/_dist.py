"""Where this process stands in a distributed job: its rank, the world size and its local rank,
from torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``) or
from an initialised ``torch.distributed`` process group.

``pinring.Loader`` and ``pinring.torch.DataLoader`` take their shard (``plan.rank``,
``plan.world_size``) and their device (``cuda:LOCAL_RANK``) from it when they are not given;
an argument given that contradicts it is a ``UsageError`` naming both.
"""

from __future__ import annotations

import os
import sys
from typing import NamedTuple, Optional, Tuple

from pinring import _native


class Job(NamedTuple):
    """This process's place in the job."""

    rank: int
    world_size: int
    local_rank: Optional[int]
    """Its index among the job's processes on this host (``LOCAL_RANK``), if known."""
    source: str
    """Where it was read: ``"torchrun's environment"`` or ``"torch.distributed"``."""


def _env_int(name: str) -> Optional[int]:
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise _native.UsageError(
            f"${name}={text!r} is not an integer: torchrun sets it to one; unset it or fix it"
        ) from None


def job() -> Optional[Job]:
    """The job this process runs in, or None outside one (a world of one is no job)."""
    rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    local = _env_int("LOCAL_RANK")
    if rank is not None and world is not None:
        found = Job(rank, world, local, "torchrun's environment")
    else:
        torch = sys.modules.get("torch")  # a process group needs torch imported already
        dist = getattr(torch, "distributed", None) if torch is not None else None
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        found = Job(int(dist.get_rank()), int(dist.get_world_size()), local, "torch.distributed")
    if not 0 <= found.rank < found.world_size:
        raise _native.UsageError(
            f"{found.source} says rank {found.rank} of a world of {found.world_size}: a rank "
            "counts from 0 to world_size - 1"
        )
    return found if found.world_size > 1 else None


def shard(rank: Optional[int], world_size: Optional[int], what: str) -> Tuple[Optional[int], Optional[int]]:
    """``(rank, world_size)`` for ``what`` (the caller, for messages): the arguments given, or
    the job's where they are left out (None, None outside a job). An argument that contradicts
    the job is a ``UsageError`` naming both."""
    j = job()
    if j is None:
        return rank, world_size
    names = {"rank": "RANK", "world_size": "WORLD_SIZE"}
    for arg, given, found in (("rank", rank, j.rank), ("world_size", world_size, j.world_size)):
        if given is not None and int(given) != found:
            where = f"${names[arg]}={found}" if j.source.startswith("torchrun") else \
                f"torch.distributed's {arg} {found}"
            raise _native.UsageError(
                f"{what}: {arg}={given}, but this process runs in a job where {where} "
                f"({j.source}): leave {arg} out to take the job's, or pass {found}"
            )
    return j.rank, j.world_size


def local_rank() -> Optional[int]:
    """``LOCAL_RANK`` of the job this process runs in, if any."""
    j = job()
    return None if j is None else j.local_rank


def device_index() -> int:
    """The CUDA device this process feeds when none is named: ``LOCAL_RANK`` in a job whose
    processes each see every GPU of the host, else torch's current device (a job that gives
    each process its own GPU through ``CUDA_VISIBLE_DEVICES`` sees one, device 0)."""
    import torch

    local = local_rank()
    if local is not None and local < torch.cuda.device_count():
        return local
    return int(torch.cuda.current_device())


def default_ordinal() -> int:
    """The CUDA ordinal an embedded daemon uploads to when no device is named: as
    ``device_index`` when torch is imported, else ``LOCAL_RANK`` (0 outside a job)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return device_index()
    local = local_rank()
    return 0 if local is None else local


def check_ring_shard(ring: str, settings: "dict[tuple[str, str], object]") -> None:
    """Refuses a ring (its config's scalar settings) that serves another shard than this
    process's in the job, naming both."""
    j = job()
    if j is None:
        return
    rank, world = settings.get(("plan", "rank"), 0), settings.get(("plan", "world_size"), 1)
    if (rank, world) != (j.rank, j.world_size):
        raise _native.UsageError(
            f"ring {ring!r} serves rank {rank} of {world}, but this process is rank {j.rank} of "
            f"{j.world_size} ({j.source}): attach each rank to a ring of its own shard (its "
            "daemon's plan.rank and plan.world_size, or $PINRING_RANK and $PINRING_WORLD_SIZE)"
        )
