"""``pinring.torch.DataLoader`` on the host backend (``device="cpu"``; with
``PINRING_TEST_DEVICE=cuda``, on a GPU): the same Dataset through
``torch.utils.data.DataLoader`` and through pinring gives the same batches; worker death,
exceptions in ``__getitem__``, wrong shapes, resuming from ``state_dict`` and rank sharding
behave as a training loop needs. Workers are real processes (forked, and spawned: each test
runs under both start methods) writing into a real ring, with a pinring daemon on a thread of
this process."""

import os
import re
import queue
import threading
import types
import uuid

import numpy as np

import pytest

torch = pytest.importorskip("torch")

import pinring  # noqa: E402
from pinring import _native  # noqa: E402
from pinring.torch import DataLoader  # noqa: E402
from pinring.torch._pool import WorkerPool  # noqa: E402

import loader_datasets as ds  # noqa: E402


def same(a, b, where="batch"):
    """Asserts that two collated batches have the same structure, types, dtypes and values."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.device == DEVICE, f"{where}: on {a.device}, not {DEVICE}"
        a = a.cpu()
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{list(a.shape)} != {b.dtype}{list(b.shape)}"
        assert torch.equal(a, b), f"{where}: values differ"
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            same(a[k], b[k], f"{where}[{k!r}]")
    else:
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")


def ids(batches):
    return [b.reshape(-1).tolist() for b in batches]


# The host backend in CI; PINRING_TEST_DEVICE=cuda runs the same tests on a GPU.
DEVICE = torch.device(os.environ.get("PINRING_TEST_DEVICE", "cpu"))
if DEVICE.type == "cuda" and DEVICE.index is None:
    DEVICE = torch.device("cuda", 0)


# The start method of the workers that ``loader`` makes: every test that uses it runs under
# ``fork`` (the default on Linux, the workers forked from a zygote that inherited the dataset)
# and under ``spawn`` (a spawned zygote that unpickled it once).
START = {"method": "fork"}


@pytest.fixture(autouse=True, params=["fork", "spawn"])
def start_method(request):
    START["method"] = request.param
    yield request.param
    START["method"] = "fork"


def loader(dataset, **kw):
    kw.setdefault("device", DEVICE)
    kw.setdefault("num_workers", 2)
    if kw["num_workers"] > 0:  # as torch's, a context only with worker processes
        kw.setdefault("multiprocessing_context", START["method"])
    return DataLoader(dataset, **kw)


# 0 workers: the loader's thread writes through torch views (its copies on torch's threads),
# workers through NumPy's; every kind of leaf either way.
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("drop_last", [False, True])
def test_the_same_batches_as_torch_without_shuffle(drop_last, workers):
    data = ds.Mixed(103)
    want = list(torch.utils.data.DataLoader(data, batch_size=8, drop_last=drop_last))
    with loader(data, batch_size=8, drop_last=drop_last, num_workers=workers) as pl:
        assert len(pl) == len(want) == (12 if drop_last else 13)
        got = list(pl)
        # A second epoch: the same batches again.
        again = list(pl)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        same(g, w, f"batch {i}")
    for i, (g, w) in enumerate(zip(again, want)):
        same(g, w, f"epoch 1 batch {i}")


@pytest.mark.parametrize("workers", [0, 2])
def test_collate_fn_runs_in_the_workers(workers):
    data = ds.Ids(50)
    want = list(torch.utils.data.DataLoader(data, batch_size=6, collate_fn=ds.stack_and_double))
    with loader(data, batch_size=6, collate_fn=ds.stack_and_double, num_workers=workers) as pl:
        got = list(pl)
    assert len(got) == len(want) == 9
    for i, (g, w) in enumerate(zip(got, want)):
        same(g, w, f"batch {i}")
    with pytest.raises(pinring.UsageError, match="first dimension"):
        len(loader(data, batch_size=6, collate_fn=ds.no_batch_dim))


def test_shuffle_gives_each_sample_once_per_epoch_reproducibly():
    n = 97
    with loader(ds.Ids(n), batch_size=10, shuffle=True, seed=5) as a:
        epochs_a = [ids(a) for _ in range(3)]
    for e in epochs_a:
        flat = [i for b in e for i in b]
        assert sorted(flat) == list(range(n)), "every sample once per epoch"
        assert [len(b) for b in e] == [10] * 9 + [7]
    assert epochs_a[0] != epochs_a[1] != epochs_a[2], "each epoch its own order"
    assert epochs_a[0] != [list(range(i, min(i + 10, n))) for i in range(0, n, 10)]
    # The same seed, another number of workers (and the thread of num_workers=0): the same order.
    with loader(ds.Ids(n), batch_size=10, shuffle=True, seed=5, num_workers=0) as b:
        assert [ids(b) for _ in range(3)] == epochs_a
    # set_epoch picks the epoch the next for yields, as DistributedSampler.set_epoch.
    with loader(ds.Ids(n), batch_size=10, shuffle=True, seed=5, num_workers=1) as c:
        c.set_epoch(2)
        assert ids(c) == epochs_a[2]
    # Another seed: another order. With no seed, torch's RNG decides, as for torch's sampler.
    with loader(ds.Ids(n), batch_size=10, shuffle=True, seed=6, num_workers=1) as d:
        assert ids(d) != epochs_a[0]
    torch.manual_seed(11)
    first = loader(ds.Ids(n), batch_size=10, shuffle=True).seed
    torch.manual_seed(11)
    assert loader(ds.Ids(n), batch_size=10, shuffle=True).seed == first


def test_a_dead_worker_is_restarted_and_its_batch_made_again(tmp_path):
    data = ds.KillsOnce(120, at=37, marker=str(tmp_path / "killed"))
    with loader(data, batch_size=8, num_workers=2) as pl:
        got = ids(pl)
        assert pl.worker_restarts == 1
    assert (tmp_path / "killed").exists(), "the worker was killed"
    assert got == [list(range(i, min(i + 8, 120))) for i in range(0, 120, 8)]


def test_a_worker_that_exits_0_mid_epoch_is_restarted(tmp_path, caplog):
    """A worker process that ends with status 0 while the ring still runs (a library calling
    os._exit(0)) is restarted like one that died: with a single worker, not noticing it would
    leave the loop waiting for ever (here: until the timeout fails the test)."""
    data = ds.ExitsOnce(40, at=13, marker=str(tmp_path / "exited"))
    with caplog.at_level("WARNING", logger="pinring.torch"):
        with loader(data, batch_size=4, num_workers=1, timeout=30) as pl:
            got = ids(pl)
            assert pl.worker_restarts == 1
    assert (tmp_path / "exited").exists(), "the worker exited"
    assert got == [list(range(i, i + 4)) for i in range(0, 40, 4)]
    assert "exited with status 0 while the ring still needed it" in caplog.text, caplog.text


class _RacingWorker:
    """A worker process, as the loop sees it (``exitcode()``), with its report queue: it sends
    ``report`` (none if None) and ends with status ``code`` right after the loop's first look
    at either, whichever the loop looks at first: the race between a worker's last report and
    its exit."""

    def __init__(self, report, code=0, worker_id=0):
        self.args = types.SimpleNamespace(worker_id=worker_id)
        self.pid = 4242
        self.report, self.end_code, self.code = report, code, None
        self.reports = queue.SimpleQueue()
        self.looked = False

    def _look(self, seen):
        if not self.looked:
            self.looked = True
            if self.report is not None:
                self.reports.put(self.report)
            self.code = self.end_code
        return seen

    def exitcode(self):
        return self._look(self.code)

    def stop(self, deadline):
        pass

    # The queue's side.
    def empty(self):
        return self._look(self.reports.empty())

    def get(self):
        return self.reports.get_nowait()


def racing(report, code=0, max_worker_restarts=3):
    """A loader (not started) whose one worker is a ``_RacingWorker``; ``spawned`` lists the
    ids of the workers it restarts."""
    pl = DataLoader(ds.Ids(8), num_workers=1, max_worker_restarts=max_worker_restarts,
                    device="cpu")
    w = _RacingWorker(report, code)
    pl._ring_name = "r"
    pl.spawned = []
    pl._pool = WorkerPool(
        lambda worker_id, reports, stop_flag: pl.spawned.append(worker_id) or _RacingWorker(None),
        w, None, ring_name="r", books=pl._books, lease_text=lambda: "daemon.lease_ms",
    )
    pl._pool.workers = [w]
    return pl


def test_a_report_sent_as_its_worker_exits_is_read_with_the_exit():
    """A worker that reports and exits between the loop's look at the reports and its look at
    the exit codes is not taken for a worker that left with no report: exit codes are read
    first, so its report is read at the same look."""
    pl = racing((0, "error", 3, ValueError, "Caught ValueError: sample 3 is broken"),
                max_worker_restarts=0)
    with pytest.raises(ValueError, match="sample 3 is broken"):
        pl._check_workers()
    assert pl.spawned == [] and pl.worker_restarts == 0
    pl = racing((0, "done", -1, None, ""))
    pl._check_workers()
    pl._check_workers(idle=True)
    assert pl.spawned == [] and pl._pool.done == {0}, "a worker that saw the plan end stays ended"


def test_a_worker_the_ring_failed_under_is_not_restarted():
    """A worker whose claim failed because the ring did (its daemon gone) is not restarted:
    the loop's own wait fails the same way; and once the loop waits in vain with no worker
    left, the worker's report is raised."""
    report = (0, "ring", -1, pinring.PeerDied, "PeerDied: the daemon of ring 'r' is gone")
    pl = racing(report)
    pl._check_workers()
    pl._check_workers()
    assert pl.spawned == [] and pl.worker_restarts == 0
    with pytest.raises(pinring.PeerDied) as e:
        pl._check_workers(idle=True)
    text = str(e.value)
    assert "worker 0 ended because ring 'r' failed under its claim" in text, text
    assert "PeerDied: the daemon of ring 'r' is gone" in text and "still runs" not in text, text


