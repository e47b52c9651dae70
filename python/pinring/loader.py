"""``pinring.Loader``: a training loop's batches, straight from a pinring ring, without a copy.

    for batch in pinring.Loader(ring="default", device=0):
        x, y = batch["images"], batch["labels"]

Each batch is a dict of field name -> tensor (torch, when torch is importable; NumPy arrays
otherwise, or with ``as_numpy=True``). On a CUDA ring the tensors are device memory: attached
to a daemon running as a service, this process copies each batch out of the ring's slots itself,
in its own CUDA context (``daemon.copies = "consumer"``, the default); embedded, the daemon's
thread uploads into its buffers. On the host backend they are host memory. A batch's memory is
reused only when every tensor made from it is gone, so keeping a tensor is always safe (it only
holds one of the ring's ``daemon.prefetch`` buffers).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Union

from pinring import _device, _dist, _memfd, _native
from pinring._device import DeviceLike
from pinring._progress import Progress

# Epochs the plan of a loader's embedded daemon covers where nobody set plan.epochs: a plan
# without end in practice, as torch's DataLoader has none (each ``for`` takes one epoch).
# pinring's config default, 2, is a service daemon's: it made a Python loop of 5 epochs get
# 2 whole ones and 3 empty ones.
DEFAULT_EPOCHS = 100_000


@functools.lru_cache(maxsize=None)
def _torch() -> Any:
    """torch, or None where it is not installed, looked up once: an import statement per batch
    took 4% of a Python loop over small batches."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def _to_framework(fields: Dict[str, Any], as_numpy: bool, stream: Optional[int]) -> Dict[str, Any]:
    torch = None if as_numpy else _torch()
    if torch is None:
        import numpy as np

        return {name: np.from_dlpack(f) for name, f in fields.items()}
    return dict(zip(fields, torch_tensors(torch, fields.values(), stream)))


def torch_tensors(torch: Any, fields: Iterable[Any], stream: Optional[int] = None) -> List[Any]:
    """The fields of one batch as torch tensors. On CUDA, ``stream`` (None: the current stream
    of the fields' device, as ``torch.from_dlpack`` would pass it) waits on the device for the
    batch's upload before any work queued on it after this; it is asked once per batch, not once
    per field, since a batch's fields are on one device."""
    from_dlpack = torch.utils.dlpack.from_dlpack
    out = []
    for f in fields:
        device = f.device
        if device.startswith("cuda"):
            if stream is None:
                # torch's default stream is the legacy stream (1) in DLPack's words.
                stream = torch.cuda.current_stream(device).cuda_stream or 1
            out.append(from_dlpack(f.__dlpack__(stream=stream)))
        else:
            out.append(from_dlpack(f))
    return out


def checked_state(state: Dict[str, int]) -> Dict[str, int]:
    """A saved ``{"seq", "fingerprint"}`` state as ints; ``UsageError`` naming a missing key."""
    missing = {"seq", "fingerprint"} - set(state)
    if missing:
        raise _native.UsageError(f"a pinring state needs the keys seq and fingerprint; missing {sorted(missing)}")
    return {"seq": int(state["seq"]), "fingerprint": int(state["fingerprint"])}


# The kinds read from files, each with its own table ([dataset.tokens], ...), and the keys of
# [dataset] itself beside such a table.
_FILE_KINDS = ("tokens", "npy", "webdataset", "imagefolder")
_DATASET_OWN = ("kind", "on_bad_sample", "image")


def _nested_dataset(dataset: Dict[str, Any]) -> Dict[str, Any]:
    """``dataset=`` as the config's shape. A file kind's keys may be given flat, beside
    ``kind`` (``{"kind": "webdataset", "shards": [...]}``): they go into the kind's table
    (``[dataset.webdataset]``), the only place they can be."""
    kind = dataset.get("kind")
    if kind not in _FILE_KINDS:
        return dict(dataset)
    flat = {k: v for k, v in dataset.items() if k not in _DATASET_OWN and k != kind}
    if not flat:
        return dict(dataset)
    if kind in dataset:
        raise _native.UsageError(
            f"dataset= gives {sorted(flat)} beside its {kind!r} table: put every "
            f"[dataset.{kind}] key in dataset[{kind!r}], or give them all flat"
        )
    nested = {k: v for k, v in dataset.items() if k in _DATASET_OWN}
    nested[kind] = flat
    return nested


