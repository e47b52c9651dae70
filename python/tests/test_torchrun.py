"""pinring under torchrun: each rank takes its shard and its ring from the job, with no argument
about either. Four ranks (gloo, CPU, host backend) each run ``pinring.torch.DataLoader`` and
``pinring.Loader(config=..., loaders=2)``, write the sample ids they got, and the test checks
that each epoch's ids over the ranks are the dataset, each once. An argument that contradicts
the job is refused, naming both."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

import pinring

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

SAMPLES = 104  # 26 a rank of 4: no rank pads its share
EPOCHS = 2

RANK_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import torch.distributed as dist
    import pinring
    from pinring.torch import DataLoader

    class Ids(torch.utils.data.Dataset):
        def __len__(self):
            return int(sys.argv[3])

        def __getitem__(self, i):
            return torch.tensor(i, dtype=torch.int64)

    def main():
        mode, out = sys.argv[1], sys.argv[2]
        dist.init_process_group("gloo")
        seen, rings = {}, []
        if mode == "dataloader":
            loader = DataLoader(Ids(), batch_size=4, shuffle=True, num_workers=2, epochs=2,
                                device="cpu", timeout=120)
            for epoch in range(2):
                seen[epoch] = [int(x) for b in loader for x in b]
            rings.append(loader._ring_name)
            loader.close()
        else:
            with pinring.Loader(config=sys.argv[4], loaders=2, backend="host", as_numpy=True,
                                timeout=120) as loader:
                for epoch in range(2):
                    seen[epoch] = [int(x) for b in loader for x in b["data"]]
                rings.append(loader.ring)
        rank = dist.get_rank()
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, "seen": seen, "rings": rings}, f)
        dist.barrier()
        dist.destroy_process_group()

    if __name__ == "__main__":
        main()
    """
)


def torchrun(tmp_path, *args, nproc=4):
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc-per-node={nproc}", str(script), args[0], str(out), str(SAMPLES), *args[1:]],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    return [json.loads((out / f"rank{i}.json").read_text()) for i in range(nproc)]


def check_disjoint_and_covering(ranks):
    for epoch in map(str, range(EPOCHS)):
        per_rank = [r["seen"][epoch] for r in ranks]
        assert all(len(s) == SAMPLES // len(ranks) for s in per_rank), [len(s) for s in per_rank]
        union = [i for s in per_rank for i in s]
        assert sorted(union) == list(range(SAMPLES)), f"epoch {epoch}: each sample once"
    assert ranks[0]["seen"]["0"] != ranks[0]["seen"]["1"], "shuffled per epoch"
    names = [n for r in ranks for n in r["rings"]]
    assert len(set(names)) == len(names), f"one ring per rank: {names}"
    assert all(f"rank{r['rank']}" in n for r in ranks for n in r["rings"]), names


def test_dataloader_ranks_take_their_shards_from_torchrun(tmp_path):
    check_disjoint_and_covering(torchrun(tmp_path, "dataloader"))


def test_loader_ranks_with_their_own_loaders_take_their_shards(tmp_path):
    ids = tmp_path / "ids.npy"
    np.save(ids, np.arange(SAMPLES, dtype=np.int64))
    config = tmp_path / "ids.toml"
    config.write_text(
        f'[dataset]\nkind = "npy"\n[dataset.npy]\npath = "{ids}"\ndtype = "i64"\nshape = []\n'
        "[plan]\nbatch_size = 4\nshuffle = true\nepochs = 2\n"
    )
    check_disjoint_and_covering(torchrun(tmp_path, "loader", str(config)))


def test_an_argument_that_contradicts_the_job_is_refused(tmp_path, monkeypatch):
    from pinring.torch import DataLoader

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    data = torch.arange(16)
    with pytest.raises(pinring.UsageError, match=r"rank=0, but .*\$RANK=1"):
        DataLoader(data, batch_size=2, rank=0, device="cpu")
    with pytest.raises(pinring.UsageError, match=r"world_size=2, but .*\$WORLD_SIZE=4"):
        pinring.Loader(dataset={"samples": 64}, rank=1, world_size=2, backend="host")
    # Agreeing, or left out: the job's shard.
    loader = DataLoader(data, batch_size=2, rank=1, device="cpu")
    assert (loader.rank, loader.world_size) == (1, 4)
    with pinring.Loader(dataset={"samples": 64, "sample_shape": [2], "dtype": "f32"},
                        batch_size=4, epochs=1, embedded=True, backend="host",
                        as_numpy=True) as loader:
        assert len(loader) == 4, "16 samples of 64 for rank 1 of 4, 4 a batch"
        assert loader.ring.endswith("-rank1")
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(pinring.UsageError, match=r"\$RANK='x' is not an integer"):
        DataLoader(data, batch_size=2, device="cpu")
