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
Output: a table and OUT/torchrun_ranks.json.

Usage: torchrun_ranks.py [--nproc 2] [--loaders 6] [--samples 2048] [--epochs 20] [--out DIR]
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
                want = (y % 251).to(torch.float32).view(-1, 1, 1)
                bad += (x != want).sum()  # on the device: no wait per batch
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


def write_data(d, n):
    images = np.lib.format.open_memmap(os.path.join(d, "images.npy"), "w+", np.float32,
                                       (n, SIDE, SIDE))
    for i in range(n):
        images[i] = i % 251
    images.flush()
    del images
    np.save(os.path.join(d, "ids.npy"), np.arange(n, dtype=np.int64))


def run(a, d, nproc, tag):
    out = os.path.join(d, tag)
    os.makedirs(out)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", os.path.abspath(__file__), "--rank-mode",
           "--config", os.path.join(d, "data.toml"), "--loaders", str(a.loaders), "--epochs",
           str(a.epochs), "--out-dir", out]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=500)
    if r.returncode != 0:
        sys.stdout.write(r.stdout[-3000:] + r.stderr[-6000:])
        raise SystemExit(f"torchrun with {nproc} ranks exited {r.returncode}")
    ranks = [json.load(open(os.path.join(out, f"rank{i}.json"))) for i in range(nproc)]
    for e in range(a.epochs):
        union = sorted(i for rk in ranks for i in rk["seen"][e])
        if union != list(range(a.samples)):
            raise SystemExit(f"{tag}: epoch {e}: the ranks' ids are not the dataset, each once")
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
    p.add_argument("--out", default=".")
    a = p.parse_args()
    if a.rank_mode:
        return rank_main(a)
    os.makedirs(a.out, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        write_data(d, a.samples)
        with open(os.path.join(d, "data.toml"), "w") as f:
            f.write(
                '[dataset]\nkind = "npy"\n[dataset.npy]\n'
                f'path = "{d}/images.npy"\nfield = "images"\ndtype = "f32"\nshape = [{SIDE}, {SIDE}]\n'
                f'labels = "{d}/ids.npy"\n'
                "[plan]\nbatch_size = 32\nshuffle = true\ndrop_last = true\n"
                f"epochs = {a.epochs}\n"
            )
        for tag, n in ((f"together{a.nproc}", a.nproc), ("alone", 1), (f"together{a.nproc}b", a.nproc)):
            for rk in run(a, d, n, tag):
                rows.append({"run": tag, **rk})
                print(f"{tag:12} rank {rk['rank']} of {rk['world']}  {rk['device']}  ring "
                      f"{rk['ring']:16} {rk['gbps']:6.2f} GB/s  ({rk['batches_per_epoch']} "
                      f"batches/epoch, every id once per epoch, every pixel its id's)", flush=True)
    with open(os.path.join(a.out, "torchrun_ranks.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
