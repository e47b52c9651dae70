"""Type stubs of the compiled module ``pinring._native`` (crates/pinring-python)."""

from typing import Any, ClassVar, Dict, List, Literal, Optional, Tuple, Union, final

from typing_extensions import disjoint_base

DType = Literal["u8", "i8", "i16", "u16", "i32", "u32", "i64", "u64", "f16", "bf16", "f32", "f64", "bool"]

__all__ = [
    "PinringError", "InternalError", "UsageError", "ConfigError", "RingError", "PeerDied",
    "VerifyError", "BackendError", "RefusedError", "OutputError", "Timeout", "PartReclaimed",
    "Field", "Consumer", "Batch", "EmbeddedDaemon", "Producer", "Part", "OwnerProbe", "Spec",
    "Supervisor", "Pipeline", "RingTicket", "Place",
    "check_config", "bound", "_live_rings", "_die_with_parent", "config_settings", "_main",
    "__version__", "PREFETCH_RANGE", "_test_host_field", "_test_load_config",
    "_test_check_ring_name", "_error_for_exit", "_cuda_unusable", "DLPACK_VERSION",
]

DLPACK_VERSION: Tuple[int, int]
__version__: str
"""The highest DLPack version ``Field.__dlpack__`` exports."""

class PinringError(Exception):
    """Base class of pinring's errors."""

    exit_code: ClassVar[int]
    """The exit code of the pinring binaries this error corresponds to."""
    exit_name: ClassVar[str]
    """Its short name (``"config"``, ``"ring"``, ...)."""

class InternalError(PinringError):
    """An unexpected internal error: a bug (exit code 1)."""

class UsageError(PinringError, ValueError, TypeError):
    """A bad argument (exit code 2)."""

class ConfigError(PinringError):
    """A bad config (exit code 3)."""

class RingError(PinringError):
    """A ring or segment error (exit code 4)."""

class PartReclaimed(RingError):
    """A commit refused because the daemon took the part back first (its lease ran out); the
    part is made again elsewhere, and the producer may go on claiming (exit code 4)."""

class PeerDied(PinringError, RuntimeError):
    """The ring's daemon is gone (exit code 5)."""

class Timeout(PeerDied):
    """A wait ran out of time: no batch (or slot) within the timeout given (exit code 5)."""

class VerifyError(PinringError):
    """Verification failed (exit code 6)."""

class BackendError(PinringError):
    """A GPU backend error (exit code 7)."""

class RefusedError(PinringError):
    """Refused by the ring (exit code 8)."""

class OutputError(PinringError):
    """An output file could not be written (exit code 9)."""

@final
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

@final
class OwnerProbe:
    @property
    def drops(self) -> int: ...
    @property
    def streams(self) -> list[Optional[int]]: ...
    def fail_next_prepare(self, message: str) -> None: ...

def check_config(
    config: Union[str, Dict[str, Dict[str, Any]]],
    source: str = "<config>",
    workers: Optional[int] = None,
) -> Dict[str, Any]:
    """Parses and validates a config, TOML text or settings as data (a dict of sections, each a
    dict of keys, the config file's shape), as the binaries do, raising ``ConfigError`` with
    pinring's message; returns ``batches_per_epoch`` (this rank's), ``samples_per_rank``,
    ``record_bytes`` (one sample over all its fields), ``parts_per_batch`` (seqs per batch, with
    ``"auto"`` resolved as a daemon on this host would), ``slots`` and ``slot_bytes`` (the
    ring's, likewise resolved), ``fields`` (a list of ``(name, dtype,
    per-sample shape)``), ``toml`` (the config as pinring writes it, for reading) and
    ``settings`` (as ``config_settings``). With ``workers`` (a DataLoader's
    ``num_workers``), the ring's slot count is cut to what they keep filled, in ``slots`` and in
    the TOML."""

