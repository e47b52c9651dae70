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
TESTS = os.path.dirname(os.path.abspath(__file__))
EPOCHS = 2

RANK_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import torch.distributed as dist
    import pinring
    from pinring.torch import DataLoader
    from loader_datasets import Ids

    def main():
        mode, out = sys.argv[1], sys.argv[2]
        dist.init_process_group("gloo")
        seen, rings = {}, []
        if mode == "dataloader":
            loader = DataLoader(Ids(int(sys.argv[3])), batch_size=4, shuffle=True,
                                num_workers=2, epochs=2, device="cpu", timeout=120)
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
            json.dump({"rank": rank, "local_rank": int(os.environ["LOCAL_RANK"]), "seen": seen,
                       "rings": rings}, f)
        dist.barrier()
        dist.destroy_process_group()

    if __name__ == "__main__":
        main()
    """
)


def torchrun(tmp_path, *args, nproc=4, script=RANK_SCRIPT, launch=("--standalone",), agents=1):
    """Runs ``script`` under torchrun (``agents`` agents, each with ``launch`` arguments and
    ``nproc`` ranks) and returns each rank's report."""
    path = tmp_path / "rank.py"
    path.write_text(script)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    # The ranks import the tests' datasets (loader_datasets.Ids) from this directory.
    path_var = os.pathsep.join(p for p in (TESTS, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path_var}
    cmd = [sys.executable, "-m", "torch.distributed.run", *launch, f"--nproc-per-node={nproc}",
           str(path), args[0], str(out), str(SAMPLES), *args[1:]]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env, cwd=tmp_path) for _ in range(agents)]
    try:
        results = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (stdout, stderr) in zip(procs, results):
        assert p.returncode == 0, stdout[-3000:] + stderr[-6000:]
    return [json.loads((out / f"rank{i}.json").read_text()) for i in range(nproc * agents)]


def ids_config(tmp_path, plan=""):
    """A config of the samples' ids (``kind = "npy"``, field ``data``), batches of 4, shuffled,
    2 epochs, with ``plan`` lines added to its ``[plan]``."""
    ids = tmp_path / "ids.npy"
    np.save(ids, np.arange(SAMPLES, dtype=np.int64))
    config = tmp_path / "ids.toml"
    config.write_text(
        f'[dataset]\nkind = "npy"\n[dataset.npy]\npath = "{ids}"\ndtype = "i64"\nshape = []\n'
        f"[plan]\nbatch_size = 4\nshuffle = true\nepochs = {EPOCHS}\n{plan}"
    )
    return config


def check_disjoint_and_covering(ranks):
    for epoch in map(str, range(EPOCHS)):
        per_rank = [r["seen"][epoch] for r in ranks]
        assert all(len(s) == SAMPLES // len(ranks) for s in per_rank), [len(s) for s in per_rank]
        union = [i for s in per_rank for i in s]
        assert sorted(union) == list(range(SAMPLES)), f"epoch {epoch}: each sample once"
    assert ranks[0]["seen"]["0"] != ranks[0]["seen"]["1"], "shuffled per epoch"
    names = [n for r in ranks for n in r["rings"]]
    assert len(set(names)) == len(names), f"one ring per rank: {names}"
    assert all(f"rank{r['local_rank']}" in n for r in ranks for n in r["rings"]), names


def test_dataloader_ranks_take_their_shards_from_torchrun(tmp_path):
    check_disjoint_and_covering(torchrun(tmp_path, "dataloader"))


def test_loader_ranks_with_their_own_loaders_take_their_shards(tmp_path):
    config = ids_config(tmp_path)
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


def test_two_hosts_of_two_ranks_take_disjoint_shards(tmp_path):
    # Two torchrun agents on this machine, as two hosts would run them: a c10d rendezvous on
    # loopback, 2 ranks each; local ranks repeat across the "hosts", global ranks do not.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launch = ("--nnodes=2", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
              "--rdzv-id=pinring-test", "--max-restarts=0")
    ranks = torchrun(tmp_path, "dataloader", nproc=2, launch=launch, agents=2)
    assert sorted(r["local_rank"] for r in ranks) == [0, 0, 1, 1]
    check_disjoint_and_covering(ranks)


