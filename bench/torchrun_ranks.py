#!/usr/bin/env python3
"""Ranks of one job under torchrun, each fed by its own ring, measured side by side: the one-GPU
stand-in for a multi-GPU host (every rank uploads to the GPU its job gives it; on a host of one
GPU, all of them to GPU 0).

The data is the seed workload's shape in a file: --samples float32 images of 512x512 and their
ids as labels, in two .npy files (written once, then in the page cache). Each rank runs
``pinring.Loader(config=..., loaders=--loaders)`` with no rank, world size or device named: it
takes them from torchrun's environment, starts an embedded daemon and its loaders, and takes
--epochs epochs of batches of 32 (1 MiB a sample, 32 MiB a batch). It checks on the GPU that
each batch's images are its ids' (every pixel of image i is i % 251, compared in place), keeps
the ids, and reports its GB/s over the epochs after the first. The launcher then checks that
each epoch's ids over the ranks are the dataset, each once.

Runs: --nproc ranks together, then one rank alone (world size 1), for the comparison.
With --kill-after N, a last run (``killed``, --kill-epochs epochs) under torchrun's
--max-restarts=1: each rank takes its batches through ``Loader.batches()``, checks every pixel
of each batch against its ids on the GPU, and appends the ids and the loader's state to its own
log after every batch (its checkpoint); rank --kill-rank (1) SIGKILLs itself after N batches
of its first life. torchrun stops the other rank and starts both again; each resumes from its log's last
state. The launcher checks that over both lives each epoch's ids over the ranks are the dataset,
each once, and reports how long each life took to its first batch.
Output: a table and OUT/torchrun_ranks.json.

Usage: torchrun_ranks.py [--nproc 2] [--loaders 6] [--samples 2048] [--epochs 20]
                         [--kill-after N] [--kill-epochs 3] [--kill-rank 1] [--out DIR]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

SIDE = 512


def bad_pixels(torch, x, y):
    """Pixels of images ``x`` that are not their ids' (``y``): a tensor on their device."""
    want = (y % 251).to(torch.float32).view(-1, 1, 1)
    return (x != want).sum()