@final
class Spec:
    """A config resolved once, as a daemon on this host resolves it: the dataset's files
    opened, ``"auto"`` sized for this host, every rule checked. Immutable; hand it to
    ``EmbeddedDaemon(spec=...)``, which stores it in its ring."""

    def __new__(
        cls,
        config: Union[str, Dict[str, Dict[str, Any]], None] = None,
        *,
        path: Optional[str] = None,
        source: str = "<config>",
        ring: Optional[str] = None,
        epochs: Optional[int] = None,
        default_epochs: Optional[int] = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        workers: Optional[int] = None,
    ) -> "Spec":
        """Resolves ``config`` (a dict of sections, the config file's shape, or TOML text;
        None: the config file at ``path``, else the lookup of ``pinring-daemon --config``) with
        the keywords and the environment's ``$PINRING_RANK``, ``$PINRING_WORLD_SIZE`` and
        ``$PINRING_DEVICE``. ``default_epochs``: ``plan.epochs`` where the settings leave it
        out; ``rank`` and ``world_size`` go together; ``workers`` (a DataLoader's
        ``num_workers``) cuts ``"auto"``'s slot count to what they keep filled. Raises
        ``ConfigError`` and ``UsageError`` with pinring's messages (``source`` names settings
        given as data in them)."""
    @property
    def ring(self) -> str: ...
    @property
    def slots(self) -> int: ...
    @property
    def slot_bytes(self) -> int: ...
    @property
    def batches_per_epoch(self) -> int: ...
    @property
    def parts_per_batch(self) -> int: ...
    @property
    def toml(self) -> str:
        """The spec's settings as TOML, for reading."""
    def settings(self) -> Dict[Tuple[str, str], Any]:
        """The scalar settings as resolved, as ``config_settings`` gives them."""
    def info(self) -> Dict[str, Any]:
        """What ``check_config`` returns, for this spec: ``batches_per_epoch``,
        ``samples_per_rank``, ``record_bytes``, ``parts_per_batch``, ``slots``, ``slot_bytes``,
        ``fields``, ``toml`` and ``settings``."""

@final
class Supervisor:
    """The restart books of a process's children, pinring-runtime's ``children::Supervisor``
    (the books of ``pinring run`` and ``pinring bench``), under one policy: ``"loaders"``
    (``pinring.Loader(loaders=N)``'s ``pinring-loader`` children, as ``pinring run``'s: a loader
    killed by a signal is restarted, up to 5 times in any 60 s; one that exits 0 or 5 is left;
    any other exit stops the run), ``"workers"`` (a ``pinring.torch.DataLoader``'s workers:
    every ending booked restarts, up to ``max_restarts`` restarts in all over the books' life)
    or ``"stream"`` (an iterable dataset's workers: never restarted)."""

    def __new__(cls, children: int, now: float,
                policy: Literal["loaders", "workers", "stream"] = "loaders",
                max_restarts: Optional[int] = None) -> "Supervisor":
        """The books of ``children`` children; ``now`` is ``time.monotonic()``.
        ``max_restarts`` is given with ``policy="workers"`` and only then; an unknown policy
        raises ``UsageError``."""
    def ended(self, index: int, pid: int, returncode: int,
              now: float) -> Literal["restart", "leave", "stop"]:
        """Child ``index`` ended with ``returncode`` (``Popen.returncode``) at ``now``."""
    def failure(self) -> Optional[Tuple[int, str]]:
        """``(exit code, sentence)`` of the failure that stops the run, once one is booked."""
    def next_run(self) -> None:
        """Forgets the failure booked and keeps the restarts counted: the children start again
        for a new run (a DataLoader's next pass)."""
    @property
    def restarts(self) -> int:
        """The restarts allowed so far, over the books' life."""
    @property
    def max_restarts(self) -> Optional[int]:
        """The restarts allowed in all: ``max_restarts`` (``"workers"``), 0 (``"stream"``), or
        None (``"loaders"``: 5 per loader in any 60 s)."""
    @property
    def policy(self) -> Literal["loaders", "workers", "stream"]: ...

def config_settings(config: Union[str, Dict[str, Dict[str, Any]]]) -> Dict[Tuple[str, str], Any]:
    """The scalar settings of a config (TOML text, such as a ring's ``Consumer.config``, or a
    dict of sections): ``(section, key) -> value`` for every boolean, integer, float and string
    key, read by pinring's own parser."""

def bound(
    seconds: float, delivered: int, daemon_wait: float, loader_wait: float, loader_busy: float,
    upload: float,
) -> Literal["loaders", "upload", "consumer", "balanced", "idle"]:
    """Where a pipeline was bound over an interval of ``seconds`` in which ``delivered``
    batches went out, from the growth of the ring's wait counters (``Consumer.status()``'s),
    as ``pinring status`` judges it."""

PREFETCH_RANGE: Tuple[int, int]
"""The allowed range of ``daemon.prefetch`` (device batch buffers): ``(2, 64)``."""

def _main(name: str, args: List[str], exe: str, prefix: List[str]) -> int:
    """Runs program ``name`` (pinring, pinring-daemon, pinring-loader) on ``args`` (the first
    is its name) with the GIL released; its exit code. ``exe`` and ``prefix`` start it again
    (its children). The console scripts' (``pinring._programs``)."""

def _live_rings() -> int:
    """Ring handles (embedded daemons, consumers, producers) open in this process: 0 means a
    fork copies none of pinring's threads or ring files."""

