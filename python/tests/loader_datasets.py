"""Datasets for the ``pinring.torch.DataLoader`` tests. They live in a module of their own so
that spawned worker processes can import them by name."""

import collections
import os
import signal
import time

import numpy as np
import torch

Pair = collections.namedtuple("Pair", ["left", "right"])


class Mixed(torch.utils.data.Dataset):
    """Samples of every kind of field the default collate batches: a tuple holding a float32
    array, an int, a dict (bool and int16 arrays, a bf16 tensor), a float and a namedtuple of
    tensors. Every value is a function of the index."""

    def __init__(self, n=103):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        image = (np.arange(60, dtype=np.float32).reshape(3, 4, 5) + i * 100).astype(np.float32)
        extra = {
            "mask": np.array([(i >> b) & 1 for b in range(4)], dtype=bool),
            "small": np.array([i, -i], dtype=np.int16),
            "half": torch.full((2,), i / 8, dtype=torch.bfloat16),
        }
        pair = Pair(torch.tensor(i, dtype=torch.int32), torch.arange(3, dtype=torch.float64) * i)
        return image, i % 7, extra, i / 2, pair


class Ids(torch.utils.data.Dataset):
    """Sample i is the int64 tensor [i]: batches show the order."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor([i], dtype=torch.int64)


class KillsOnce(Ids):
    """Sample ``at`` kills its worker process the first time it is loaded (a marker file
    records that it did), as a segfault in a decoder would."""

    def __init__(self, n, at, marker):
        super().__init__(n)
        self.at, self.marker = at, marker

    def __getitem__(self, i):
        if i == self.at:
            try:
                fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.close(fd)
                os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(i)


class Raises(Ids):
    """Sample ``at`` raises ValueError."""

    def __init__(self, n, at):
        super().__init__(n)
        self.at = at

    def __getitem__(self, i):
        if i == self.at:
            raise ValueError(f"sample {i} is broken on purpose")
        return super().__getitem__(i)


class OutOfMemoryAt(Ids):
    """Sample ``at`` asks NumPy for 4 EiB, more than any process's address space (64 TiB was
    granted by a host that overcommits memory): NumPy's own MemoryError (``_ArrayMemoryError``,
    which cannot be built from a message); ``local=True`` raises a MemoryError subclass that
    cannot be pickled (defined in a function) instead."""

    def __init__(self, n, at, local=False):
        super().__init__(n)
        self.at, self.local = at, local

    def __getitem__(self, i):
        if i == self.at and self.local:
            class Local(MemoryError):
                pass

            raise Local(f"sample {i}: no memory for it")
        if i == self.at:
            np.empty(1 << 62, dtype=np.uint8)
        return super().__getitem__(i)


class Ragged(Ids):
    """Sample ``at`` has another shape."""

    def __init__(self, n, at):
        super().__init__(n)
        self.at = at

    def __getitem__(self, i):
        if i == self.at:
            return torch.zeros(3, dtype=torch.int64)
        return super().__getitem__(i)


class Nones(Ids):
    """A field that is None: torch's collate refuses it too."""

    def __getitem__(self, i):
        return super().__getitem__(i), None


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(3))


def stack_and_double(samples):
    """A collate_fn: a dict of the stacked ids and their doubles."""
    ids = torch.stack(samples)
    return {"ids": ids, "twice": ids * 2}


def no_batch_dim(samples):
    """A collate_fn whose output lacks the batch dimension."""
    return torch.tensor(len(samples))


class ExitsOnce(Ids):
    """Sample ``at`` ends its worker process with status 0 the first time it is loaded (a
    marker file records that it did), as a library calling ``os._exit(0)`` would."""

    def __init__(self, n, at, marker):
        super().__init__(n)
        self.at, self.marker = at, marker

    def __getitem__(self, i):
        if i == self.at and _mark(self.marker):
            os._exit(0)
        return super().__getitem__(i)


class OutlivesLease(Ids):
    """In the workers, the first load of sample ``at`` outlives the ring's lease: it returns
    only once another worker loads sample ``at`` again, which happens after the daemon took the
    part back and handed it out anew; so its worker's commit comes too late. That second load
    returns only once some worker loads another sample after the first load returned: once the
    worker whose commit was refused goes on with other parts (``at`` must be the last sample of
    its part, so that the next sample that worker loads is of a part it claimed after the
    refused commit). Each wait ends with TimeoutError
    after ``deadline`` seconds, so a worker that stopped makes the test fail instead of hang.
    The markers (files in the directory ``markers``) say how far it got."""

    def __init__(self, n, at, markers, deadline=30.0):
        super().__init__(n)
        self.at, self.markers, self.deadline = at, markers, deadline

    def _path(self, name):
        return os.path.join(self.markers, name)

    def _wait_for(self, name, what):
        end = time.monotonic() + self.deadline
        while not os.path.exists(self._path(name)):
            if time.monotonic() > end:
                raise TimeoutError(f"no {what} within {self.deadline} s")
            time.sleep(0.01)

    def __getitem__(self, i):
        from pinring.torch import get_worker_info

        if get_worker_info() is None:  # dataset[0] in the training process
            return super().__getitem__(i)
        if i == self.at:
            if _mark(self._path("first")):
                self._wait_for("second", f"second load of sample {i} (the part was not taken back)")
                _mark(self._path("first-returned"))
            elif _mark(self._path("second")):
                self._wait_for("after", "load of another sample (the late worker did not go on)")
        elif os.path.exists(self._path("first-returned")):
            _mark(self._path("after"))
        return super().__getitem__(i)


