"""pinring: batches from a shared-memory ring, handed to NumPy and PyTorch through DLPack.

Exceptions mirror the exit codes of the pinring binaries: every one is a ``PinringError`` and
carries ``exit_code`` and ``exit_name`` (``ConfigError.exit_code == 3``).
"""

from pinring._native import (
    DLPACK_VERSION,
    BackendError,
    ConfigError,
    Field,
    InternalError,
    OutputError,
    PeerDied,
    PinringError,
    RefusedError,
    RingError,
    UsageError,
    VerifyError,
)

__all__ = [
    "DLPACK_VERSION",
    "BackendError",
    "ConfigError",
    "Field",
    "InternalError",
    "OutputError",
    "PeerDied",
    "PinringError",
    "RefusedError",
    "RingError",
    "UsageError",
    "VerifyError",
]