def _readable_config(path: str) -> None:
    """Raises ``ConfigError`` in the caller's terms (``pinring.Loader(config="nope.toml"): cannot
    read config file nope.toml: No such file or directory``) where the config file ``path``
    cannot be read: missing, unreadable, or not a regular file (a FIFO is refused without
    waiting for a writer)."""
    import stat

    def fail(why: str) -> _native.ConfigError:
        return _native.ConfigError(
            f"pinring.Loader(config={json.dumps(path)}): cannot read config file {path}: {why}"
        )

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise fail(e.strerror or str(e)) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise fail("not a regular file")
        os.read(fd, 1)
    except OSError as e:
        raise fail(e.strerror or str(e)) from None
    finally:
        os.close(fd)


def _ring_name_of(config: Optional[Union[str, Dict[str, Any]]]) -> str:
    """ring.name of a config (a file or settings as data), or the default's."""
    if isinstance(config, dict):
        return str(config.get("ring", {}).get("name", "default"))
    if isinstance(config, str):
        try:
            with open(config) as f:
                return str(_native.config_settings(f.read()).get(("ring", "name"), "default"))
        except (OSError, _native.PinringError):
            return "default"  # the daemon reports the file's problem itself
    return "default"



def _before_threads() -> None:
    """What must happen before an embedded daemon's threads start here: the zygotes of
    ``pinring.torch.DataLoader``s already made are forked first (``fork_waiting_zygotes``),
    if that module is in use (it is not imported for it)."""
    dataloader = sys.modules.get("pinring.torch._dataloader")
    if dataloader is not None:
        dataloader.fork_waiting_zygotes()

