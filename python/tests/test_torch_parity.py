"""``pinring.torch.DataLoader`` behaves as ``torch.utils.data.DataLoader`` where scripts rely
on it: the exception types torch raises, ``DataLoader[T]`` in annotations, attributes that may
not be assigned after construction, the warning for more workers than CPUs, torch's own
``get_worker_info()`` inside the workers, a state that loads into a loader made the same way,
and a word about pickling where the start method needs it."""

import os
import select
import warnings

import pytest

torch = pytest.importorskip("torch")

import pinring  # noqa: E402
from pinring.torch import DataLoader  # noqa: E402

import loader_datasets as ds  # noqa: E402


def loader(dataset, **kw):
    kw.setdefault("device", "cpu")
    kw.setdefault("num_workers", 2)
    return DataLoader(dataset, **kw)


def test_a_bad_argument_is_the_value_error_torch_raises():
    for bad in (dict(batch_size=0), dict(num_workers=-1), dict(timeout=-1),
                dict(shuffle=True, sampler=torch.utils.data.SequentialSampler(range(4)))):
        with pytest.raises(ValueError) as e:
            loader(ds.Ids(8), **bad)
        assert isinstance(e.value, pinring.UsageError), bad
        assert isinstance(e.value, TypeError), "torch raises TypeError for some arguments too"
        assert e.value.exit_code == 2


@pytest.mark.parametrize("bad", [
    dict(num_workers=-1), dict(timeout=-1), dict(num_workers=0, multiprocessing_context="fork"),
    dict(num_workers=1, multiprocessing_context="bad"),
    dict(num_workers=1, multiprocessing_context=object()),
    dict(shuffle=True, sampler=torch.utils.data.SequentialSampler(range(8))),
    # torch names the sampler's clash with shuffle before the batch_sampler's with both.
    dict(shuffle=True, sampler=torch.utils.data.SequentialSampler(range(8)),
         batch_sampler=torch.utils.data.BatchSampler(range(8), 3, False)),
])
def test_a_bad_argument_says_what_torchs_says(bad):
    """Scripts and tests match torch's words; pinring's message starts with them."""
    with pytest.raises((ValueError, TypeError)) as theirs:
        torch.utils.data.DataLoader(ds.Ids(8), **bad)
    with pytest.raises(type(theirs.value)) as ours:
        loader(ds.Ids(8), **bad)
    said = str(theirs.value).split(";")[0].split(", but got")[0]
    assert said in str(ours.value), (said, str(ours.value))


def test_a_timeout_is_the_runtime_error_torch_raises():
    with loader(ds.Slow(8, delay=5.0), batch_size=4, timeout=0.3) as dl:
        with pytest.raises(RuntimeError) as e:
            next(iter(dl))
    assert isinstance(e.value, pinring.Timeout)
    assert "timeout=0.3" in str(e.value)
    assert str(e.value).startswith("DataLoader timed out after 0.3 seconds"), "torch's words"
    assert issubclass(pinring.PeerDied, RuntimeError)


def test_the_class_is_generic_as_torchs():
    alias = DataLoader[torch.Tensor]
    assert alias.__origin__ is DataLoader

    def annotated(dl: "DataLoader[int]") -> int:
        return 0

    assert annotated.__annotations__["dl"] == "DataLoader[int]"


@pytest.mark.parametrize("attr", ["batch_size", "sampler", "batch_sampler", "drop_last",
                                  "dataset", "persistent_workers"])
def test_the_plans_attributes_are_refused_after_construction(attr):
    dl = loader(ds.Ids(8), batch_size=2)
    with pytest.raises(ValueError, match=f"{attr} attribute should not be set after"):
        setattr(dl, attr, 3)
    assert dl.batch_size == 2
    dl.timeout = 5.0  # not a plan's: allowed, as in torch
    assert dl.timeout == 5.0


