"""``pinring.torch.DataLoader`` over a ``torch.utils.data.IterableDataset``, against torch's own
DataLoader on the same dataset: each worker iterates its own copy with torch's
``get_worker_info()`` set, the workers' batches interleave round-robin in torch's order (the
workers' random draws included), short last batches are kept or dropped as torch's, and a
worker that dies or raises is an error naming it, never a silent loss or duplicate."""

import os

import pytest

torch = pytest.importorskip("torch")

# The host backend in CI; PINRING_TEST_DEVICE=cuda runs the same tests on a GPU.
DEVICE = os.environ.get("PINRING_TEST_DEVICE", "cpu")

import pinring  # noqa: E402
from pinring.torch import DataLoader  # noqa: E402

import loader_datasets as ds  # noqa: E402


def epochs(make, dataset, n=2, **kw):
    """``n`` epochs of what a loader made by ``make`` yields, after ``torch.manual_seed(0)``:
    each batch as plain lists (tensors' values, the names)."""
    torch.manual_seed(0)
    dl = make(dataset, **kw)
    out = []
    try:
        for _ in range(n):
            out.append([{k: v.cpu().tolist() if isinstance(v, torch.Tensor) else v
                         for k, v in b.items()} for b in dl])
    finally:
        if isinstance(dl, DataLoader):
            dl.close()
    return out


def pinring_loader(dataset, **kw):
    return DataLoader(dataset, device=DEVICE, **kw)


SHAPES = [
    dict(batch_size=3),
    dict(batch_size=3, drop_last=True),
    dict(batch_size=None),
    dict(batch_size=1),
]