def test_a_worker_that_exits_0_or_dies_is_named_with_the_fix():
    pl = racing(None, code=0, max_worker_restarts=0)
    pl._check_workers()  # the worker ends after this first look
    with pytest.raises(pinring.PeerDied) as e:
        pl._check_workers()
    text = str(e.value)
    assert "worker 0 exited with status 0 while the ring still needed it" in text, text
    assert "os._exit()" in text and "remove the call that ends it" in text, text
    assert "crashes the interpreter" not in text and "num_workers=0" not in text, text
    pl = racing(None, code=-9, max_worker_restarts=0)
    pl._check_workers()
    with pytest.raises(pinring.PeerDied) as e:
        pl._check_workers()
    text = str(e.value)
    assert "worker 0 was killed by SIGKILL" in text and "num_workers=0" in text, text
    assert re.search(r"DataLoader worker \(pid \d+\) is killed by signal: Killed", text), text


class _Field:
    """A part's field over a NumPy array."""

    dtype = "i64"

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kw):
        return self.array.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


class _Part:
    def __init__(self, seq, error):
        self.seq = self.batch = seq
        self.indices = [2 * seq, 2 * seq + 1]
        self.fields = {"sample": _Field(np.zeros((2, 1), dtype=np.int64))}
        self.error = error

    def commit(self):
        if self.error is not None:
            raise self.error