def _die_with_parent(signal: int, parent: int) -> bool:
    """``prctl(PR_SET_PDEATHSIG, signal)``; False if the parent (pid ``parent``) has already
    ended."""

def _test_host_field(
    data: bytes, dtype: DType, shape: list[int], readonly: bool = False
) -> Tuple[Field, OwnerProbe]: ...
def _test_load_config(path: str) -> str: ...
def _test_check_ring_name(name: str) -> None: ...
def _error_for_exit(code: int, message: str) -> PinringError:
    """The exception for a pinring program's exit code, carrying ``message``."""

def _cuda_unusable(device: int) -> Optional[str]:
    """Why CUDA device ``device`` cannot be used in this process (no driver, a driver that does
    not start, no such device), without the programs' ``--backend host``; None where it can."""

@disjoint_base
class Place:
    """Where a batch or a part stands in the plan: the attributes ``Batch`` and ``Part`` share
    (their base class)."""

    @property
    def seq(self) -> int:
        """The seq: a part's own; a batch's first (its part 0), by which a state's ``seq``
        names it."""
    @property
    def batch(self) -> int:
        """The batch's number (``seq // parts_per_batch``)."""
    @property
    def epoch(self) -> int:
        """The batch's epoch."""
    @property
    def index_in_epoch(self) -> int:
        """The batch's index in its epoch."""

@final
class Batch(Place):
    """One whole batch taken from a ring: ``fields`` maps each field's name (``"images"``,
    ``"labels"``, ...) to a ``Field`` with the batch dimension first. The batch's buffer goes
    back to the daemon once this object and every array or tensor made from its fields are gone.
    """

    samples: int
    """Samples in the batch (the batch dimension of every field)."""
    fields: Dict[str, Field]
    def release(self) -> None:
        """Drops this object's hold on the buffer (arrays and tensors keep theirs)."""

@final
class Consumer:
    """The one consumer of a ring whose daemon runs ``--sink consumer``.

    Raises ``RefusedError`` while another consumer is attached, ``RingError`` when the ring
    hands nothing over or is missing, ``UsageError`` for a ``start_seq`` the ring cannot serve,
    and ``RefusedError`` for a ``fingerprint`` of another plan.
    """

    def __new__(
        cls,
        ring: str,
        start_seq: Optional[int] = None,
        fingerprint: Optional[int] = None,
        wait_for_ring: float = 30.0,
        path: Optional[str] = None,
    ) -> "Consumer":
        """``path``: where an anonymous ring is (``EmbeddedDaemon.path``); None: the ring
        named in /dev/shm."""
    def next_batch(self, timeout: Optional[float] = None) -> Optional[Batch]:
        """The next batch in seq order (None at the end of the plan); waits with the GIL
        released. Raises ``PeerDied`` if the daemon dies or stops first, and ``Timeout`` (a
        ``PeerDied``) when ``timeout`` passes."""
    def state(self) -> Tuple[int, int]:
        """``(seq, fingerprint)`` to resume from."""
    @property
    def leases_expired(self) -> int:
        """Batch parts the daemon took back because a loader held them past the lease, over
        the ring's life."""
    def decode_counts(self) -> Optional[Dict[str, int]]:
        """How this process decoded the images its ring carries encoded (``decode="gpu"``):
        counts per way ("gpu", "cpu", "cpu_not_jpeg", "cpu_unsupported", "cpu_components",
        "cpu_batch_failed", "failed"); None where it decodes none (a ring of pixels, or one
        whose daemon copies: the daemon's summary has them as ``images_decoded``)."""
    def status(self) -> str:
        """The ring as ``pinring status --json`` reads it, as JSON text: slot counts, loaders,
        batches committed and delivered, bytes in and out, and the wait counters."""
    def expected(self, batch: int) -> Dict[str, bytes]:
        """The synthetic generator's bytes of each field of batch number ``batch`` (for
        checking every byte)."""
    @property
    def batches_per_epoch(self) -> int: ...
    @property
    def parts_per_batch(self) -> int: ...
    @property
    def config(self) -> str:
        """The daemon's resolved config, as TOML (what its producers must run with)."""
    @property
    def spec(self) -> Spec:
        """The daemon's spec, adopted from the ring (its settings as resolved, its plan)."""
    @property
    def end_seq(self) -> int: ...
    @property
    def buffers_held(self) -> Tuple[int, int]:
        """``(held, buffers)``: the batch buffers this consumer holds now (batches, or tensors
        made from them, still alive) and how many the ring has; ``next_batch`` while all are
        held raises ``UsageError``."""
    @property
    def device(self) -> str:
        """``"cpu"`` or ``"cuda:N"``."""
    @property
    def ring(self) -> str: ...
    def close(self) -> None:
        """Detaches. Batches and tensors still alive stay valid, and keep the ring's consumer
        seat until the last of them is gone."""