def _mark(path):
    """Creates the file ``path``; True if this call made it, False if it was there."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


class Hangs(torch.utils.data.Dataset):
    """Every sample but the first hangs in ``__getitem__`` (a remote read that never returns)
    in a worker; sample 0 (which the loader reads for its layout) and every sample in the
    process that made the dataset load."""

    def __init__(self, n, pid_dir=None):
        self.n = n
        self.owner = os.getpid()
        self.pid_dir = pid_dir  # where a hanging worker leaves a file named by its pid

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if os.getpid() != self.owner and i != 0:
            if self.pid_dir is not None:
                open(os.path.join(self.pid_dir, str(os.getpid())), "w").close()
            time.sleep(3600)
        return np.zeros(2, dtype=np.int64)


class TorchWorkerInfo(torch.utils.data.Dataset):
    """Sample i is [i, worker id, number of workers], as ``torch.utils.data.get_worker_info()``
    says them inside the worker that loads it (-1, 0 in the training process)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        if info is None:
            return torch.tensor([i, -1, 0], dtype=torch.int64)
        assert info.dataset is not self or info.num_workers > 0
        return torch.tensor([i, info.id, info.num_workers], dtype=torch.int64)


class Slow(Ids):
    """Every sample takes ``delay`` seconds to load."""

    def __init__(self, n, delay):
        super().__init__(n)
        self.delay = delay

    def __getitem__(self, i):
        time.sleep(self.delay)
        return super().__getitem__(i)


class NotInTheTrainer(Ids):
    """Refuses to load any sample in the process that made it (the training process), as a
    dataset whose samples wait on its workers, or open a per-process resource, would fail."""

    def __init__(self, n):
        super().__init__(n)
        self.trainer = os.getpid()

    def __getitem__(self, i):
        if os.getpid() == self.trainer:
            raise AssertionError(f"sample {i} loaded in the training process")
        return super().__getitem__(i)


class FirstSampleFails(Ids):
    def __getitem__(self, i):
        if i == 0:
            raise ValueError("sample 0 is broken")
        return super().__getitem__(i)


class WithEmpty(Ids):
    """Samples with arrays of no elements beside their values (a detection sample with no
    boxes, shape [0, 4]); sample ``at`` has one box instead."""

    def __init__(self, n, at=None):
        super().__init__(n)
        self.at = at

    def __getitem__(self, i):
        boxes = 1 if i == self.at else 0
        return {"id": super().__getitem__(i), "boxes": torch.zeros((boxes, 4)),
                "none": np.zeros(0, dtype=np.int32)}


class Captioned(Ids):
    """An image-like array, a caption of varying length (some of it not ASCII), a file name and
    raw bytes of varying length (as a JPEG file's);
    sample ``long`` has a caption of 1000 bytes."""

    def __init__(self, n, long=None):
        super().__init__(n)
        self.long = long

    def __getitem__(self, i):
        caption = "x" * 1000 if i == self.long else "a photo of " + "ünïcode " * (i % 5) + str(i)
        return {"image": np.full((2, 3), i, dtype=np.uint8), "caption": caption,
                "file": f"img_{i:04d}.jpg", "raw": bytes(range(i % 7)) + b"\xff\x00"}


class Shards(torch.utils.data.IterableDataset):
    """An iterable dataset split by ``get_worker_info()``: worker ``w`` yields ``lens[w]``
    samples (``n`` each without ``lens``), ``{"x": [w, i], "name": "w<w>-<i>", "r": a draw from
    torch's RNG}``, and with ``big`` a uint8 array of that many bytes (``w`` and ``i`` in its
    first two bytes). ``kill_at=(w, i)``: worker ``w`` kills itself (SIGKILL) before sample
    ``i``; ``raise_at=(w, i)``: it raises ``KeyError`` there; ``slow``: seconds each sample
    takes."""

    def __init__(self, n=10, lens=None, big=0, kill_at=None, raise_at=None, slow=0.0):
        self.n, self.lens, self.big = n, lens, big
        self.kill_at, self.raise_at, self.slow = kill_at, raise_at, slow

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        w = 0 if info is None else info.id
        n = self.n if self.lens is None else self.lens[w]
        for i in range(n):
            if self.kill_at == (w, i):
                os.kill(os.getpid(), signal.SIGKILL)
            if self.raise_at == (w, i):
                raise KeyError(f"no sample {i} in shard {w}")
            if self.slow:
                time.sleep(self.slow)
            sample = {"x": torch.tensor([w, i]), "name": f"w{w}-{i}", "r": torch.rand(())}
            if self.big:
                blob = torch.zeros(self.big, dtype=torch.uint8)
                blob[0], blob[1] = w, i
                sample["blob"] = blob
            yield sample