def test_only_a_reclaimed_commit_lets_the_worker_go_on(monkeypatch):
    """A commit refused with ``PartReclaimed`` (the lease ran out) is reported as a part taken
    back and the worker goes on claiming; any other ``RingError`` of a commit (a part too large
    for its slot) is the worker's error, raised in the loop."""
    assert issubclass(pinring.PartReclaimed, pinring.RingError)
    assert pinring.PartReclaimed.exit_code == pinring.RingError.exit_code == 4
    parts = [
        _Part(0, pinring.PartReclaimed("slot 0 (seq 0) was reclaimed by the daemon")),
        _Part(1, None),
        _Part(2, pinring.RingError("slot 2: payload of 16 bytes ... does not fit in 8 bytes")),
        _Part(3, None),
    ]

    class Producer:
        def __init__(self, ring, wait, path=None, peers=None):
            pass

        def claim(self, timeout):
            return parts.pop(0) if parts else None

        def close(self):
            pass

    monkeypatch.setattr(pinring.torch._worker._native, "Producer", Producer)
    pl = DataLoader(ds.Ids(8), num_workers=0, device="cpu")
    args = pinring.torch._worker._WorkerArgs(
        ring=pinring._native.RingTicket("r"), dataset=pl.dataset, layout=pl._infer(), collate_fn=None,
        worker_init_fn=None, worker_id=0, num_workers=0, seed=0, wait=1.0,
    )
    reports = queue.SimpleQueue()
    pinring.torch._worker._worker_main(args, reports, threading.Event())
    got = []
    while not reports.empty():
        got.append(reports.get_nowait())
    assert [(r[1], r[3]) for r in got] == [("reclaimed", None), ("error", pinring.RingError)], got
    assert "part 0 (batch 0, 2 samples from sample 0)" in got[0][4], got[0][4]
    assert "does not fit in 8 bytes" in got[1][4], got[1][4]
    assert [p.seq for p in parts] == [3], "the worker ended at the refused commit"