@final
class EmbeddedDaemon:
    """The daemon's code on a thread of this process (no service, no CUDA IPC). Loaders join
    its ring with ``pinring-loader --ring NAME``; with ``anonymous=True`` the ring is a memfd
    with no name in /dev/shm (gone with the last process holding it), which consumers and
    producers open at ``path``."""

    def __new__(
        cls,
        config: Optional[str] = None,
        ring: Optional[str] = None,
        backend: Literal["auto", "cuda", "host"] = "auto",
        device: int = 0,
        start_seq: int = 0,
        epochs: Optional[int] = None,
        replace: bool = False,
        wait: float = 60.0,
        anonymous: bool = False,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        default_epochs: Optional[int] = None,
        spec: Optional["Spec"] = None,
    ) -> "EmbeddedDaemon":
        """Runs ``spec`` as resolved (nothing read or resolved again; ``config``, ``ring``,
        ``epochs``, ``default_epochs``, ``rank`` and ``world_size`` are then refused: they are
        ``Spec``'s), or the config file ``config`` (None: the lookup) with the keywords:
        ``rank`` and ``world_size`` (both or neither) replace the config's ``plan.rank`` and
        ``plan.world_size``; ``default_epochs``: ``plan.epochs`` where neither ``epochs`` nor
        the config file sets it (None: the config's default, 2). A ``config`` file that cannot
        be read, and ``backend="cuda"`` where CUDA is unusable, raise at once, in this class's
        terms. The ring stores the spec; producers that join it with no config adopt it."""
    @property
    def ring(self) -> str: ...
    @property
    def path(self) -> Optional[str]:
        """Where an anonymous ring is opened (``/proc/<pid>/fd/<fd>`` of this process); None
        for a ring named in /dev/shm."""
    @property
    def running(self) -> bool: ...
    def stop(self) -> Optional[str]:
        """Stops (drains) the daemon; its summary as JSON text."""

@final
class RingTicket:
    """What a process needs to join a ring as a loader: the ring's name, and where an
    anonymous ring is opened (``Producer(ticket.ring, path=ticket.path)``). Pickles, so a worker
    process can be sent one."""

    def __new__(cls, ring: str, path: Optional[str] = None) -> "RingTicket":
        """The ticket of ring ``ring``, opened at ``path`` (an anonymous ring's) or by its name;
        an empty name raises ``UsageError``."""
    @property
    def ring(self) -> str:
        """The ring's name."""
    @property
    def path(self) -> Optional[str]:
        """Where an anonymous ring is opened (``/proc/<pid>/fd/<fd>``); None for a ring named
        in /dev/shm."""
    def __getnewargs__(self) -> Tuple[str, Optional[str]]: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class Pipeline:
    """An embedded daemon running a ``Spec`` and the one consumer of its ring, as one object
    (what ``pinring.torch.DataLoader`` and ``pinring.Loader`` run for their own ring):
    ``EmbeddedDaemon(spec=...)`` then ``Consumer(ring, path=...)``, composed. The consumer is
    attached when the pipeline starts, or later (``attach=False``, then ``attach()``), and can
    be detached and attached again at another seq on the same daemon."""

    def __new__(
        cls,
        spec: "Spec",
        *,
        backend: Literal["auto", "cuda", "host"] = "auto",
        device: int = 0,
        start_seq: int = 0,
        anonymous: bool = False,
        wait: float = 60.0,
        wait_for_ring: float = 30.0,
        attach: bool = True,
    ) -> "Pipeline":
        """Starts the daemon of ``spec`` at ``start_seq`` (waiting up to ``wait`` seconds for
        its ring), then, with ``attach``, attaches the consumer (up to ``wait_for_ring``
        seconds). Anything but a ``Spec`` raises ``UsageError``; a consumer that cannot attach
        stops the daemon and raises its error. ``attach=False`` starts the daemon alone:
        ``attach()`` opens the consumer later, at a seq."""
    @property
    def spec(self) -> "Spec":
        """The spec the daemon runs (and stored in its ring)."""
    @property
    def consumer(self) -> "Consumer":
        """The attached consumer: batches, ``state()``, ``status()``, the ring's shape. A
        ``UsageError`` where none is attached (``attach=False`` before ``attach()``, after
        ``detach()`` or ``stop()``)."""
    def attach(
        self, start_seq: Optional[int] = None, fingerprint: Optional[int] = None
    ) -> "Consumer":
        """Attaches the consumer of the ring, at the ring's own path, as ``Consumer(ring,
        start_seq=, fingerprint=, wait_for_ring=, path=)`` would, and raises as it would:
        ``start_seq`` (with the ``fingerprint`` it was saved under) resumes at a saved state.
        One consumer at a time: one attached already, or a stopped pipeline, is a
        ``UsageError``."""
    def detach(self) -> None:
        """Closes the attached consumer (batches still alive stay valid, and keep the ring's
        consumer lock until the last of them is gone); nothing where none is attached. The
        daemon runs on: ``attach()`` opens a consumer again, at another seq."""
    @property
    def daemon(self) -> "EmbeddedDaemon":
        """The embedded daemon."""
    @property
    def ring(self) -> str:
        """The ring's name."""
    @property
    def path(self) -> Optional[str]:
        """Where an anonymous ring is opened; None for a ring named in /dev/shm."""
    @property
    def running(self) -> bool:
        """Whether the daemon still runs."""
    def ticket(self) -> RingTicket:
        """What a loader process needs to join the ring: its name and path."""
    def stop(self) -> Optional[str]:
        """Detaches the consumer, then stops (drains) the daemon: its summary as JSON text (None
        once stopped already). Raises the daemon's error if it failed, as
        ``EmbeddedDaemon.stop()`` does."""

