"""Type stubs of the compiled module ``pinring._native`` (crates/pinring-python)."""

from typing import Any, ClassVar, Literal, Optional, Tuple

DType = Literal["u8", "i32", "i64", "f16", "bf16", "f32", "f64"]

DLPACK_VERSION: Tuple[int, int]
"""The highest DLPack version ``Field.__dlpack__`` exports."""

class PinringError(Exception):
    """Base class of pinring's errors."""

    exit_code: ClassVar[int]
    """The exit code of the pinring binaries this error corresponds to."""
    exit_name: ClassVar[str]
    """Its short name (``"config"``, ``"ring"``, ...)."""

class InternalError(PinringError):
    """An unexpected internal error: a bug (exit code 1)."""

class UsageError(PinringError):
    """A bad argument (exit code 2)."""

class ConfigError(PinringError):
    """A bad config (exit code 3)."""

class RingError(PinringError):
    """A ring or segment error (exit code 4)."""

class PeerDied(PinringError):
    """The ring's daemon is gone (exit code 5)."""

class VerifyError(PinringError):
    """Verification failed (exit code 6)."""

class BackendError(PinringError):
    """A GPU backend error (exit code 7)."""

class RefusedError(PinringError):
    """Refused by the ring (exit code 8)."""

class OutputError(PinringError):
    """An output file could not be written (exit code 9)."""

class Field:
    """One C-contiguous array of a batch, on the host or a CUDA device.

    ``numpy.from_dlpack(field)`` and ``torch.from_dlpack(field)`` see its memory without a
    copy; the memory stays valid while the field or any array made from it lives.
    """

    @property
    def shape(self) -> Tuple[int, ...]: ...
    @property
    def dtype(self) -> DType:
        """pinring's name of the element type."""
    @property
    def device(self) -> str:
        """``"cpu"`` or ``"cuda:N"``."""
    @property
    def nbytes(self) -> int: ...
    @property
    def readonly(self) -> bool:
        """Whether DLPack consumers are told not to write."""
    def numpy(self) -> Any:
        """The field as a ``numpy.ndarray`` over the same memory (host fields only)."""
    def __dlpack__(
        self,
        stream: Optional[int] = None,
        *,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any:
        """A DLPack capsule: ``"dltensor_versioned"`` when ``max_version`` is 1.0 or later,
        else ``"dltensor"``. ``stream`` is the consumer's stream (CUDA: 1 legacy default,
        2 per-thread default, else a ``cudaStream_t``; -1 asks for no synchronisation); the
        data is ready on it once this returns. ``copy=True`` and another ``dl_device`` raise
        ``BufferError``: fields are never copied."""
    def __dlpack_device__(self) -> Tuple[int, int]:
        """``(1, 0)`` for host memory, ``(2, n)`` for CUDA device ``n``."""

# Test support (python/tests): not part of the API.

class OwnerProbe:
    @property
    def drops(self) -> int: ...
    @property
    def streams(self) -> list[Optional[int]]: ...
    def fail_next_prepare(self, message: str) -> None: ...

def _test_host_field(
    data: bytes, dtype: DType, shape: list[int], readonly: bool = False
) -> Tuple[Field, OwnerProbe]: ...
def _test_load_config(path: str) -> str: ...
def _test_check_ring_name(name: str) -> None: ...
def _test_exit_error(code: int, message: str) -> PinringError: ...