def test_ring_leaves_the_users_rng_alone():
    """With ``ring=`` the ring's seed is used: no seed is drawn from ``generator`` or torch's
    RNG (without ``ring=`` one is, as torch's RandomSampler)."""
    g = torch.Generator().manual_seed(3)
    before, global_before = g.get_state(), torch.get_rng_state()
    DataLoader(ds.Ids(8), ring="no-such-ring", generator=g)
    DataLoader(ds.Ids(8), ring="no-such-ring")
    assert torch.equal(g.get_state(), before) and torch.equal(torch.get_rng_state(), global_before)
    DataLoader(ds.Ids(8), generator=g)
    assert not torch.equal(g.get_state(), before), "without ring=, the seed is drawn"


def test_a_part_that_outlives_its_lease_is_made_again_and_its_worker_goes_on(tmp_path, caplog):
    """A worker whose part takes longer than the lease (lease_ms) has its commit refused: the
    daemon took the part back and another worker made it. The late worker goes on with other
    parts (the dataset's second load of the sample waits for that), the loop logs which part,
    and the epoch has every batch once, in order."""
    data = ds.OutlivesLease(64, at=23, markers=str(tmp_path))  # the last sample of batch 5
    with caplog.at_level("WARNING", logger="pinring.torch"):
        # One epoch: sample 23 is loaded a second time only when its part is handed out anew.
        with loader(data, batch_size=4, num_workers=2, lease_ms=1500, epochs=1, timeout=60) as pl:
            got = ids(pl)
            assert pl.worker_restarts == 0, "no worker left"
            # The lease the daemon runs with: its resolved config, as its consumer reads it.
            assert pl._ring_settings[("daemon", "lease_ms")] == 1500
    assert got == [list(range(i, i + 4)) for i in range(0, 64, 4)]
    assert (tmp_path / "after").exists(), "the late worker went on"
    assert "longer than the ring's lease (daemon.lease_ms = 1500 ms)" in caplog.text, caplog.text
    assert "samples from sample 20" in caplog.text, caplog.text
    with pytest.raises(pinring.UsageError, match="lease_ms=5"):
        loader(ds.Ids(8), lease_ms=5)


def test_prefetch_sets_the_device_batch_buffers():
    """prefetch= (or prefetch_factor × num_workers) is the number of batch buffers: a loop that
    keeps more batches than that has the oldest copied out of the ring (a warning naming the
    count); one that keeps views of all of them, which cannot be moved, gets an error naming the
    count at the next batch; a loop that lets them go runs through."""
    cases = (({"prefetch": 3, "num_workers": 0}, 3), ({"prefetch_factor": 2, "num_workers": 2}, 4))
    for kw, buffers in cases:
        with loader(ds.Ids(40), batch_size=4, **kw) as pl:
            with pytest.warns(UserWarning, match=f"keeps all {buffers} batch buffers"):
                kept = list(pl)
            assert ids(kept) == [list(range(i, i + 4)) for i in range(0, 40, 4)]
            del kept
        with loader(ds.Ids(40), batch_size=4, **kw) as pl:
            views = []
            with pytest.raises(pinring.UsageError, match=f"holds all {buffers} batch buffers"):
                for b in pl:
                    views.append(b[1:])
            assert len(views) == buffers
            del views, b
    with loader(ds.Ids(40), batch_size=4, prefetch=3, num_workers=0) as pl:
        assert len(ids(b.clone() for b in pl)) == 10, "batches not kept: the buffers come back"
    with loader(ds.Ids(40), batch_size=4, prefetch=12, num_workers=0) as pl:
        assert len(list(pl)) == 10


