"""The fields of ``pinring.torch.DataLoader``'s ring: named after the sample's dict keys, tuple
positions and namedtuple fields, and printed by ``pinring.torch.dataset_table(dataset)`` as the
``[dataset]`` table of the config that a ``pinring-daemon --sink consumer`` service needs, so
that an attached DataLoader (``ring=``) can be fed from a config written from that table."""

import subprocess
import uuid

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pinring  # noqa: E402
from pinring.torch import DataLoader, dataset_table  # noqa: E402

import loader_datasets as ds  # noqa: E402
from test_consumer import binary  # noqa: E402


class Photos(torch.utils.data.Dataset):
    """Sample i: a dict of a u8 image [2, 3] of i and its label i % 5."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        return {"image": torch.full((2, 3), i, dtype=torch.uint8), "label": i % 5}


def test_fields_are_named_after_the_samples_keys_and_positions():
    # Mixed: (f32 image, int, {"mask", "small", "half"}, float, Pair(left, right)); declared
    # largest element first (the slot's alignment), in the sample's order among equals.
    assert dataset_table(ds.Mixed(5)) == (
        '[dataset]\n'
        'kind = "external"\n'
        'samples = 5\n'
        'fields = [\n'
        '    { name = "1", dtype = "i64", shape = [] },\n'
        '    { name = "3", dtype = "f64", shape = [] },\n'
        '    { name = "4.right", dtype = "f64", shape = [3] },\n'
        '    { name = "0", dtype = "f32", shape = [3, 4, 5] },\n'
        '    { name = "4.left", dtype = "i32", shape = [] },\n'
        '    { name = "2.small", dtype = "i16", shape = [2] },\n'
        '    { name = "2.half", dtype = "bf16", shape = [2] },\n'
        '    { name = "2.mask", dtype = "bool", shape = [4] },\n'
        ']\n'
    )
    assert 'name = "sample"' in dataset_table(ds.Ids(3)), "a bare tensor"


def test_keys_that_are_no_field_names_are_made_into_ones():
    class Odd(torch.utils.data.Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return {"my key": i, 7: float(i), "x" * 80: i, "my_key": i}

    table = dataset_table(Odd())
    names = [line.split('"')[1] for line in table.splitlines() if "name =" in line]
    assert names == ["my_key", "7", "x" * 64, "my_key_3"], names
    # What it prints is what pinring reads.
    info = pinring.check_config(table)
    assert [f[0] for f in info["fields"]] == names


def test_a_service_configured_from_the_table_feeds_an_attached_dataloader(tmp_path):
    name = f"py-table-{uuid.uuid4().hex[:8]}"
    config = tmp_path / "service.toml"
    config.write_text(
        f'[ring]\nname = "{name}"\n' + dataset_table(Photos())
        + "[plan]\nbatch_size = 4\nshuffle = false\nepochs = 1\n"
    )
    daemon = subprocess.Popen(
        [*binary("pinring-daemon"), "--config", str(config), "--backend", "host", "--sink",
         "consumer"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        with DataLoader(Photos(), ring=name, num_workers=2, device=None) as pl:
            got = list(pl)
        assert len(got) == 6
        for k, batch in enumerate(got):
            assert set(batch) == {"image", "label"}, batch.keys()
            ids = list(range(4 * k, 4 * k + 4))
            assert torch.equal(batch["image"], torch.tensor(ids, dtype=torch.uint8)
                               .view(4, 1, 1).expand(4, 2, 3))
            assert batch["label"].tolist() == [i % 5 for i in ids]
    finally:
        daemon.terminate()
        daemon.wait(30)


def test_a_ring_with_other_fields_is_refused_with_the_table_it_needs(tmp_path):
    name = f"py-other-{uuid.uuid4().hex[:8]}"
    config = tmp_path / "service.toml"
    config.write_text(
        f'[ring]\nname = "{name}"\n[dataset]\nkind = "external"\nsamples = 24\n'
        'fields = [{ name = "f0", dtype = "u8", shape = [2, 3] }, '
        '{ name = "f1", dtype = "i64" }]\n[plan]\nbatch_size = 4\nepochs = 1\n'
    )
    daemon = subprocess.Popen(
        [*binary("pinring-daemon"), "--config", str(config), "--backend", "host", "--sink",
         "consumer"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        with pytest.raises(pinring.RefusedError) as e:
            list(DataLoader(Photos(), ring=name, device=None))
        text = str(e.value)
        assert "pinring.torch.dataset_table(dataset)" in text, text
        assert dataset_table(Photos()) in text, text
    finally:
        daemon.terminate()
        daemon.wait(30)
