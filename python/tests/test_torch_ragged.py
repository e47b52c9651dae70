"""Fields whose shape varies from sample to sample (token ids, detection boxes), through the
ring: each packed into its part's arena, found by looking at a few samples first (where a
``collate_fn`` or one sample a batch could batch them) or named with ``ragged=``, and handed
over as torch's DataLoader hands them: the script's ``collate_fn`` on the whole batch (here,
in the training process), one sample stacked as torch stacks it, or (named, without a
``collate_fn``, where torch's default collate fails to stack them) a list of tensors. Exactly
once under worker deaths, every length checked."""

RAGGED = ["tokens", "boxes"]

import os

import pytest

torch = pytest.importorskip("torch")

import pinring  # noqa: E402
from pinring.torch import DataLoader  # noqa: E402

import loader_datasets as ds  # noqa: E402

# The host backend in CI; PINRING_TEST_DEVICE=cuda runs the same tests on a GPU.
DEVICE = os.environ.get("PINRING_TEST_DEVICE", "cpu")


def plain(value):
    """Tensors (and lists of them) as lists, for comparing."""
    if isinstance(value, torch.Tensor):
        return value.cpu().tolist()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


@pytest.mark.parametrize("workers", [0, 2])
def test_a_padding_collate_fn_gets_the_whole_batch_as_with_torch(workers):
    kw = dict(batch_size=8, num_workers=workers, collate_fn=ds.pad_tokens)
    want = [plain(b) for b in torch.utils.data.DataLoader(ds.Tokens(), **kw)]
    with DataLoader(ds.Tokens(), device=DEVICE, **kw) as dl:
        got = [plain(b) for b in dl]
        assert dl._infer().any_ragged, "the premise: tokens and boxes are ragged fields"
    assert got == want
    assert {len(t) for b in got for t in b["tokens"]} != {13}, "padded per batch, not globally"


@pytest.mark.parametrize("workers", [0, 2])
def test_without_a_collate_fn_a_ragged_field_is_a_list_of_its_tensors(workers):
    with DataLoader(ds.Tokens(), batch_size=8, num_workers=workers, device=DEVICE,
                    ragged=RAGGED) as dl:
        batches = list(dl)
    samples = [ds.Tokens()[i] for i in range(50)]
    tokens = [t for b in batches for t in b["tokens"]]
    assert [t.tolist() for t in tokens] == [s["tokens"].tolist() for s in samples]
    assert [t.shape for b in batches for t in b["boxes"]] == [
        torch.Size([i % 4, 4]) for i in range(50)]
    assert all(t.device.type == torch.device(DEVICE).type for t in tokens)
    assert batches[0]["img"].shape == (8, 2, 2) and batches[0]["caption"][1] == "sample 1"


def test_one_sample_a_batch_is_stacked_as_torch_stacks_it():
    for kw in (dict(batch_size=1), dict(batch_size=None)):
        want = [plain(b) for b in torch.utils.data.DataLoader(ds.Tokens(20), **kw)]
        with DataLoader(ds.Tokens(20), device=DEVICE, **kw) as dl:
            assert [plain(b) for b in dl] == want, kw


def test_an_iterable_datasets_ragged_fields_in_torchs_order():
    kw = dict(batch_size=4, num_workers=2, collate_fn=ds.pad_tokens)
    want = [plain(b) for b in torch.utils.data.DataLoader(ds.TokenStream(), **kw)]
    with DataLoader(ds.TokenStream(), device=DEVICE, **kw) as dl:
        assert [plain(b) for b in dl] == want


def test_a_worker_killed_mid_part_loses_and_repeats_nothing(tmp_path):
    """A worker killed while packing a part: the part is made again by another worker, from
    an empty arena; every sample arrives once, whole."""
    data = ds.Tokens(120, kill=(str(tmp_path / "killed"), 37))
    with DataLoader(data, batch_size=8, num_workers=3, device=DEVICE, ragged=RAGGED) as dl:
        tokens = [t.tolist() for b in dl for t in b["tokens"]]
        assert dl.worker_restarts == 1
    assert tokens == [ds.Tokens(120)[i]["tokens"].tolist() for i in range(120)]


def _zygote_children(pid):
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(p) for p in f.read().split()]
    except OSError:
        pass
    return out


def test_a_kill_storm_on_packing_workers_loses_and_repeats_nothing():
    """Workers SIGKILLed again and again while they pack ragged arrays and str into their
    parts' arenas: each part whose worker died is made again from an empty arena; every
    sample's tokens, boxes and caption arrive once, whole, in order."""
    import random
    import signal
    import threading

    n = 400
    rng = random.Random(49)
    kills = []
    done = threading.Event()
    with DataLoader(ds.Tokens(n, slow=0.005), batch_size=8, num_workers=3, device=DEVICE,
                    ragged=RAGGED, max_worker_restarts=1000) as dl:
        it = iter(dl)
        got = [next(it)]

        def storm():
            while not done.is_set() and len(kills) < 30:
                done.wait(rng.uniform(0.005, 0.04))
                pids = [p for p in _zygote_children(dl._zygote.pid) if p not in kills]
                if pids:
                    pid = rng.choice(pids)
                    try:
                        os.kill(pid, signal.SIGKILL)
                        kills.append(pid)
                    except ProcessLookupError:
                        pass

        killer = threading.Thread(target=storm)
        killer.start()
        try:
            got += list(it)
        finally:
            done.set()
            killer.join()
        restarts = dl.worker_restarts
    assert len(kills) >= 5 and restarts >= 1, (len(kills), restarts)
    want = [ds.Tokens(n)[i] for i in range(n)]
    assert [t.tolist() for b in got for t in b["tokens"]] == [w["tokens"].tolist() for w in want]
    assert [t.tolist() for b in got for t in b["boxes"]] == [w["boxes"].tolist() for w in want]
    assert [c for b in got for c in b["caption"]] == [w["caption"] for w in want]
    assert [x for b in got for x in b["label"].tolist()] == list(range(n))