def test_an_exception_in_getitem_reaches_the_loop_with_its_traceback():
    with loader(ds.Raises(64, at=13), batch_size=4) as pl:
        with pytest.raises(ValueError) as e:
            for _ in pl:
                pass
    text = str(e.value)
    assert "sample 13 is broken on purpose" in text
    assert "Original Traceback" in text and "loader_datasets.py" in text, text
    assert "while loading sample 13" in text, text


@pytest.mark.parametrize("local", [False, True])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_workers_memory_error_reaches_the_loop_as_memory_error(num_workers, local):
    """A builtin exception type is kept when the worker's own type cannot be rebuilt from a
    message (NumPy's MemoryError takes a shape and a dtype) or cannot be pickled: the loop
    raises its nearest builtin base, with the worker's traceback (it was RuntimeError)."""
    with loader(ds.OutOfMemoryAt(64, at=13, local=local), batch_size=4,
                num_workers=num_workers) as pl:
        with pytest.raises(MemoryError) as e:
            for _ in pl:
                pass
    text = str(e.value)
    assert "while loading sample 13" in text and "Original Traceback" in text, text
    assert ("no memory for it" if local else "Unable to allocate 4.00 EiB") in text, text


def test_a_sample_of_another_shape_is_named_with_both_shapes():
    with loader(ds.Ragged(40, at=21), batch_size=4) as pl:
        with pytest.raises(pinring.UsageError) as e:
            list(pl)
    text = str(e.value)
    assert "sample 21" in text and "[3]" in text and "[1]" in text, text


def test_resume_from_state_dict():
    data = ds.Ids(90)
    kw = dict(batch_size=7, shuffle=True, seed=3)
    with loader(data, **kw) as ref:
        full = [ids(ref), ids(ref)]
    with loader(data, **kw) as a:
        it = iter(a)
        first = [next(it).reshape(-1).tolist() for _ in range(5)]
        state = a.state_dict()
        del it
    assert first == full[0][:5]
    b = loader(data, **kw)
    with pytest.raises(pinring.UsageError, match="not running"):
        b.state_dict()
    b.load_state_dict(state)
    try:
        assert ids(b) == full[0][5:], "the rest of the epoch"
        assert ids(b) == full[1], "then the next epoch"
    finally:
        b.close()
    # A state of another plan is refused.
    c = loader(data, batch_size=9, shuffle=True, seed=3)
    c.load_state_dict(state)
    with pytest.raises(pinring.RefusedError, match="another plan"):
        list(c)
    c.close()


def test_a_state_saved_after_the_last_batch_resumes_to_nothing():
    # A job killed after its last batch and started again: no daemon, no worker, an empty for.
    data = ds.Ids(20)
    with loader(data, batch_size=4, epochs=1) as a:
        assert len(ids(a)) == 5
        state = a.state_dict()
    with loader(data, batch_size=4, epochs=1) as b:
        b.load_state_dict(state)
        assert list(b) == [], "the rest of the saved epoch: nothing"
        assert b._daemon is None and b.state_dict() == state
        # A for after it would be an epoch past the plan: said, not an empty epoch.
        with pytest.raises(pinring.UsageError, match=r"covers 1 epochs \(epochs=1\)"):
            list(b)