@pytest.mark.parametrize("workers", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("shape", SHAPES, ids=["3", "3-drop-last", "none", "1"])
def test_the_workers_batches_come_in_torchs_order(workers, shape):
    """Streams of different lengths (one empty): round-robin while every worker has batches,
    the ended ones passed over, the short last batches as torch makes them; two epochs, each
    worker iterating its copy from the start, and the same random draws as torch's workers."""
    lens = [7, 0, 5, 11]
    for dataset in (ds.Shards(10), ds.Shards(lens=lens)):
        want = epochs(torch.utils.data.DataLoader, dataset, num_workers=workers, **shape)
        got = epochs(pinring_loader, dataset, num_workers=workers, **shape)
        assert got == want
        names = [n for e in got[:1] for b in e for n in (
            [b["name"]] if shape.get("batch_size", 1) is None else b["name"])]
        per_worker = [lens[w] for w in range(max(1, workers))] if dataset.lens else (
            [10] * max(1, workers))
        if not shape.get("drop_last"):
            assert len(names) == sum(per_worker), "every sample once"
            assert len(set(names)) == len(names)


def test_a_batch_cut_into_parts_keeps_its_rows_in_order():
    """Samples of 1 MiB in batches of 16: the ring cuts each batch into parts, which a worker
    claims in any order; each part holds its own rows of the worker's batch."""
    dataset = ds.Shards(lens=[21, 9], big=1 << 20)
    torch.manual_seed(0)
    dl = pinring_loader(dataset, batch_size=16, num_workers=2)
    got = []
    for b in dl:
        assert dl._consumer.parts_per_batch > 1, "the premise: batches in several parts"
        got.append((b["x"].cpu().tolist(), b["blob"][:, :2].cpu().tolist(), b["name"]))
    dl.close()
    torch.manual_seed(0)
    want = [(b["x"].tolist(), b["blob"][:, :2].tolist(), b["name"])
            for b in torch.utils.data.DataLoader(dataset, batch_size=16, num_workers=2)]
    assert got == want
    assert [len(x) for x, _, _ in got] == [16, 9, 5]


def test_a_part_taken_back_after_its_lease_is_written_again_from_the_same_samples():
    """A worker slower than the lease: the daemon takes its part back and hands the seq out
    again; the worker writes the batch it already drew from its stream again (a stream cannot
    be drawn twice), so nothing is lost or repeated."""
    dataset = ds.Shards(lens=[4, 4], slow=0.06)
    got = epochs(pinring_loader, dataset, n=1, batch_size=2, num_workers=2, lease_ms=20)
    want = epochs(torch.utils.data.DataLoader, dataset, n=1, batch_size=2, num_workers=2)
    assert got == want


def test_every_stream_empty_yields_nothing():
    dl = pinring_loader(ds.Shards(lens=[0, 0]), batch_size=2, num_workers=2)
    assert list(dl) == [] and list(dl) == []
    dl.close()
    assert list(pinring_loader(ds.Shards(0), batch_size=2)) == []


def test_a_worker_killed_is_an_error_naming_it_not_a_restart():
    dl = pinring_loader(ds.Shards(lens=[6, 6, 6], kill_at=(1, 3)), batch_size=2,
                        num_workers=3, max_worker_restarts=5)
    seen = []
    with pytest.raises(pinring.PeerDied) as e:
        for b in dl:
            seen.extend(b["name"])
    dl.close()
    text = str(e.value)
    assert "worker 1 was killed by SIGKILL" in text, text
    assert "not restarted" in text, text
    assert len(seen) == len(set(seen)), "nothing yielded twice"
    assert not any(n.startswith("w1-") and int(n[3:]) >= 3 for n in seen)


def test_an_exception_in_a_workers_stream_is_raised_naming_the_worker():
    dl = pinring_loader(ds.Shards(lens=[6, 6], raise_at=(1, 2)), batch_size=2, num_workers=2)
    with pytest.raises(KeyError) as e:
        list(dl)
    dl.close()
    text = str(e.value)
    assert "worker 1" in text and "no sample 2 in shard 1" in text, text
    assert "while iterating its dataset" in text, text


def test_torchs_refusals_and_pinrings_for_an_iterable_dataset():
    for bad, words in ((dict(shuffle=True), "expected unspecified shuffle option"),
                       (dict(sampler=range(4)), "expected unspecified sampler option"),
                       (dict(batch_sampler=[[0, 1]]), "expected unspecified batch_sampler"),
                       (dict(ring="gpu0"), "no plan of sample indices to attach to"),
                       (dict(rank=0, world_size=2), "get_worker_info")):
        with pytest.raises(ValueError, match=words):
            pinring_loader(ds.Shards(4), **bad)
    dl = pinring_loader(ds.Shards(4), batch_size=2)
    with pytest.raises(TypeError):
        len(dl)  # as torch's: the dataset has no len()
    sized = pinring_loader(ds.SizedShards(5), batch_size=3)
    assert len(sized) == len(torch.utils.data.DataLoader(ds.SizedShards(5), batch_size=3)) == 7
    sized = pinring_loader(ds.SizedShards(5), batch_size=3, drop_last=True)
    assert len(sized) == 6


@pytest.mark.parametrize("workers", [0, 2, 3])
@pytest.mark.parametrize("make", [ds.Shards, ds.StatefulShards], ids=["replayed", "stateful"])
def test_a_state_saved_mid_epoch_resumes_each_stream_where_it_stood(workers, make):
    """Batches up to a state saved mid-epoch, then a new loader from that state: together
    torch's epoch, each sample once. A ``Stateful`` dataset goes on from its own state; any
    other is drawn again from its start in each worker, and the samples drawn before skipped.
    Saved after one stream ended (worker 1 of [7, 2, 5]) and before others started."""
    def names(batches):
        return [n for b in batches for n in b["name"]]

    lens = [7, 2, 5]
    want = names(epochs(torch.utils.data.DataLoader, make(lens=lens), n=1, batch_size=2,
                        num_workers=workers)[0])
    for stop in (1, 4):
        dl = pinring_loader(make(lens=lens), batch_size=2, num_workers=workers)
        first = []
        for b in dl:
            first.append(b)
            if len(first) == stop:
                state = dl.state_dict()
                break
        dl.close()
        again = pinring_loader(make(lens=lens), batch_size=2, num_workers=workers)
        again.load_state_dict(state)
        rest = list(again)
        assert names(first) + names(rest) == want, stop
        # The next for is a whole epoch again (the workers' copies start afresh; without
        # workers the loop iterates the one dataset, whose own state stays at its end, as
        # torch's single-process loop leaves it).
        if workers or make is ds.Shards:
            assert names(list(again)) == want
        again.close()


def test_a_state_of_another_stream_is_refused():
    dl = pinring_loader(ds.Shards(4), batch_size=2, num_workers=2)
    state = dl.state_dict()
    other = pinring_loader(ds.Shards(4), batch_size=3, num_workers=2)
    with pytest.raises(pinring.RefusedError, match="batch_size 2"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="what state_dict"):
        other.load_state_dict({"seq": 0, "fingerprint": 1})


class _Numbers(torch.utils.data.IterableDataset):
    """0..n-1 split by worker, with a length."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        w, k = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(w, self.n, k))

    def __len__(self):
        return self.n


@pytest.mark.parametrize("workers", [0, 2])
def test_list_keeps_every_batch_of_a_long_stream(workers):
    """list(loader) over more batches than the ring has buffers: the batches kept are copied
    out of the ring (a full batch is no view of its buffer), as with a map-style dataset."""
    with pytest.warns(UserWarning, match="copy"):
        got = list(pinring_loader(_Numbers(100), batch_size=1, num_workers=workers))
    assert sorted(int(b) for b in got) == list(range(100))


def test_a_stream_longer_than_its_length_is_warned_of_as_torch_does():
    data = _Numbers(6)
    dl = pinring_loader(data, batch_size=1, num_workers=2)
    assert len(dl) == 6
    data.n = 9  # the stream grows after len() was asked
    with pytest.warns(UserWarning, match="was reported to be 6 .* but 7 samples have been fetched"):
        got = [b for b in dl]  # (list() would ask len() again, as with torch)
    assert sorted(int(b) for b in got) == list(range(9))