class Loader:
    """Iterates over one epoch of a ring's batches per ``for`` loop, in order.

    Args:
        ring: the ring's name (its daemon runs ``--sink consumer``).
        device: where the batches go, in any form ``pinring.torch.DataLoader`` takes: an int
            (a CUDA device number: the one an embedded daemon uploads to where it uses CUDA,
            and the one an attached ring must deliver to unless it delivers to host memory),
            ``"cuda"`` (the current CUDA device), ``"cuda:N"``, a ``torch.device``, or
            ``"cpu"``/``"host"`` (the host backend: batches in host memory). A name asks for
            that kind of device: an embedded daemon's backend follows it (``BackendError``,
            saying to pass ``device="cpu"``, where CUDA cannot be used here), and an attached
            ring must deliver there. None: anywhere (an embedded daemon: the current CUDA
            device, or ``LOCAL_RANK``, where it uses CUDA). Anything else is a ``UsageError``
            naming the forms.
        embedded: run the daemon inside this process (no service, no CUDA IPC); loaders are
            still separate processes (``pinring-loader --ring NAME``), or ``loaders=``'s.
        loaders: start this many ``pinring-loader`` processes for an embedded daemon (implies
            ``embedded=True``) and supervise them: one killed by a signal is started again, one
            that fails raises its error, with its message, in the loop; they stop with the
            loader, and with this process however it ends. The ring is anonymous (nothing in
            /dev/shm).
        loaders_cpus: CPUs to pin the loaders to, one each in turn (None: no pinning).
        config: the config of an embedded daemon: a TOML file's path, or the settings as data
            (a dict of sections, the file's shape); given, the daemon runs in this process
            (``embedded=True``: an attached ring's daemon has a config of its own). None:
            pinring's config lookup, or the settings ``dataset=``, ``image=`` and the plan's
            keywords give. A file that cannot be read is a ``ConfigError`` naming it.
        dataset, image: an embedded daemon's ``[dataset]`` and ``[dataset.image]`` tables as
            dicts (``dataset={"kind": "webdataset", "shards": [...]}, image={"crop": 224}``),
            instead of a file. A file kind's keys may be given flat beside ``kind``, as there,
            or in its own table (``{"kind": "webdataset", "webdataset": {"shards": [...]}}``).
        batch_size, shuffle, seed, drop_last: the ``[plan]`` keys, with ``dataset=`` or a dict
            ``config``. Every setting is validated by pinring's own parser, with its messages.
        rank, world_size: an embedded daemon's shard (``plan.rank``, ``plan.world_size``, over
            the config's). Under torchrun, or with a ``torch.distributed`` process group, they
            are the job's when left out, and one given that contradicts the job is a
            ``UsageError``; an attached ring must serve this process's shard.
        backend: an embedded daemon's backend: ``"auto"``, ``"cuda"`` or ``"host"``.
        epochs: epochs an embedded daemon's plan covers (over ``plan.epochs``). Where neither
            this nor the config sets them the plan has no end (``DEFAULT_EPOCHS``), as torch's
            DataLoader; a ``for`` past the epochs that were set raises ``UsageError`` naming
            ``plan.epochs``.
        timeout: seconds to wait for one batch (None: as long as the daemon lives).
        wait_for_ring: seconds to wait for an attached ring to appear.
        as_numpy: yield NumPy arrays instead of torch tensors.
        stream: a CUDA stream handle the tensors are used on (None: torch's current stream).
        progress: a one-line progress view on stderr (epoch, batches, batches/s, GB/s and
            where the pipeline is bound); None: only when stderr is a terminal.
    """

    def __init__(
        self,
        ring: Optional[str] = None,
        device: Optional[DeviceLike] = None,
        *,
        embedded: bool = False,
        loaders: int = 0,
        loaders_cpus: Optional[Sequence[int]] = None,
        config: Optional[Union[str, Dict[str, Any]]] = None,
        dataset: Optional[Dict[str, Any]] = None,
        image: Optional[Dict[str, Any]] = None,
        batch_size: Optional[int] = None,
        shuffle: Optional[bool] = None,
        seed: Optional[int] = None,
        drop_last: Optional[bool] = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        backend: str = "auto",
        epochs: Optional[int] = None,
        timeout: Optional[float] = None,
        wait_for_ring: float = 30.0,
        as_numpy: bool = False,
        stream: Optional[int] = None,
        progress: Optional[bool] = None,
    ) -> None:
        # This loader's own daemon and the consumer of its ring (attached lazily, at a seq),
        # as one object; None for an attached ring.
        self._pipeline: Optional[_native.Pipeline] = None
        self._loaders: Optional[Any] = None
        self._path: Optional[str] = None
        self._failed = False
        if loaders < 0:
            raise _native.UsageError(f"loaders={loaders}: pass a number of loaders, or 0")
        if loaders_cpus is not None and not loaders:
            raise _native.UsageError("loaders_cpus= pins the loaders that loaders=N starts: "
                                     "pass loaders=N too")
        dev = _device.parse(device, "pinring.Loader")
        # A name ("cuda", "cpu", a torch.device) asks for that kind of device; a bare number is
        # the CUDA device where CUDA is used, and a host ring serves it too.
        named = dev is not None and not _device.by_number(device)
        plan = {k: v for k, v in (("batch_size", batch_size), ("shuffle", shuffle),
                                  ("seed", seed), ("drop_last", drop_last)) if v is not None}
        if isinstance(config, str):
            _readable_config(config)
            embedded = True  # a config is an embedded daemon's: an attached ring has its own
        if isinstance(config, dict) or dataset is not None or image is not None or plan:
            if isinstance(config, str):
                raise _native.UsageError(
                    "config= names a file, and dataset=/image=/plan keywords give settings too: "
                    "pass the file's settings as a dict (config={...}) or leave config out"
                )
            config = self._config_from_data(config, dataset, image, plan)
            embedded = True
        if epochs is not None and (isinstance(epochs, bool) or int(epochs) < 1):
            raise _native.UsageError(
                f"pinring.Loader(epochs={epochs!r}): a plan covers at least one epoch: pass "
                "epochs >= 1, or leave it out for a plan without end"
            )
        # What this loader's pipeline is started from, again at a seq by a restart; None for
        # an attached ring.
        self._pipeline_args: Optional[Dict[str, Any]] = None
        if (rank is None) != (world_size is None):
            raise _native.UsageError(
                f"rank={rank}, world_size={world_size}: give both, or neither (the job's, or "
                "the config's plan)"
            )
        if embedded or loaders:
            rank, world_size = _dist.shard(rank, world_size, "pinring.Loader")
            spec = self._spec(config, ring, epochs, rank, world_size)
            backend, ordinal = self._backend(device, dev, named, backend)
            self._pipeline_args = dict(spec=spec, backend=backend, device=ordinal,
                                       anonymous=bool(loaders), wait_for_ring=wait_for_ring,
                                       attach=False)
            _before_threads()
            self._pipeline = _native.Pipeline(**self._pipeline_args)
            ring = self._pipeline.ring
            self._path = self._pipeline.path
        elif rank is not None:
            raise _native.UsageError(
                "rank= and world_size= set an embedded daemon's shard; an attached ring's "
                "daemon decides its own (plan.rank, or $PINRING_RANK)"
            )
        elif ring is None:
            ring = "default"
        self.ring: str = ring
        # Where the ring must deliver ("cuda:N", "cpu"; None: anywhere), and whether a host
        # ring will do too (a bare number: the device a CUDA ring must use).
        self._want: Optional[str] = None
        self._lenient = not named
        if dev is not None:
            index = dev.number if dev.number is not None else _dist.default_ordinal()
            self._want = "cpu" if dev.kind == "cpu" else f"cuda:{index}"
        self._timeout = timeout
        self._wait_for_ring = wait_for_ring
        self._as_numpy = as_numpy
        self._stream = stream
        self._consumer: Optional[_native.Consumer] = None
        self._resume: Optional[Dict[str, int]] = None
        self._epoch_wanted: Optional[int] = None
        # Set by load_state_dict: the next for yields the rest of the saved epoch (nothing,
        # for a state saved at the plan's end) rather than a new one.
        self._rest_of_state = False
        # A state at the plan's end loaded with loaders=N: the daemon and loaders are stopped,
        # and this is the state; with (batches per epoch, parts per batch, end seq).
        self._ended: Optional[Dict[str, int]] = None
        self._shape = (0, 1, 0)
        # Where the last consumer's batches were: what ``device`` answers once the loader has
        # ended and its ring is gone.
        self._device_seen: Optional[str] = None
        self._loader_args = (loaders, loaders_cpus)
        if progress is None:
            progress = bool(getattr(sys.stderr, "isatty", lambda: False)())
        self._progress: Optional[Progress] = Progress() if progress else None
        if loaders:
            self._start_loaders(loaders, loaders_cpus)

    @staticmethod
    def _backend(device: Any, dev: Optional[_device.Device], named: bool,
                 backend: str) -> "tuple[str, int]":
        """An embedded daemon's backend and CUDA device number for ``device`` (parsed: ``dev``)
        and ``backend``: "cpu" is the host backend, a CUDA device by name the CUDA backend; one
        that contradicts ``backend``, and CUDA where it cannot be used, are refused here, in
        this class's terms."""
        if dev is not None and dev.kind == "cpu":
            if backend == "cuda":
                raise _native.UsageError(
                    f'pinring.Loader(device={device!r}, backend="cuda"): device="cpu" runs the '
                    'host backend (batches in host memory): pass one of them'
                )
            return "host", 0
        if named and backend == "host":
            raise _native.UsageError(
                f'pinring.Loader(device={device!r}, backend="host"): a CUDA device needs the '
                'CUDA backend: pass backend="cuda" or leave it out, or pass device="cpu"'
            )
        ordinal = dev.number if dev is not None and dev.number is not None else \
            _dist.default_ordinal()
        if named:
            backend = "cuda"
        if backend == "cuda":
            why = _native._cuda_unusable(ordinal)
            if why is not None:
                arg, fix = (
                    (f"device={device!r}",
                     'pass device="cpu" to run on pinring\'s host backend (batches in host '
                     'memory)') if named else
                    ('backend="cuda"', 'pass backend="host"')
                )
                raise _native.BackendError(f"pinring.Loader({arg}): {why}, or {fix}")
        return backend, ordinal

    def _config_from_data(self, config: Optional[Dict[str, Any]], dataset: Optional[Dict[str, Any]],
                          image: Optional[Dict[str, Any]], plan: Dict[str, Any]) -> Dict[str, Any]:
        """A config given as data: the dict of sections with the keyword tables merged in (a
        key given twice refused), for ``_native.Spec`` to read by pinring's rules."""
        sections: Dict[str, Any] = {k: dict(v) if isinstance(v, dict) else v
                                    for k, v in (config or {}).items()}
        if dataset is not None:
            dataset = _nested_dataset(dataset)
        for name, table in (("dataset", dataset), ("plan", plan)):
            if table:
                given = sections.setdefault(name, {})
                twice = sorted(set(given) & set(table))
                if twice:
                    raise _native.UsageError(
                        f"{name}.{twice[0]} is given both in config= and as an argument: give "
                        "it once"
                    )
                given.update(table)
        if image is not None:
            sections.setdefault("dataset", {})["image"] = dict(image)
        return sections

    @staticmethod
    def _spec(config: Optional[Union[str, Dict[str, Any]]], ring: Optional[str],
              epochs: Optional[int], rank: Optional[int],
              world_size: Optional[int]) -> _native.Spec:
        """The embedded daemon's spec, resolved once, here: the daemon runs this value and
        stores it in its ring, where the loaders adopt it. A plan whose epochs nobody set has
        no end here. Under a launcher, each rank on the host gets a ring of its own."""
        local = _dist.local_rank()
        if ring is None and local is not None:
            ring = f"{_ring_name_of(config)}-rank{local}"
        return _native.Spec(
            config if isinstance(config, dict) else None,
            path=config if isinstance(config, str) else None, source="pinring.Loader",
            ring=ring, epochs=epochs, default_epochs=DEFAULT_EPOCHS, rank=rank,
            world_size=world_size,
        )

    def _start_loaders(self, n: int, cpus: Optional[Sequence[int]]) -> None:
        from pinring._loaders import _Loaders

        # The loaders adopt the spec the daemon stored in the ring, so their plan is the ring's;
        # loaders=N always starts its own pipeline first.
        assert self._pipeline is not None
        try:
            self._loaders = _Loaders(n, self._pipeline.ticket(), cpus)
        except BaseException:
            self.close()
            raise
        self._last_check = time.monotonic()

    @property
    def loader_pids(self) -> "list[int]":
        """The pids of the ``pinring-loader`` processes ``loaders=`` started and still running."""
        return [] if self._loaders is None else self._loaders.pids()

    def _next(self, c: _native.Consumer) -> Optional[_native.Batch]:
        """The next batch; with loaders of its own, looks at them every 0.1 s meanwhile. A
        failure raised here (a loader's, the daemon's) is the loop's: ``close()`` does not raise
        it again."""
        try:
            return self._next_or_fail(c)
        except _native.PinringError as e:
            if not isinstance(e, _native.Timeout):
                self._failed = True
            raise

    def _next_or_fail(self, c: _native.Consumer) -> Optional[_native.Batch]:
        if self._loaders is None:
            try:
                return c.next_batch(self._timeout)
            except _native.PeerDied as e:
                if self._pipeline is None or isinstance(e, _native.Timeout):
                    raise
                # This process's own daemon stopped the run (a loader started by hand failed
                # on its data): its error says why; the consumer's would say to restart a
                # daemon by a flag nobody here gave.
                self._stop_daemon()
                raise
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        while True:
            now = time.monotonic()
            if now - self._last_check >= 0.1:
                self._loaders.check()
                self._last_check = now
            wait = 0.1 if deadline is None else min(0.1, max(0.0, deadline - now))
            try:
                return c.next_batch(wait)
            except _native.Timeout:
                if deadline is not None and time.monotonic() >= deadline:
                    raise
            except _native.PeerDied:
                # The daemon ended the run early: a loader that failed (bad data) made it stop.
                # Its own error, with its message, is the one to raise.
                self._raise_loader_failure()
                raise

    def _raise_loader_failure(self) -> None:
        """After the daemon stopped the run: raises the error of the loader that failed, as the
        loader said it (once the loaders have ended, up to 3 s), else the embedded daemon's."""
        assert self._loaders is not None
        # Every loader ends once the run has stopped (its daemon gone: within 250 ms).
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            if all(p is None or p.poll() is not None for p in self._loaders.procs):
                break
            time.sleep(0.02)
        self._loaders.check()
        if self._pipeline is not None:
            self._stop_daemon()  # raises the daemon's error, which names the loader's, if any

    def _stop_daemon(self) -> None:
        """Stops the embedded daemon after it ended the run, raising its error; the consumer
        stays attached (its state is where the loop stood) until the loader closes."""
        pipeline, self._pipeline = self._pipeline, None
        if pipeline is not None:
            pipeline.daemon.stop()

    # -- attaching -------------------------------------------------------------------------

    def _attach(self) -> _native.Consumer:
        if self._consumer is None:
            seq = fp = None
            if self._resume is not None:
                seq, fp = self._resume["seq"], self._resume["fingerprint"]
            if self._pipeline is not None:
                c = self._pipeline.attach(start_seq=seq, fingerprint=fp)
            else:
                where = {} if self._path is None else {"path": self._path}
                c = _native.Consumer(self.ring, start_seq=seq, fingerprint=fp,
                                     wait_for_ring=self._wait_for_ring, **where)
                _dist.check_ring_shard(self.ring, c.spec.settings())
            there = c.device
            if self._want is not None and there != self._want and not (
                self._lenient and there == "cpu"
            ):
                self._consumer = c
                self._detach()
                raise _native.UsageError(
                    f"ring {self.ring!r} delivers to {there}, not {self._want}: pass "
                    f"device={there!r} or leave device out, or attach to a ring that "
                    f"delivers to {self._want}"
                )
            self._consumer = c
            self._resume = None
            self._device_seen = c.device
        return self._consumer

    @property
    def device(self) -> str:
        """Where batches are: ``"cpu"`` or ``"cuda:N"`` (for a loader resumed past its plan's
        end, where they were)."""
        if self._ended is not None and self._device_seen is not None:
            return self._device_seen
        return self._attach().device

    def __len__(self) -> int:
        """Batches per epoch."""
        if self._ended is not None:
            return self._shape[0]
        return self._attach().batches_per_epoch

    def decode_counts(self) -> Optional[Dict[str, int]]:
        """How the images this ring carries encoded (``image={"decode": "gpu"}``) were decoded
        in this process, per way: ``"gpu"`` (nvJPEG), ``"cpu"`` (the host backend's engine), ``"cpu_not_jpeg"``,
        ``"cpu_unsupported"`` (progressive and other JPEGs nvJPEG's batched decode does not
        take), ``"cpu_components"`` (CMYK), ``"cpu_batch_failed"`` (on the CPU), ``"failed"``
        (zeros). None where this process decodes none: a ring of pixels, or one whose daemon
        copies (an embedded loader's: its summary, returned by :meth:`close`, has them as
        ``images_decoded``)."""
        if self._consumer is None:
            return None
        return self._consumer.decode_counts()

    # -- iterating -------------------------------------------------------------------------

    def batches(self) -> Iterator[_native.Batch]:
        """The raw batches (``Batch.fields`` are DLPack fields) to the end of the plan."""
        if self._ended is not None:
            return
        c = self._attach()
        while True:
            b = self._next(c)
            if b is None:
                return
            self._took(c, b, c.batches_per_epoch)
            # Yielded out of a list, so this suspended generator keeps no reference to the
            # batch: the caller's last reference is the last one.
            box = [b]
            del b
            yield box.pop()

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        if self._epoch_wanted is not None:
            epoch, self._epoch_wanted = self._epoch_wanted, None
            self._move_to_epoch(epoch)
        # The first for after load_state_dict yields the rest of the saved epoch, which is
        # nothing for a state saved after the plan's last batch; any other for at the plan's
        # end would be an epoch past it.
        rest, self._rest_of_state = self._rest_of_state, False
        if self._ended is not None:
            if rest:
                return
            per_epoch, ppb, end_seq = self._shape
            raise self._past_the_plan(end_seq // ppb // per_epoch)
        c = self._attach()
        per_epoch = c.batches_per_epoch
        if c.state()[0] >= c.end_seq:
            if rest:
                return
            raise self._past_the_plan(c.end_seq // c.parts_per_batch // per_epoch)
        while True:
            b = self._next(c)
            if b is None:
                return
            last = b.index_in_epoch + 1 >= per_epoch
            self._took(c, b, per_epoch)
            box = [b]
            del b
            # Converted and yielded in one expression, so this suspended generator keeps no
            # reference to the batch or its tensors: the caller's are the only ones, and the
            # buffer goes back as soon as they are gone.
            yield self._convert(box)
            if last:
                return

    def _plan_runs(self, epochs: int) -> str:
        return f"ring {self.ring!r} runs {epochs} epochs (plan.epochs = {epochs})"

    def _more_epochs(self) -> str:
        """How to get a longer plan: this loader's own daemon's, or an attached ring's."""
        if self._pipeline_args is not None:
            return ("set plan.epochs (or epochs=) to the epochs the training loop runs, or leave "
                    "it unset for a plan without end")
        return "start the ring's daemon with more epochs (plan.epochs in its config)"

    def _past_the_plan(self, epochs: int) -> _native.UsageError:
        """The error of a ``for`` after the plan's last epoch: not an empty epoch."""
        return _native.UsageError(
            f"this for would be epoch {epochs}, but {self._plan_runs(epochs)}, all of which "
            f"were taken: {self._more_epochs()}"
        )

    def _took(self, c: _native.Consumer, b: _native.Batch, per_epoch: int) -> None:
        if self._progress is not None:
            self._progress.update(c, b.epoch, b.index_in_epoch, per_epoch)
            if b.index_in_epoch + 1 >= per_epoch:
                self._progress.end_epoch()

    # -- epochs ----------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """The next ``for`` yields epoch ``epoch`` (as ``DistributedSampler.set_epoch``); the
        loader moves to the next epoch by itself after each ``for``, so this is only needed to
        jump. With ``loaders=N`` the daemon and its loaders start again at the epoch (forward
        or back, seconds of start-up); otherwise the loader can only move forward, taking and
        dropping the batches up to the epoch, and a ring already past it is a ``UsageError``."""
        if int(epoch) < 0:
            raise _native.UsageError(f"set_epoch({epoch}): epochs count from 0")
        self._epoch_wanted = int(epoch)

    def _position(self) -> "tuple[int, int]":
        """``(seq, fingerprint)`` where the loader stands, from its consumer (which also sets
        ``_shape``), or the state an ended loader holds."""
        if self._ended is not None:
            return self._ended["seq"], self._ended["fingerprint"]
        c = self._attach()
        self._shape = (c.batches_per_epoch, c.parts_per_batch, c.end_seq)
        seq, fingerprint = c.state()
        return seq, fingerprint

    def _move_to_epoch(self, epoch: int) -> None:
        seq, fingerprint = self._position()
        per_epoch, ppb, end_seq = self._shape
        if seq // ppb // per_epoch == epoch:
            return  # at the epoch's start, or where a loop left it
        target = epoch * per_epoch * ppb
        if target >= end_seq:
            raise _native.UsageError(
                f"set_epoch({epoch}): {self._plan_runs(end_seq // ppb // per_epoch)}: give an "
                f"epoch below that, or {self._more_epochs()}"
            )
        if self._pipeline_args is not None and (self._loaders is not None or self._ended):
            self._restart_at(target)
            return
        assert self._consumer is not None
        self._detach()
        self._resume = {"seq": target, "fingerprint": fingerprint}
        try:
            self._attach()
        except _native.UsageError as e:
            self._resume = {"seq": seq, "fingerprint": fingerprint}  # it stays where it stood
            raise self._cannot_go_back(f"set_epoch({epoch})", target // ppb, e) from None

    def _cannot_go_back(self, what: str, batch: int, e: _native.UsageError) -> _native.UsageError:
        """The error of ``what`` (a jump back to ``batch``) refused by the consumer with ``e``:
        attached, its message (how to restart the ring's daemon); an embedded daemon cannot be
        restarted by its flags, so ``loaders=N`` is the way."""
        why = "it has handed over every batch before" if self._pipeline is not None else str(e)
        return _native.UsageError(
            f"{what}: ring {self.ring!r} cannot go back to batch {batch} ({why}); only a Loader "
            "with loaders=N starts its daemon again at an earlier batch"
        )

    def _detach(self) -> None:
        """Closes the consumer: its pipeline's (which can attach again, at another seq), or the
        attached ring's."""
        c, self._consumer = self._consumer, None
        if self._pipeline is not None:
            self._pipeline.detach()
        elif c is not None:
            c.close()

    def _stop_pieces(self) -> Optional[str]:
        """Stops the loaders, the consumer and the embedded daemon; the daemon's summary (JSON
        text), if there was one."""
        if self._loaders is not None:
            self._loaders.stop()
            self._loaders = None
        if self._consumer is not None:
            self._detach()
        pipeline, self._pipeline = self._pipeline, None
        return None if pipeline is None else pipeline.stop()

    def _restart_at(self, seq: int) -> None:
        """Stops the loaders and the embedded daemon, and starts both again at ``seq``: a new
        pipeline, of the same arguments."""
        assert self._pipeline_args is not None
        self._stop_pieces()
        self._ended = None
        self._failed = False
        _before_threads()
        self._pipeline = _native.Pipeline(start_seq=seq, **self._pipeline_args)
        self.ring, self._path = self._pipeline.ring, self._pipeline.path
        self._start_loaders(*self._loader_args)

    def _convert(self, box: "list[_native.Batch]") -> Dict[str, Any]:
        b = box.pop()
        out = _to_framework(b.fields, self._as_numpy, self._stream)
        # The tensors hold the batch's buffer; the batch object need not.
        b.release()
        return out

    # -- checkpoints -----------------------------------------------------------------------

    def state_dict(self) -> Dict[str, int]:
        """Where the next batch comes from: ``{"seq": ..., "fingerprint": ...}``."""
        if self._ended is not None:
            return dict(self._ended)
        if self._consumer is None and self._resume is not None:
            return dict(self._resume)
        seq, fp = self._attach().state()
        return {"seq": seq, "fingerprint": fp}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        """Resumes at a saved state: the next batch is the one at ``state["seq"]``. A state
        saved under another plan (dataset or plan settings) is refused (``RefusedError``).
        With ``loaders=N`` the daemon and its loaders start again at that batch, so nothing
        before it is made again; attached, the consumer moves forward to it.
        """
        resume = checked_state(state)
        if self._loaders is not None or self._ended is not None:
            fingerprint = self._position()[1]
            if resume["fingerprint"] != fingerprint:
                raise _native.RefusedError(
                    f"the state to resume from was saved under another plan (fingerprint "
                    f"{resume['fingerprint']:#x}, this loader's is {fingerprint:#x}): the same "
                    "dataset, plan settings, rank and world_size are needed"
                )
            if resume["seq"] >= self._shape[2]:
                # Saved after the plan's last batch: nothing is left to make, so nothing runs.
                self._stop_pieces()
                self._ended = resume
                self._rest_of_state = True
                return
            self._restart_at(resume["seq"])
        # Where the loader stands now: where it stays if the ring cannot go to the state.
        here = self._resume
        if self._consumer is not None:
            seq, fingerprint = self._position()
            here = {"seq": seq, "fingerprint": fingerprint}
            self._detach()
        self._resume = resume
        try:
            self._attach()
        except _native.UsageError as e:
            self._resume = here
            if self._pipeline is None or here is None or resume["seq"] >= here["seq"]:
                raise
            batch = resume["seq"] // max(1, self._shape[1])
            raise self._cannot_go_back("load_state_dict", batch, e) from None
        self._rest_of_state = True

    # -- the end ---------------------------------------------------------------------------

    def close(self) -> Optional[Dict[str, Any]]:
        """Detaches; stops the loaders ``loaders=`` started and an embedded daemon, and returns
        the daemon's summary. Batches and tensors still alive stay valid, and keep the ring's
        consumer seat until they are gone."""
        if self._progress is not None:
            self._progress.end_epoch()  # a line left mid-epoch ends before what follows
        try:
            text = self._stop_pieces()
        except _native.PinringError:
            if self._failed:
                return None  # the loop has raised this failure already
            raise
        return json.loads(text) if text else None

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