def test_epochs_have_no_end_unless_set_and_a_for_past_those_set_names_them():
    with loader(ds.Ids(12), batch_size=4) as pl:
        assert [len(ids(pl)) for epoch in range(4)] == [3] * 4
    with loader(ds.Ids(12), batch_size=4, epochs=2) as pl:
        assert [len(ids(pl)) for epoch in range(2)] == [3, 3]
        with pytest.raises(pinring.UsageError) as e:
            list(pl)
    text = str(e.value)
    assert "this for would be epoch 2" in text and "covers 2 epochs (epochs=2)" in text, text
    assert "leave it out for a plan without end" in text, text


def test_a_loop_left_mid_epoch_starts_the_next_epoch():
    with loader(ds.Ids(40), batch_size=4, shuffle=True, seed=1) as ref:
        full = [ids(ref), ids(ref)]
    with loader(ds.Ids(40), batch_size=4, shuffle=True, seed=1) as pl:
        for i, _ in enumerate(pl):
            if i == 2:
                break
        assert ids(pl) == full[1]


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_get_disjoint_shards_that_cover_the_dataset(world):
    n = 60
    seen = []
    for rank in range(world):
        sampler = torch.utils.data.DistributedSampler(
            ds.Ids(n), num_replicas=world, rank=rank, shuffle=True, seed=9
        )
        with loader(ds.Ids(n), batch_size=5, sampler=sampler, num_workers=1) as pl:
            assert len(pl) == n // world // 5
            seen.append([i for b in ids(pl) for i in b])
    for r in range(world):
        assert len(seen[r]) == n // world
        for q in range(r):
            assert not set(seen[r]) & set(seen[q]), f"ranks {q} and {r} share samples"
    assert sorted(i for s in seen for i in s) == list(range(n))


def test_what_pinring_cannot_batch_is_refused_clearly():
    with pytest.raises(pinring.UsageError, match=r"\[1\] of dataset\[0\] is a NoneType"):
        len(loader(ds.Nones(10), batch_size=2))
    with pytest.raises(pinring.UsageError, match="a generator is neither"):
        loader((i for i in range(3)), batch_size=2)
    with pytest.raises(pinring.UsageError, match="batch 1 of epoch 0 holds 3 samples"):
        len(loader(ds.Ids(10), batch_sampler=[[0, 1], [2, 3, 4], [5, 6]]))
    with pytest.raises(pinring.UsageError, match=r"\['fork', 'spawn', 'forkserver'\]"):
        loader(ds.Ids(10), multiprocessing_context="threads")