def test_more_workers_than_cpus_warns_as_torch_does():
    cpus = len(os.sched_getaffinity(0))
    with pytest.warns(UserWarning, match=f"suggested max number of worker in current system is {cpus}"):
        loader(ds.Ids(8), num_workers=cpus + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader(ds.Ids(8), num_workers=cpus)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_torchs_get_worker_info_is_set_in_the_workers(method):
    with loader(ds.TorchWorkerInfo(24), batch_size=3, multiprocessing_context=method) as dl:
        rows = torch.cat(list(dl)).tolist()
    assert sorted(r[0] for r in rows) == list(range(24))
    assert {r[2] for r in rows} == {2}, "num_workers as torch's WorkerInfo says it"
    assert {r[1] for r in rows} <= {0, 1} and -1 not in {r[1] for r in rows}
    assert torch.utils.data.get_worker_info() is None, "None in the training process"


def test_an_unshuffled_loaders_state_loads_into_one_made_the_same_way():
    data = ds.Ids(40)
    torch.manual_seed(1)
    with loader(data, batch_size=4) as a:
        it = iter(a)
        first = [next(it).reshape(-1).tolist() for _ in range(3)]
        state = a.state_dict()
        del it
    assert first == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    torch.manual_seed(2)  # another RNG state: no seed of the plan depends on it
    with loader(data, batch_size=4) as b:
        b.load_state_dict(state)
        rest = [x.reshape(-1).tolist() for x in b]
    assert rest[0] == [12, 13, 14, 15] and len(rest) == 7


def _local_worker_init_fn_loader():
    def init(worker_id):
        pass

    return loader(ds.Ids(8), batch_size=2, worker_init_fn=init,
                  multiprocessing_context="forkserver")


def test_an_unpicklable_worker_init_fn_is_named_with_the_fix():
    dl = _local_worker_init_fn_loader()
    with pytest.raises(AttributeError) as e:  # pickle's own type, as under torch
        list(dl)
    dl.close()
    text = str(e.value)
    assert "could not pickle its worker_init_fn" in text, text
    assert "top level" in text and "multiprocessing_context='fork'" in text, text


def test_a_loop_may_keep_more_batches_than_the_ring_has_buffers():
    # torch lets a script keep every batch (an evaluation collecting its outputs): past the
    # ring's buffers, the oldest kept batches are copied out of it, said once.
    with loader(ds.Ids(64), batch_size=4, prefetch=2, num_workers=1) as dl:
        with pytest.warns(UserWarning, match="copied out of the ring") as caught:
            kept = list(dl)
        assert len([w for w in caught if "copied out" in str(w.message)]) == 1
        assert [b.reshape(-1).tolist() for b in kept] == [
            list(range(i, i + 4)) for i in range(0, 64, 4)
        ]
        kept2 = [b for b in dl]  # the next epoch, the same way
        assert torch.equal(torch.cat(kept2), torch.cat(kept))


def test_a_plain_loop_copies_nothing():
    with loader(ds.Ids(64), batch_size=4, prefetch=2, num_workers=1) as dl:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            total = sum(int(b.sum()) for b in dl)
    assert total == sum(range(64))


def _batches(dl, epochs=3):
    return [[b.reshape(-1).tolist() for b in dl] for _ in range(epochs)]


def _samplers(n):
    """Samplers pinring's plan cannot express, each made twice alike (the same seed)."""
    g = lambda: torch.Generator().manual_seed(7)  # noqa: E731
    data = ds.Ids(n)
    return {
        "replacement": lambda: torch.utils.data.RandomSampler(
            data, replacement=True, num_samples=n // 2 + 3, generator=g()),
        "num_samples": lambda: torch.utils.data.RandomSampler(
            data, num_samples=n + 5, generator=g()),
        "subset": lambda: torch.utils.data.SubsetRandomSampler(range(3, n, 2), generator=g()),
        "weighted": lambda: torch.utils.data.WeightedRandomSampler(
            [1.0 + (i % 3) for i in range(n)], n - 4, generator=g()),
        "range": lambda: range(5, n - 2),
        "list": lambda: [n - 1 - i for i in range(n)],
        "sequential_of_a_part": lambda: torch.utils.data.SequentialSampler(range(n // 2)),
    }


@pytest.mark.parametrize("kind", list(_samplers(1)))
def test_any_sampler_gives_torchs_batches(kind):
    n = 26
    make = _samplers(n)[kind]
    data = ds.Ids(n)
    want = _batches(torch.utils.data.DataLoader(data, batch_size=4, sampler=make()))
    with loader(data, batch_size=4, sampler=make()) as dl:
        assert len(dl) == len(want[0])
        assert _batches(dl) == want


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_batch_sampler_gives_torchs_batches(method):
    data = ds.Ids(30)

    def make():
        inner = torch.utils.data.RandomSampler(data, generator=torch.Generator().manual_seed(3))
        return torch.utils.data.BatchSampler(inner, batch_size=4, drop_last=False)

    want = _batches(torch.utils.data.DataLoader(data, batch_sampler=make()))
    with loader(data, batch_sampler=make(), multiprocessing_context=method) as dl:
        assert dl.batch_size is None and len(dl) == 8
        assert _batches(dl) == want


def test_a_distributed_sampler_padding_its_shard_with_the_loader_dropping_its_last_batch():
    data = ds.Ids(23)
    for rank in range(3):
        def make():
            return torch.utils.data.DistributedSampler(
                data, num_replicas=3, rank=rank, shuffle=True, seed=4, drop_last=False)

        ref = make()
        want = []
        for epoch in range(2):
            ref.set_epoch(epoch)
            want.append([b.reshape(-1).tolist() for b in torch.utils.data.DataLoader(
                data, batch_size=3, sampler=ref, drop_last=True)])
        with loader(data, batch_size=3, sampler=make(), drop_last=True) as dl:
            got = [[b.reshape(-1).tolist() for b in dl] for _ in range(2)]
        assert got == want, f"rank {rank}"


def test_batch_size_none_yields_each_sample_as_torch_converts_it():
    data = ds.Mixed(9)
    want = list(torch.utils.data.DataLoader(data, batch_size=None))
    with loader(data, batch_size=None) as dl:
        got = list(dl)
    assert len(got) == len(want) == 9

    def same(a, b, where):
        assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
        if isinstance(a, torch.Tensor):
            assert a.dtype == b.dtype and torch.equal(a, b), where
        elif isinstance(a, dict):
            assert list(a) == list(b), where
            for k in a:
                same(a[k], b[k], f"{where}[{k!r}]")
        elif isinstance(a, (list, tuple)):
            assert len(a) == len(b), where
            for i, (x, y) in enumerate(zip(a, b)):
                same(x, y, f"{where}[{i}]")
        else:
            assert a == b, where

    for i, (a, b) in enumerate(zip(got, want)):
        same(a, b, f"sample {i}")
    with pytest.raises(ValueError, match="mutually exclusive with drop_last"):
        loader(data, batch_size=None, drop_last=True)


def test_a_sampler_that_leaves_the_dataset_or_changes_length_is_named():
    with pytest.raises(ValueError, match=r"index 12 \(position 2 of epoch 0\).*holds 10 samples"):
        len(loader(ds.Ids(10), sampler=[0, 1, 12]))

    class Growing(torch.utils.data.Sampler):
        def __init__(self):
            self.calls = 0

        def __iter__(self):
            self.calls += 1
            return iter(range(4 + self.calls))

    with loader(ds.Ids(10), batch_size=2, sampler=Growing(), num_workers=1) as dl:
        with pytest.raises(ValueError, match="yielded 6 samples for epoch 1, where it yielded 5"):
            for _ in range(3):
                list(dl)
    with pytest.raises(ValueError, match="cannot draw it"):
        loader(ds.Ids(10), sampler=[1, 2], ring="some-ring")


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_the_training_process_runs_no_getitem_when_there_are_workers(method):
    data = ds.NotInTheTrainer(20)
    with loader(data, batch_size=4, multiprocessing_context=method) as dl:
        assert len(dl) == 5
        assert [b.reshape(-1).tolist() for b in dl][0] == [0, 1, 2, 3]
    with pytest.raises(AssertionError, match="loaded in the training process"):
        list(loader(data, batch_size=4, num_workers=0))  # no workers: this process loads


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("workers", [1, 4])
def test_a_dataset_whose_getitem_waits_for_every_worker_starts(workers):
    """torch's test_worker_seed dataset: each __getitem__ waits until every worker is inside
    one. The layout comes from worker 0's first sample, read while the other workers read
    theirs, so the barrier opens; every sample comes once, loaded in a worker."""
    data = ds.Barrier(16, workers)
    with loader(data, batch_size=2, num_workers=workers, timeout=120) as dl:
        got = torch.cat(list(dl))
    assert sorted(got[:, 0].tolist()) == list(range(16))
    assert os.getpid() not in got[:, 1].tolist()
    assert len(set(got[:, 1].tolist())) <= workers


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_each_worker_opens_its_resource_once_and_runs_worker_init_fn_once(tmp_path):
    """A dataset that opens a per-process resource in its first __getitem__, and a
    worker_init_fn: each runs at most once per worker, in the process that keeps the resource
    (the layout is learned by worker 0 itself, not by a process of its own)."""
    data = ds.Opens(24, str(tmp_path))
    with loader(data, batch_size=2, num_workers=3,
                worker_init_fn=ds.InitCounter(str(tmp_path))) as dl:
        assert sorted(int(b[0]) for b in dl) == list(range(0, 24, 2))
    # Workers claim parts as they are free: a slow one may not have run worker_init_fn before
    # the epoch ended and the loader stopped it. What holds: never twice for a worker, worker 0
    # always (its first samples give the layout), the resource only in a worker that ran it.
    files = os.listdir(tmp_path)
    inits = sorted(f for f in files if f.startswith("init-"))
    ids = [f.split("-")[1] for f in inits]
    opened = {f.split("-")[1] for f in files if f.startswith("open-")}
    assert len(ids) == len(set(ids)) and "0" in ids and set(ids) <= {"0", "1", "2"}, inits
    assert opened and opened <= {f.split("-")[2] for f in inits}, (opened, inits)


def test_a_worker_that_dies_before_the_layout_comes_is_named_at_once():
    """Worker 1 is killed in its first sample while worker 0 waits for it at a barrier: the
    start raises torch's RuntimeError naming worker 1, where it would wait for the barrier's
    own deadline (then worker 0's error, "never came", would be raised instead)."""
    with pytest.raises(RuntimeError, match="worker 1 was killed by signal 9 while loading its "
                                           "first sample") as e:
        len(loader(ds.BarrierWorkerOneDies(8, 2, wait=120), batch_size=2, num_workers=2))
    assert "is killed by signal: Killed" in str(e.value), "torch's words"


def test_a_zygote_killed_between_len_and_the_first_for_is_made_again():
    """len() starts the workers (the layout comes from worker 0); their zygote killed before
    the first for is noticed there: a new one forks the workers, every sample comes."""
    import signal

    with loader(ds.Ids(16), batch_size=4) as dl:
        assert len(dl) == 4
        pid = dl._zygote.pid
        watch = os.pidfd_open(pid)
        os.kill(pid, signal.SIGKILL)
        assert select.select([watch], [], [], 30)[0], "the zygote outlived SIGKILL"
        os.close(watch)
        assert sorted(int(x) for b in dl for x in b.reshape(-1)) == list(range(16))
        assert dl._zygote.pid != pid


def test_a_sampler_of_lists_is_refused_with_pinrings_words():
    """torch's DataLoader with batch_size=None hands a sampler's list of indices to
    __getitem__ as it is; pinring's plan carries one index per position: a UsageError (and
    TypeError) naming what the sampler yielded and where, not int()'s own error."""
    with pytest.raises(TypeError, match=r"yielded \[0, 1\] \(a list\) at position 0") as e:
        list(loader(ds.Ids(8), batch_size=None, sampler=[[0, 1], [2, 3]], num_workers=0))
    assert isinstance(e.value, pinring.UsageError)
    assert "batch_sampler" in str(e.value)


def test_a_first_sample_that_fails_is_raised_as_the_workers_exception():
    with pytest.raises(ValueError, match="worker 0 while loading sample 0") as e:
        len(loader(ds.FirstSampleFails(8), batch_size=2))
    assert "sample 0 is broken" in str(e.value)


@pytest.mark.parametrize("workers", [0, 2])
def test_empty_arrays_are_batched_as_torch_batches_them(workers):
    """An array with no elements (no boxes in an image, shape [0, 4]) is no field of the ring;
    the batch has it as torch's collate makes it: an empty tensor of the batch's rows."""
    data = ds.WithEmpty(10)
    want = list(torch.utils.data.DataLoader(data, batch_size=4))
    with loader(data, batch_size=4, num_workers=workers) as dl:
        got = list(dl)
    assert len(got) == len(want) == 3
    for g, w in zip(got, want):
        assert list(g) == list(w)
        for k in w:
            assert g[k].dtype == w[k].dtype and g[k].shape == w[k].shape, k
            assert torch.equal(g[k], w[k]), k


def test_an_empty_array_that_fills_is_named():
    with loader(ds.WithEmpty(10, at=6), batch_size=4) as dl:
        with pytest.raises(ValueError) as e:
            list(dl)
    text = str(e.value)
    assert "['boxes'] of sample 6" in text and "[1, 4]" in text and "[0, 4]" in text, text


@pytest.mark.parametrize("workers", [0, 2])
def test_str_fields_are_batched_as_torch_batches_them(workers):
    """A str field (a caption, a file name) arrives as torch's collate makes it, a list of str
    (and a bytes field a list of bytes),
    of any length up to its row; with batch_size=None each sample's str as it was."""
    data = ds.Captioned(11)
    want = list(torch.utils.data.DataLoader(data, batch_size=4, shuffle=False))
    with loader(data, batch_size=4, num_workers=workers) as dl:
        got = list(dl)
    assert len(got) == len(want) == 3
    for g, w in zip(got, want):
        assert g["caption"] == w["caption"] and g["file"] == w["file"] and g["raw"] == w["raw"]
        assert all(type(r) is bytes for r in g["raw"])
        assert torch.equal(g["image"], w["image"])
    with loader(data, batch_size=None, num_workers=workers) as dl:
        one = list(dl)
    assert [s["caption"] for s in one] == [data[i]["caption"] for i in range(11)]


def _tokenize_captions(batch):
    """A collate_fn as a text+image script has: the images stacked, each caption's bytes as
    token ids padded to the batch's longest (a shape that differs from batch to batch), and
    the captions themselves."""
    ids = [torch.tensor(list(s["caption"].encode()), dtype=torch.int64) for s in batch]
    return {"image": torch.stack([torch.as_tensor(s["image"]) for s in batch]),
            "ids": torch.nn.utils.rnn.pad_sequence(ids, batch_first=True),
            "caption": [s["caption"] for s in batch]}


@pytest.mark.parametrize("workers", [0, 2])
def test_a_collate_fn_over_str_fields_gets_the_whole_batch_as_with_torch(workers):
    """A collate_fn over samples that hold a str (tokenizing captions, padding to the batch's
    longest, listing them) runs on the whole batch, in the training process: its output is
    torch's, batch for batch."""
    data = ds.Captioned(11)
    kw = dict(batch_size=4, collate_fn=_tokenize_captions)
    want = list(torch.utils.data.DataLoader(data, **kw))
    with loader(data, num_workers=workers, **kw) as dl:
        got = list(dl)
    assert len(got) == len(want) == 3
    assert len({tuple(w["ids"].shape) for w in want}) > 1, "the premise: shapes vary"
    for g, w in zip(got, want):
        assert g["caption"] == w["caption"]
        assert torch.equal(g["ids"].cpu(), w["ids"]) and torch.equal(g["image"].cpu(), w["image"])


def test_a_str_longer_than_its_parts_arena_is_named_with_the_setting():
    """str fields are packed per batch part into an arena of str_bytes a sample: one that does
    not fit what its part has left is named, with the setting that holds it."""
    with loader(ds.Captioned(11, long=7), batch_size=4) as dl:
        with pytest.raises(ValueError) as e:
            list(dl)
    text = str(e.value)
    assert "['caption'] of sample 7" in text and "1000 bytes" in text, text
    assert "str_bytes=N" in text and "at least 1024" in text, text
    with loader(ds.Captioned(11, long=7), batch_size=4, str_bytes=1024) as dl:
        got = [c for b in dl for c in b["caption"]]
    assert got[7] == "x" * 1000 and got[6] == ds.Captioned(11)[6]["caption"]


def test_a_strs_length_is_checked_before_its_bytes_are_read():
    """An index row whose length says more than the arena holds (bytes changed under the
    batch) is a VerifyError naming the field and the row, not a read past the arena."""
    from pinring.torch._layout import _Leaf, _unpack_text

    arena = torch.tensor(list(b"abcdef") + [0] * 10, dtype=torch.uint8)
    leaf = _Leaf("['caption']", "str", (8,), 1)
    assert _unpack_text(arena, torch.tensor([[0, 3], [3, 3]]).numpy(), leaf, "caption") == [
        "abc", "def"]
    with pytest.raises(pinring.VerifyError, match=r"row 1 of str field 'caption' says 14 bytes"):
        _unpack_text(arena, torch.tensor([[0, 3], [3, 14]]).numpy(), leaf, "caption")
    with pytest.raises(pinring.VerifyError, match=r"row 0 of str field 'caption' says 1 bytes"):
        _unpack_text(arena, torch.tensor([[-1, 1], [3, 3]]).numpy(), leaf, "caption")