@final
class Part(Place):
    """One claimed part of a batch (a whole batch when it fits one slot). Fill every field,
    then ``commit()`` within the daemon's lease (``daemon.lease_ms``, 30 s by default). A part
    dropped uncommitted is given back: the daemon makes it again elsewhere once the lease ends."""

    @property
    def first_in_batch(self) -> int:
        """Index in its batch of the part's first sample."""
    @property
    def indices(self) -> list[int]:
        """Dataset sample ids of the part, in payload order."""
    @property
    def fields(self) -> Dict[str, Field]:
        """Field name -> writable host ``Field`` of shape ``[len(part), ...]`` over the part's
        chunk of its slot (``numpy.from_dlpack(field)`` writes into the ring). Do not write
        into them after ``commit()``."""
    @property
    def committed(self) -> bool: ...
    def commit(self) -> None:
        """Writes the part's metadata (labels: the values of an integer ``labels`` field of one
        value per sample, any integer dtype) and publishes the slot. Raises ``ValueError``
        naming the sample, the label and the range for a label outside ``0..=4294967295``
        (nothing is published: fix it and commit again), ``PartReclaimed`` (a ``RingError``) if
        the daemon took the slot back first, ``RingError`` if the metadata does not fit the
        slot, ``UsageError`` if already committed."""
    def __len__(self) -> int: ...

@final
class Producer:
    """A loader process's end of a ring, in Python: claims parts, lets Python fill them."""

    def __new__(
        cls, ring: str, config: Optional[str] = None, wait: float = 30.0,
        path: Optional[str] = None, peers: Optional[int] = None,
        only_batches: Optional[Tuple[int, int]] = None,
    ) -> "Producer":
        """Joins ring ``ring`` as a loader. With no ``config``, it adopts the spec the ring's
        daemon stored in the ring (every ring that hands batches to a training process stores
        one; nothing is read from a file or resolved again), and where the ring stores none, it
        takes the config lookup of ``pinring-loader``. A config is refused with
        ``RefusedError`` if its fingerprint is not the daemon's. ``path``: where an
        anonymous ring is (``EmbeddedDaemon.path``). ``peers``: how many producers are started
        together with this one; each then keeps to its own share of the slots from its first
        claim (which slots it writes decides which of the ring's pages count in its memory).
        ``only_batches=(residue, modulus)``: claim only the parts of batches ``b`` with
        ``b % modulus == residue``, lowest seq first (one of ``modulus`` streams, each made by
        its own producer; a batch whose producer is gone waits for it)."""
    def claim(self, timeout: Optional[float] = None) -> Optional[Part]:
        """The next part to make, or None once the daemon has ended the run. Raises
        ``PeerDied`` if the daemon dies, and ``Timeout`` (a ``PeerDied``) if no slot comes free
        within ``timeout`` seconds."""
    def synthetic(self, part: Part) -> Dict[str, bytes]:
        """What the synthetic generator puts in each field of ``part``."""
    @property
    def ring(self) -> str: ...
    @property
    def loader_index(self) -> int:
        """This producer's index in the ring's loader table."""
    def close(self) -> None:
        """Leaves the loader table; a part still claimed can no longer be committed."""