def rank_main(args):
    import torch

    import pinring

    rank = int(os.environ.get("RANK", 0))
    with pinring.Loader(config=args.config, loaders=args.loaders, timeout=120) as loader:
        per_epoch = len(loader)
        dev = torch.device(loader.device)

        def sync():
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)

        seen = []
        bad = torch.zeros((), dtype=torch.int64, device=dev)
        t0 = moved = None
        for epoch in range(args.epochs):
            if epoch == 1:
                sync()
                t0, moved = time.perf_counter(), 0
            ids = []
            for b in loader:
                x, y = b["images"], b["labels"]
                bad += bad_pixels(torch, x, y)  # on the device: no wait per batch
                ids.append(y.clone())  # a copy: a kept view would hold the batch buffer
                if moved is not None:
                    moved += x.numel() * x.element_size()
            seen.append(torch.cat(ids).cpu().tolist())
        sync()
        wall = time.perf_counter() - t0
        report = {"rank": rank, "world": int(os.environ.get("WORLD_SIZE", 1)),
                  "ring": loader.ring, "device": str(dev), "batches_per_epoch": per_epoch,
                  "gbps": moved / wall / 1e9, "wall_s": wall, "bad_pixels": int(bad), "seen": seen}
    with open(os.path.join(args.out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)


def rank_resume(args):
    """A rank of the ``killed`` run: resumes from its log, checkpoints after every batch."""
    import signal

    import torch

    import pinring
    from pinring.loader import torch_tensors

    began = time.perf_counter()
    rank = int(os.environ["RANK"])
    life = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    log = os.path.join(args.out_dir, f"log{rank}.jsonl")
    state = None
    if os.path.exists(log):
        with open(log) as f:
            for line in f:
                state = json.loads(line)["state"]
    first = device = None
    taken = 0
    # The first life keeps the ranks in step (a barrier after every batch, as a DDP step's
    # all-reduce would), so that the kill finds every rank mid-plan; the second runs free.
    group = None
    if life == 0:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        group = dist
    with pinring.Loader(config=args.config, loaders=args.loaders, timeout=120) as loader, \
            open(log, "a", buffering=1) as f:
        if state is not None:
            loader.load_state_dict(state)
        for b in loader.batches():
            x, y = torch_tensors(torch, [b.fields["images"], b.fields["labels"]])
            bad = int(bad_pixels(torch, x, y))
            ids = y.cpu().tolist()
            epoch, device = b.epoch, x.device
            del x, y, b
            if first is None:
                first = time.perf_counter() - began
            # One line, one write: a SIGKILL leaves whole lines only.
            f.write(json.dumps({"life": life, "epoch": epoch, "ids": ids, "bad": bad,
                                "state": loader.state_dict()}) + "\n")
            taken += 1
            if rank == args.kill_rank and life == 0 and taken == args.kill_after:
                os.kill(os.getpid(), signal.SIGKILL)
            if group is not None:
                group.barrier()
    if group is not None:
        group.destroy_process_group()
    with open(os.path.join(args.out_dir, f"life{rank}-{life}.json"), "w") as f:
        json.dump({"rank": rank, "life": life, "device": str(device), "taken": taken,
                   "first_batch_s": first, "resumed_at": state}, f)


def torchrun(a, config, nproc, out, *extra, launch=()):
    """Runs this script's ranks under ``torchrun --standalone`` (``launch``: more of torchrun's
    arguments; ``extra``: the ranks'); returns its wall time, or exits with its output."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", *launch,
           f"--nproc-per-node={nproc}", os.path.abspath(__file__), "--rank-mode",
           "--config", config, "--loaders", str(a.loaders), "--out-dir", out, *extra]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=500)
    if r.returncode != 0:
        sys.stdout.write(r.stdout[-3000:] + r.stderr[-6000:])
        raise SystemExit(f"torchrun {' '.join(launch)} with {nproc} ranks exited {r.returncode}")
    return time.perf_counter() - t0


def check_each_epoch_once(tag, ids_by_epoch, samples):
    """Exits unless every epoch's ids (over the ranks) are the dataset, each once."""
    for e, ids in enumerate(ids_by_epoch):
        if sorted(ids) != list(range(samples)):
            raise SystemExit(f"{tag}: epoch {e}: the ranks' ids are not the dataset, each once "
                             f"({len(ids)} ids)")


def run_killed(a, d):
    """The ``killed`` run: rank --kill-rank killed once, the job restarted (--max-restarts=1)."""
    out = os.path.join(d, "killed")
    os.makedirs(out)
    wall = torchrun(a, write_config(d, "killed", a.kill_epochs), a.nproc, out,
                    "--kill-after", str(a.kill_after), "--kill-rank", str(a.kill_rank),
                    launch=("--max-restarts=1",))
    seen = {}
    bad = 0
    per_life = {}  # (rank, life): batches taken and checkpointed
    for rank in range(a.nproc):
        with open(os.path.join(out, f"log{rank}.jsonl")) as f:
            for line in f:
                rec = json.loads(line)
                seen.setdefault(rec["epoch"], []).extend(rec["ids"])
                bad += rec["bad"]
                key = f"rank{rank} life{rec['life']}"
                per_life[key] = per_life.get(key, 0) + 1
    check_each_epoch_once("killed (both lives)", [seen.get(e, []) for e in range(a.kill_epochs)],
                          a.samples)
    if bad:
        raise SystemExit(f"killed: {bad} pixels not their id's")
    lives = []
    for name in sorted(os.listdir(out)):
        if name.startswith("life"):
            lives.append(json.load(open(os.path.join(out, name))))
    if not any(x["rank"] == a.kill_rank and x["life"] == 1 for x in lives):
        raise SystemExit(f"killed: rank {a.kill_rank} has no second life: the kill did not happen")
    return {"run": "killed", "wall_s": wall, "epochs": a.kill_epochs, "lives": lives,
            "batches": per_life}


def write_data(d, n):
    images = np.lib.format.open_memmap(os.path.join(d, "images.npy"), "w+", np.float32,
                                       (n, SIDE, SIDE))
    for i in range(n):
        images[i] = i % 251
    images.flush()
    del images
    np.save(os.path.join(d, "ids.npy"), np.arange(n, dtype=np.int64))


def write_config(d, name, epochs):
    """The config of the data in ``d`` (batches of 32, shuffled) for ``epochs`` epochs: its path."""
    path = os.path.join(d, f"{name}.toml")
    with open(path, "w") as f:
        f.write(
            '[dataset]\nkind = "npy"\n[dataset.npy]\n'
            f'path = "{d}/images.npy"\nfield = "images"\ndtype = "f32"\nshape = [{SIDE}, {SIDE}]\n'
            f'labels = "{d}/ids.npy"\n'
            "[plan]\nbatch_size = 32\nshuffle = true\ndrop_last = true\n"
            f"epochs = {epochs}\n"
        )
    return path


def run(a, d, nproc, tag):
    out = os.path.join(d, tag)
    os.makedirs(out)
    torchrun(a, os.path.join(d, "data.toml"), nproc, out, "--epochs", str(a.epochs))
    ranks = [json.load(open(os.path.join(out, f"rank{i}.json"))) for i in range(nproc)]
    check_each_epoch_once(tag, [[i for rk in ranks for i in rk["seen"][e]]
                                for e in range(a.epochs)], a.samples)
    for rk in ranks:
        if rk["bad_pixels"]:
            raise SystemExit(f"{tag}: rank {rk['rank']}: {rk['bad_pixels']} pixels not its id's")
        del rk["seen"]
    return ranks


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rank-mode", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--config")
    p.add_argument("--out-dir")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--loaders", type=int, default=6)
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--kill-after", type=int, default=0)
    p.add_argument("--kill-epochs", type=int, default=3)
    p.add_argument("--kill-rank", type=int, default=1)
    p.add_argument("--out", default=".")
    a = p.parse_args()
    if a.rank_mode:
        return rank_resume(a) if a.kill_after else rank_main(a)
    os.makedirs(a.out, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        write_data(d, a.samples)
        if a.epochs:
            write_config(d, "data", a.epochs)
        runs = ((f"together{a.nproc}", a.nproc), ("alone", 1), (f"together{a.nproc}b", a.nproc))
        for tag, n in runs if a.epochs else ():
            for rk in run(a, d, n, tag):
                rows.append({"run": tag, **rk})
                print(f"{tag:12} rank {rk['rank']} of {rk['world']}  {rk['device']}  ring "
                      f"{rk['ring']:16} {rk['gbps']:6.2f} GB/s  ({rk['batches_per_epoch']} "
                      f"batches/epoch, every id once per epoch, every pixel its id's)", flush=True)
        if a.kill_after:
            k = run_killed(a, d)
            rows.append(k)
            for x in sorted(k["lives"], key=lambda x: (x["life"], x["rank"])):
                print(f"killed       rank {x['rank']} life {x['life']}  {x['device']}  "
                      + (f"{x['taken']} batches, first after {x['first_batch_s']:.2f} s"
                         if x["taken"] else "nothing left to take")
                      + (f", resumed at seq {x['resumed_at']['seq']}" if x["resumed_at"] else ""),
                      flush=True)
            print(f"killed       batches checkpointed: {k['batches']}", flush=True)
            print(f"killed       {k['wall_s']:.1f} s in all; over both lives every id once in "
                  f"each of {a.kill_epochs} epochs, every pixel its id's", flush=True)
    with open(os.path.join(a.out, "torchrun_ranks.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