def test_an_attached_daemon_with_the_datasets_fields(tmp_path):
    """``ring=``: the workers fill the ring of a pinring-daemon service; its config declares the
    fields the dataset's samples have, and a ring with other fields is refused."""
    import subprocess

    from test_consumer import binary

    data = ds.Ids(48)
    name = f"py-{uuid.uuid4().hex[:10]}"
    config = tmp_path / "pinring.toml"
    config.write_text(
        f'[ring]\nname = "{name}"\n[dataset]\nkind = "external"\nsamples = 48\n'
        'fields = [{ name = "sample", dtype = "i64", shape = [1] }]\n'
        "[plan]\nbatch_size = 6\nshuffle = false\nepochs = 2\n"
    )
    daemon = subprocess.Popen(
        [*binary("pinring-daemon"), "--config", str(config), "--backend", "host", "--sink", "consumer"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        # The ring's resolved config, read by pinring's own parser as tomllib reads it.
        c = pinring.Consumer(name, wait_for_ring=30)
        text = c.config
        c.close()
        lines = pinring._native.config_settings(text)
        assert lines[("plan", "batch_size")] == 6 and lines[("plan", "shuffle")] is False
        assert lines[("ring", "name")] == name and lines[("daemon", "lease_ms")] == 30000
        try:
            import tomllib
        except ImportError:
            tomllib = None  # Python < 3.11: nothing to compare with
        if tomllib is not None:
            read = {
                (section, key): value
                for section, table in tomllib.loads(text).items() if isinstance(table, dict)
                for key, value in table.items() if isinstance(value, (bool, int, float, str))
            }
            assert lines == read
        # What is left out comes from the ring; what is passed must agree with it.
        with loader(data, ring=name, device=None) as pl:
            assert len(pl) == 8
            assert (pl.batch_size, pl.shuffle, pl.epochs, pl.lease_ms) == (6, False, 2, 30000)
            assert pl.seed == lines[("plan", "seed")], "the ring's seed, not a draw"
            got = list(pl)
            assert ids(got) == [list(range(i, i + 6)) for i in range(0, 48, 6)]
            assert {b.device for b in got} == {torch.device("cpu")}, "where the ring delivers"
            del got  # the ring's buffers back: the next loader is the ring's consumer
        with pytest.raises(pinring.UsageError, match=(
            r"ring '.*' was started with other settings than this DataLoader was given.*"
            r"batch_size=8, but the ring's plan.batch_size is 6: pass batch_size=6 or leave it "
            r"out to take the ring's"
        )):
            len(loader(data, batch_size=8, ring=name, device=None))
        with pytest.raises(pinring.UsageError) as e:
            len(loader(data, batch_size=6, shuffle=True, drop_last=True, seed=3, prefetch=4,
                       in_order=False, epochs=5, lease_ms=1000, ring=name, device=None))
        text = str(e.value)
        for said in ("shuffle=True, but the ring's plan.shuffle is False: pass shuffle=False",
                     "drop_last=True, but", "seed=3, but", "epochs=5, but the ring's plan.epochs is 2",
                     "in_order=False, but the ring's ring.in_order is True",
                     "prefetch=4, but the ring's daemon.prefetch is not set (pinring's default): "
                     "leave it out", "lease_ms=1000, but the ring's daemon.lease_ms is 30000"):
            assert said in text, text
        assert "batch_size" not in text, "an argument that agrees is not named"
        sampler = torch.utils.data.DistributedSampler(data, num_replicas=2, rank=1, shuffle=False)
        with pytest.raises(pinring.UsageError, match=(
            "the DistributedSampler's rank is 1, but the ring's plan.rank is 0: pass a sampler "
            "whose rank is 0, or leave sampler out"
        )):
            len(loader(data, sampler=sampler, ring=name, device=None))
        with pytest.raises(pinring.UsageError, match="prefetch_factor=2 asks for prefetch=4"):
            len(loader(data, prefetch_factor=2, num_workers=2, ring=name, device=None))
        if torch.cuda.is_available():
            with pytest.raises(pinring.UsageError, match=(
                "device='cuda:0' .*, but the ring delivers to cpu: pass device='cpu' or leave "
                "device out"
            )):
                len(loader(data, device="cuda:0", ring=name))
        else:  # CUDA asked for where there is none: said at once, with the fix
            with pytest.raises(pinring.BackendError, match='pass device="cpu"'):
                loader(data, device="cuda:0", ring=name)
        with pytest.raises(pinring.UsageError, match=(
            "the dataset has 50 samples, but the ring's dataset.samples is 48"
        )):
            list(loader(ds.Ids(50), ring=name, device=None))
        with pytest.raises(pinring.RefusedError, match="fields"):
            list(loader(ds.Mixed(48), batch_size=6, ring=name, device=None))
        # Another training process on the same ring goes on where the first one stopped: the
        # ring's second epoch.
        with loader(data, batch_size=6, ring=name, device=None) as pl:
            assert ids(pl) == [list(range(i, i + 6)) for i in range(0, 48, 6)]
            with pytest.raises(pinring.UsageError, match=r"runs 2 epochs \(plan.epochs = 2\)"):
                ids(pl)  # the ring's plan has two epochs: a third is said, not empty
    finally:
        daemon.terminate()
        daemon.wait(30)
    # pinring-loader cannot make external samples, and the verify sink cannot check them: both
    # say so and exit 3.
    out = subprocess.run(
        [*binary("pinring-loader"), "--config", str(config), "--wait-secs", "1"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 3 and "Python producers" in out.stderr, out.stderr
    out = subprocess.run(
        [*binary("pinring-daemon"), "--config", str(config), "--backend", "host", "--sink", "verify"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 3 and "no reference" in out.stderr, out.stderr
