"""``pinring.torch.DataLoader`` behaves as ``torch.utils.data.DataLoader`` where scripts rely
on it: the exception types torch raises, ``DataLoader[T]`` in annotations, attributes that may
not be assigned after construction, the warning for more workers than CPUs, torch's own
``get_worker_info()`` inside the workers, a state that loads into a loader made the same way,
and a word about pickling where the start method needs it."""

import os
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


def test_a_timeout_is_the_runtime_error_torch_raises():
    with loader(ds.Slow(8, delay=5.0), batch_size=4, timeout=0.3) as dl:
        with pytest.raises(RuntimeError) as e:
            next(iter(dl))
    assert isinstance(e.value, pinring.Timeout)
    assert "timeout=0.3" in str(e.value)
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
