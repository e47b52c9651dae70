"""The ``device=`` argument of ``pinring.Loader`` and ``pinring.torch.DataLoader``: one parser
for the forms both take, so that each accepts what the other does and refuses the rest with
the same words.

The forms: an int (a CUDA device number), ``"cuda"`` (the current CUDA device), ``"cuda:N"``,
``"cpu"`` or ``"host"`` (pinring's host backend: batches in host memory), and a
``torch.device`` of type ``cuda`` or ``cpu``. A ``torch.device`` is recognised only where torch
is imported already (an object cannot be one otherwise), so parsing never imports torch.
"""

from __future__ import annotations

import operator
import sys
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, Union

from pinring import _native

if TYPE_CHECKING:
    import torch

    DeviceLike = Union[int, str, torch.device]
else:
    DeviceLike = Union[int, str, Any]

FORMS = ('an int (a CUDA device number), "cuda", "cuda:N", "cpu" (or "host": pinring\'s host '
         'backend) or a torch.device of type cuda or cpu')


class Device(NamedTuple):
    """Where batches are to go."""

    kind: str
    """``"cuda"`` or ``"cpu"``."""
    number: Optional[int]
    """The CUDA device number; None: the current device (``"cuda"``), and for ``"cpu"``."""


def parse(device: Any, what: str) -> Optional[Device]:
    """``device`` as a ``Device`` (None for None: the caller's default). ``what`` names the
    caller in the error (``pinring.Loader``): ``UsageError`` naming the argument and the
    forms for anything else."""
    if device is None:
        return None
    found = _parse(device)
    if found is None:
        raise _native.UsageError(
            f"{what}(device={device!r}): not a device pinring delivers to: pass {FORMS}"
        )
    return found


def _parse(device: Any) -> Optional[Device]:
    if isinstance(device, str):
        if device in ("cpu", "host"):
            return Device("cpu", None)
        if device == "cuda":
            return Device("cuda", None)
        digits = device[len("cuda:"):]
        if device.startswith("cuda:") and digits.isascii() and digits.isdigit():
            return Device("cuda", int(digits))
        return None
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(device, torch.device):
        if device.type == "cpu":
            return Device("cpu", None)
        if device.type == "cuda":
            return Device("cuda", device.index)
        return None
    if isinstance(device, bool):
        return None  # an int to Python, but no device number
    try:
        number = operator.index(device)  # int, NumPy's integers
    except TypeError:
        return None
    return Device("cuda", number) if number >= 0 else None


def by_number(device: Any) -> bool:
    """Whether ``device`` is a bare CUDA device number (an int), rather than a name (a string
    or a ``torch.device``). A name asks for that kind of device; a number is the device to use
    where the CUDA backend is used (``pinring.Loader``'s ``backend="auto"`` may pick the host)."""
    return device is not None and not isinstance(device, str) and _parse(device) is not None \
        and not _is_torch_device(device)


def _is_torch_device(device: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(device, torch.device)
