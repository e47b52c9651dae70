#!/usr/bin/env python3
"""The same Dataset through ``torch.utils.data.DataLoader`` and through
``pinring.torch.DataLoader``, side by side in one run, on one GPU.

Cases (each a Dataset class that both loaders take as it is):
  seed   512x512 f32 samples and an int label, batch 32 (the seed workload's shape). A sample is
         a row of a 16-sample base array picked by index: __getitem__ costs next to nothing,
         so the loader's own transport is what is measured.
  jpeg   JPEG files (500x375, quality 90, made by this script first), decoded with PIL,
         torchvision's RandomResizedCrop(224) and RandomHorizontalFlip, returned as u8 HWC
         224x224x3 arrays with an int label; batch 256.

For each --workers value: torch's DataLoader at every (pin_memory, prefetch_factor) pair of
--pin x --prefetch, with ``persistent_workers=True`` and ``.to(device, non_blocking=True)``; then
``pinring.torch.DataLoader`` with the same ``num_workers`` (embedded daemon, CUDA), whose batches
are already on the device. Each run takes --warmup batches, then times --batches batches
between two ``torch.cuda.synchronize()`` calls. Measured: samples/s, GB/s of batch data, and the
trainer process's CPU seconds per batch (``time.process_time()``: all its threads, the
DataLoader's pin thread or pinring's embedded daemon).

Output: a table, OUT/torch_loader_CASE.csv, and one JSON line per case (the best of each loader).

Usage: torch_loader.py --case seed|jpeg [--workers 4,8,12] [--pin 1,0] [--prefetch 2,4]
                       [--batches N] [--warmup N] [--images N] [--out DIR] [--device cuda]
"""

import argparse
import csv
import io
import json
import os
import tempfile
import time

import numpy as np
import torch


class SeedSamples(torch.utils.data.Dataset):
    """512x512 f32 samples, each a row of a small base array, with labels in [0, 1000)."""

    def __init__(self, n=65536, shape=(512, 512)):
        self.n = n
        self.base = np.random.default_rng(0).standard_normal((16, *shape), dtype=np.float32)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.base[i % 16], i % 1000


class JpegSamples(torch.utils.data.Dataset):
    """JPEG files decoded with PIL, RandomResizedCrop(224) + flip, u8 HWC, and a label."""

    def __init__(self, files, size=224):
        self.files = files
        self.size = size
        self.tf = None

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        from PIL import Image
        from torchvision import transforms

        if self.tf is None:
            self.tf = transforms.Compose(
                [transforms.RandomResizedCrop(self.size), transforms.RandomHorizontalFlip()]
            )
        with Image.open(self.files[i]) as im:
            img = self.tf(im.convert("RGB"))
        return np.asarray(img, dtype=np.uint8), i % 1000


def make_jpegs(d, n):
    """n 500x375 JPEGs (smooth gradients plus noise, about ImageNet's 100 KB), in d."""
    from PIL import Image

    rng = np.random.default_rng(1)
    y, x = np.mgrid[0:375, 0:500]
    files = []
    for i in range(n):
        base = np.stack([(x * (i % 7 + 1)) % 256, (y * (i % 5 + 1)) % 256, (x + y + i) % 256], -1)
        img = np.clip(base + rng.normal(0, 24, base.shape), 0, 255).astype(np.uint8)
        path = os.path.join(d, f"{i:06d}.jpg")
        Image.fromarray(img).save(path, quality=90)
        files.append(path)
    return files


def run(make_iter, batches, warmup, device):
    it = make_iter()
    for _ in range(warmup):
        batch = next(it)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda d: None)
    sync(device)
    t0, c0 = time.perf_counter(), time.process_time()
    samples = nbytes = 0
    for _ in range(batches):
        x, y = next(it)
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        samples += x.shape[0]
        nbytes += x.nbytes + y.nbytes
        batch = (x, y)
    sync(device)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    del batch
    return {"samples_per_s": samples / wall, "gb_per_s": nbytes / wall / 1e9,
            "cpu_s_per_batch": cpu / batches}


def endless(loader):
    while True:
        yield from loader


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", choices=["seed", "jpeg"], required=True)
    ap.add_argument("--workers", default="4,8,12")
    ap.add_argument("--pin", default="1,0")
    ap.add_argument("--prefetch", default="2,4")
    ap.add_argument("--batches", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--images", type=int, default=3072)
    ap.add_argument("--out", default=".")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    from pinring.torch import DataLoader as PinringLoader

    device = torch.device(a.device)
    tmp = tempfile.mkdtemp(prefix="pinring-bench-")
    if a.case == "seed":
        data, batch_size = SeedSamples(), 32
        batches, warmup = a.batches or 400, a.warmup or 40
    else:
        t = time.perf_counter()
        data, batch_size = JpegSamples(make_jpegs(tmp, a.images)), 256
        print(f"made {a.images} JPEGs in {time.perf_counter() - t:.1f} s", flush=True)
        batches, warmup = a.batches or 40, a.warmup or 6
    rows = []
    for w in [int(v) for v in a.workers.split(",")]:
        for pin in [bool(int(v)) for v in a.pin.split(",")]:
            for pf in [int(v) for v in a.prefetch.split(",")]:
                dl = torch.utils.data.DataLoader(
                    data, batch_size=batch_size, shuffle=True, num_workers=w, pin_memory=pin,
                    prefetch_factor=pf, persistent_workers=True, drop_last=True,
                    multiprocessing_context="spawn",
                )
                try:
                    r = run(lambda: endless(dl), batches, warmup, device)
                except RuntimeError as e:  # a DataLoader worker died: recorded, not fatal
                    print(f"torch DataLoader workers={w} pin={pin} prefetch={pf} failed: {e}")
                    continue
                finally:
                    del dl
                rows.append({"case": a.case, "loader": "torch", "workers": w, "pin": int(pin),
                             "prefetch": pf, **r})
                print(rows[-1], flush=True)
        pl = PinringLoader(data, batch_size=batch_size, shuffle=True, num_workers=w,
                           drop_last=True, device=device)
        r = run(lambda: endless(pl), batches, warmup, device)
        pl.close()
        rows.append({"case": a.case, "loader": "pinring", "workers": w, "pin": 1, "prefetch": 0,
                     **r, "restarts": pl.worker_restarts})
        print(rows[-1], flush=True)
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, f"torch_loader_{a.case}.csv")
    keys = ["case", "loader", "workers", "pin", "prefetch", "samples_per_s", "gb_per_s",
            "cpu_s_per_batch"]
    with open(path, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        wr.writeheader()
        wr.writerows(rows)
    print(f"{'loader':8} {'workers':>7} {'pin':>3} {'pf':>3} {'samples/s':>10} {'GB/s':>6} {'cpu ms/batch':>12}")
    for r in rows:
        print(f"{r['loader']:8} {r['workers']:7} {r['pin']:3} {r['prefetch']:3} "
              f"{r['samples_per_s']:10.1f} {r['gb_per_s']:6.2f} {r['cpu_s_per_batch'] * 1e3:12.2f}")
    best = {}
    for r in rows:
        if r["samples_per_s"] > best.get(r["loader"], {}).get("samples_per_s", 0):
            best[r["loader"]] = r
    print(json.dumps({"case": a.case, "best": best,
                      "ratio": best["pinring"]["samples_per_s"] / best["torch"]["samples_per_s"]}))


if __name__ == "__main__":
    main()