def test_a_sample_larger_than_the_arena_names_itself_and_the_setting():
    with DataLoader(ds.Tokens(20, long_at=12), batch_size=4, num_workers=0, device=DEVICE,
                    collate_fn=ds.pad_tokens) as dl:
        with pytest.raises(pinring.UsageError) as e:
            list(dl)
    text = str(e.value)
    assert "['tokens'] of sample 12 holds 800000 bytes" in text, text
    assert "ragged_bytes=N) with N at least 800000" in text, text
    with DataLoader(ds.Tokens(20, long_at=12), batch_size=4, num_workers=0, device=DEVICE,
                    collate_fn=ds.pad_tokens, ragged_bytes=800_000) as dl:
        assert len(list(dl)) == 5


def test_without_a_collate_fn_a_varying_field_says_to_name_it():
    """torch's default collate cannot stack it; pinring says how to have it as a list."""
    with DataLoader(ds.Tokens(), batch_size=8, device=DEVICE) as dl:
        with pytest.raises(ValueError, match=r"ragged=\['tokens'\]"):
            list(dl)


def test_a_field_named_ragged_and_a_variation_the_first_samples_hid():
    class LongLater(ds.Ids):
        """Every sample looked at first (0, 1, 9, 5) has 2 ids; sample 4 has 3."""

        def __getitem__(self, i):
            return torch.arange(3 if i == 4 else 2)

    with DataLoader(LongLater(10), batch_size=1, device=DEVICE) as dl:
        with pytest.raises(pinring.UsageError, match=r"ragged=\['sample'\]"):
            list(dl)
    with DataLoader(LongLater(10), batch_size=2, device=DEVICE, ragged=["sample"]) as dl:
        assert [t.tolist() for b in dl for t in b][3:6] == [[0, 1], [0, 1, 2], [0, 1]]
    with pytest.raises(pinring.UsageError, match="'nope' is no field of dataset"):
        list(DataLoader(LongLater(10), batch_size=2, device=DEVICE, ragged=["nope"]))


def test_a_ragged_field_as_one_jagged_nested_tensor():
    with DataLoader(ds.Tokens(), batch_size=8, device=DEVICE, ragged=RAGGED,
                    ragged_as="jagged") as dl:
        batches = list(dl)
    first = batches[0]["tokens"]
    assert first.is_nested and first.shape[0] == 8
    assert [t.tolist() for b in batches for t in b["tokens"].unbind()] == [
        ds.Tokens()[i]["tokens"].tolist() for i in range(50)]
    assert [t.shape for t in batches[1]["boxes"].unbind()] == [
        torch.Size([i % 4, 4]) for i in range(8, 16)]
    with pytest.raises(ValueError, match="ragged_as="):
        DataLoader(ds.Tokens(), ragged_as="nested")


class _Growing(torch.utils.data.IterableDataset):
    """A stream of 11 samples whose token and caption lengths grow with the index (the last
    ones several times the first's), so a short last batch uses more of its part's arena than
    its rows' shares."""

    def __iter__(self):
        for i in range(11):
            yield {"tokens": torch.arange(4 + 9 * i), "caption": "w" * (10 + 60 * i)}


@pytest.mark.parametrize("workers", [0, 2])
def test_a_short_last_batch_keeps_its_packed_fields_whole(workers):
    """A short batch hands over its first rows; its arenas stay whole, since a part's samples
    fill its arena from its start, not row by row."""
    with DataLoader(_Growing(), batch_size=8, num_workers=workers, device=DEVICE,
                    ragged=["tokens"], ragged_bytes=512, str_bytes=256) as dl:
        got = list(dl)
    want = list(_Growing())
    if workers == 2:  # each worker its own copy of the stream: both yield all 11
        want = [s for pair in zip(want, want) for s in pair]
        want = want[:8] + want[8:]
    flat_tokens = [t.tolist() for b in got for t in b["tokens"]]
    flat_captions = [c for b in got for c in b["caption"]]
    assert sorted(flat_captions) == sorted(s["caption"] for s in want)
    assert sorted(flat_tokens) == sorted(s["tokens"].tolist() for s in want)


class _NestedSamples(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.nested.nested_tensor([torch.zeros(i + 1), torch.zeros(2)])


def test_a_nested_tensor_sample_is_refused_with_what_to_do():
    """A nested tensor has no one shape: torch's own error (NestedTensorImpl doesn't support
    sizes) came from reading it; pinring says what it is and what to return instead."""
    with DataLoader(_NestedSamples(), batch_size=2, num_workers=0, device=DEVICE) as dl:
        with pytest.raises(pinring.UsageError) as e:
            next(iter(dl))
    text = str(e.value)
    assert "a nested tensor" in text and "ragged" in text, text
