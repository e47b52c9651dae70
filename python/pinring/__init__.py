"""pinring: batches from a shared-memory ring, handed to NumPy and PyTorch through DLPack.

``pinring.Loader`` is the training loop's end: ``for batch in pinring.Loader(ring="default"):``
yields dicts of field name -> tensor, in order, without a copy. ``Spec`` (a config resolved
once), ``EmbeddedDaemon``, ``Consumer`` and ``Batch`` are the native pieces under it. ``Producer`` is a loader's end: a Python
process that claims parts of a ring's batches and fills them. ``pinring.torch.DataLoader``
(import ``pinring.torch``; needs torch) takes ``torch.utils.data.DataLoader``'s arguments and
feeds a training loop from the user's own Dataset through a ring.

Exceptions mirror the exit codes of the pinring binaries: every one is a ``PinringError`` and
carries ``exit_code`` and ``exit_name`` (``ConfigError.exit_code == 3``).
"""

from pinring._native import (
    DLPACK_VERSION,
    PREFETCH_RANGE,
    BackendError,
    Batch,
    ConfigError,
    Consumer,
    EmbeddedDaemon,
    Field,
    InternalError,
    OutputError,
    Part,
    PartReclaimed,
    PeerDied,
    PinringError,
    Producer,
    RefusedError,
    RingError,
    Spec,
    Timeout,
    UsageError,
    VerifyError,
    bound,
    check_config,
    config_settings,
)
from pinring._native import __version__
from pinring._programs import program
from pinring.loader import Loader

__all__ = [
    "__version__",
    "DLPACK_VERSION",
    "PREFETCH_RANGE",
    "BackendError",
    "Batch",
    "ConfigError",
    "Consumer",
    "EmbeddedDaemon",
    "Field",
    "InternalError",
    "Loader",
    "OutputError",
    "Part",
    "PartReclaimed",
    "PeerDied",
    "PinringError",
    "Producer",
    "RefusedError",
    "RingError",
    "Spec",
    "Timeout",
    "UsageError",
    "VerifyError",
    "bound",
    "check_config",
    "config_settings",
    "program",
]