class SizedShards(Shards):
    def __len__(self):
        return 4 * self.n


class StatefulShards(Shards):
    """``Shards`` keeping torchdata's ``Stateful`` protocol: its state is the position in the
    worker's shard, and iterating starts there (so a loader that skipped the samples drawn
    before as well as loading the state would skip them twice)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.pos = 0

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, state):
        self.pos = state["pos"]

    def __iter__(self):
        start = self.pos
        for k, sample in enumerate(super().__iter__()):
            if k < start:
                continue
            self.pos = k + 1
            yield sample


class Tokens(torch.utils.data.Dataset):
    """Variable-length fields: sample ``i`` holds ``tokens`` (``3 + 7i % 13`` int64 ids from
    ``i``), ``boxes`` (``i % 4`` rows of 4 float32s, all ``i``: none for every fourth), a
    caption str, a label int and a fixed 2x2 float32 ``img``. ``kill=(path, at)``: sample
    ``at``'s first load kills its worker (SIGKILL), once (the marker file says it did);
    ``slow``: seconds each sample takes to load."""

    def __init__(self, n=50, kill=None, long_at=None, slow=0.0):
        self.n, self.kill, self.long_at, self.slow = n, kill, long_at, slow

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.kill is not None and i == self.kill[1]:
            try:
                fd = os.open(self.kill[0], os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.close(fd)
                os.kill(os.getpid(), signal.SIGKILL)
        if self.slow:
            time.sleep(self.slow)  # a load that takes time (decoding, a read)
        length = 100_000 if i == self.long_at else 3 + (i * 7) % 13
        return {"tokens": torch.arange(length, dtype=torch.int64) + i,
                "boxes": np.full((i % 4, 4), i, np.float32), "caption": f"sample {i}",
                "label": i, "img": np.full((2, 2), i, np.float32)}


def pad_tokens(batch):
    """A collate_fn that pads the batch's token ids to its longest, as NLP scripts do."""
    from torch.nn.utils.rnn import pad_sequence

    return {"tokens": pad_sequence([torch.as_tensor(b["tokens"]) for b in batch],
                                   batch_first=True, padding_value=-1),
            "lengths": torch.tensor([len(b["tokens"]) for b in batch]),
            "boxes": [torch.as_tensor(b["boxes"]) for b in batch],
            "caption": [b["caption"] for b in batch],
            "label": torch.tensor([b["label"] for b in batch])}


class TokenStream(torch.utils.data.IterableDataset):
    """``Tokens``' samples as a stream, split by worker."""

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        w, n = (0, 1) if info is None else (info.id, info.num_workers)
        samples = Tokens(30)
        for i in range(w, len(samples), n):
            yield samples[i]


class Barrier(torch.utils.data.Dataset):
    """Sample i is [i, the pid that loaded it]; every ``__getitem__`` waits until ``workers``
    calls have come (torch's test_worker_seed's dataset): a loader that reads a sample alone
    before its workers start never gets it. A call that waits ``wait`` seconds raises instead
    of hanging the test. Its shared counter needs the fork start method."""

    def __init__(self, n, workers, wait=60.0):
        import multiprocessing

        ctx = multiprocessing.get_context("fork")
        self.n, self.workers, self.wait = n, workers, wait
        self.count = ctx.Value("i", 0, lock=True)
        self.gate = ctx.Semaphore(0)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        with self.count.get_lock():
            self.count.value += 1
            if self.count.value == self.workers:
                self.gate.release()
        if not self.gate.acquire(timeout=self.wait):
            raise RuntimeError(f"sample {i}: the other workers never came to the barrier")
        self.gate.release()
        return torch.tensor([i, os.getpid()])


class Opens(Ids):
    """Opens a per-process resource at its first ``__getitem__`` (a database handle, an open
    archive): each opening leaves a file named by its pid in ``where``."""

    def __init__(self, n, where):
        super().__init__(n)
        self.where = where
        self.opened_in = None

    def __getitem__(self, i):
        if self.opened_in != os.getpid():
            self.opened_in = os.getpid()
            open(os.path.join(self.where, f"open-{os.getpid()}"), "w").close()
        return super().__getitem__(i)


class InitCounter:
    """A ``worker_init_fn`` that leaves a file per call in ``where``, named by worker and pid."""

    def __init__(self, where):
        self.where = where

    def __call__(self, worker_id):
        open(os.path.join(self.where, f"init-{worker_id}-{os.getpid()}"), "w").close()


class BarrierWorkerOneDies(Barrier):
    """``Barrier``, whose worker 1 is SIGKILLed in its first ``__getitem__``, before it comes:
    worker 0 waits at the barrier for a worker that will never come."""

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        if info is not None and info.id == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(i)