RESUME_SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys
    import pinring

    def save(path, data):
        with open(path + ".tmp", "w") as f:
            json.dump(data, f)
        os.replace(path + ".tmp", path)

    def main():
        # No process group: torchrun's environment alone places the rank (and a gloo group
        # would have to reconnect across the restart).
        out, config = sys.argv[2], sys.argv[4]
        rank = int(os.environ["RANK"])
        ckpt = os.path.join(out, f"ckpt{rank}.json")
        saved = {"state": None, "seen": []}
        if os.path.exists(ckpt):
            with open(ckpt) as f:
                saved = json.load(f)
        seen = saved["seen"]

        def took(epoch, ids, state):
            seen.append([epoch, ids])
            # The checkpoint: what was trained on and where the loader stands, together.
            save(ckpt, {"state": state, "seen": seen})
            marker = os.path.join(out, "killed")
            if rank == 1 and len(seen) == 5 and not os.path.exists(marker):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)

        if sys.argv[1] == "loader":
            with pinring.Loader(config=config, loaders=1, backend="host", as_numpy=True,
                                timeout=120) as loader:
                if saved["state"] is not None:
                    loader.load_state_dict(saved["state"])
                for b in loader.batches():
                    epoch, ids = b.epoch, [int(x) for x in b.fields["data"].numpy()]
                    del b
                    took(epoch, ids, loader.state_dict())
                ring = loader.ring
        else:
            from pinring.torch import DataLoader
            from loader_datasets import Ids

            loader = DataLoader(Ids(int(sys.argv[3])), batch_size=4, shuffle=True,
                                num_workers=1, epochs=2, device="cpu", timeout=120)
            bpe, ppb = loader._shape()
            start = 0  # the epoch this life starts in: the first for is its rest
            if saved["state"] is not None:
                loader.load_state_dict(saved["state"])
                start = saved["state"]["seq"] // ppb // bpe
            for epoch in range(start, 2):  # the plan's 2 epochs: a third for would raise
                for b in loader:
                    state = loader.state_dict()
                    took((state["seq"] // ppb - 1) // bpe, [int(x) for x in b], state)
            ring = loader._ring_name  # None if this life had nothing left to run
            loader.close()
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            by_epoch = {}
            for epoch, ids in seen:
                by_epoch.setdefault(str(epoch), []).extend(ids)
            json.dump({"rank": rank, "local_rank": int(os.environ["LOCAL_RANK"]),
                       "seen": by_epoch, "rings": [ring] if ring else []}, f)

    if __name__ == "__main__":
        main()
    """
)


@pytest.mark.parametrize("mode", ["loader", "dataloader"])
def test_a_rank_killed_and_the_job_restarted_resumes_every_rank_exactly(tmp_path, mode):
    # Rank 1 SIGKILLs itself after 5 batches of epoch 0; torchrun stops rank 0 (or finds it
    # done) and starts both again (--max-restarts=1); each resumes from its own checkpoint
    # (loader state and the ids trained on, saved together after every batch), with either
    # loader. Over the two lives, each epoch's ids are the dataset, each once.
    config = ids_config(tmp_path)
    ranks = torchrun(tmp_path, mode, str(config), nproc=2, script=RESUME_SCRIPT,
                     launch=("--standalone", "--max-restarts=1"))
    assert (tmp_path / "out" / "killed").exists(), "rank 1 was killed once"
    check_disjoint_and_covering(ranks)


def test_each_ranks_order_is_the_same_run_to_run_whatever_its_loaders(tmp_path):
    # The order is the plan's, a function of (seed, epoch, rank, world_size): loaders only
    # fill it. Each rank of 3 gets the same ids in the same order with 1 loader and with 3.
    config = ids_config(tmp_path, "seed = 5\n")

    def order(rank, loaders):
        with pinring.Loader(config=str(config), loaders=loaders, rank=rank, world_size=3,
                            backend="host", as_numpy=True, timeout=60) as loader:
            return [int(x) for b in loader.batches() for x in b.fields["data"].numpy()]

    orders = [order(r, 1) for r in range(3)]
    assert [order(r, 3) for r in range(3)] == orders
    for epoch in range(EPOCHS):
        per = len(orders[0]) // EPOCHS
        union = [i for o in orders for i in o[epoch * per:(epoch + 1) * per]]
        # 104 over 3 ranks: 35 each, the last rank's share wrapping around by one sample.
        assert set(union) == set(range(SAMPLES)) and len(union) == 105
