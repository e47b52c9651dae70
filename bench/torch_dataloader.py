#!/usr/bin/env python3
"""PyTorch's DataLoader and pinring side by side: the same batches (32 samples of 512x512 float32,
32 MiB each), onto the same GPU, in the same run.

PyTorch is measured at its best: the dataset's __getitem__ returns a tensor from a small
pre-generated pool (no per-sample generation or decoding cost), workers are persistent, the
first batches (worker start-up, CUDA context, allocator warm-up) are not timed, and the clock is
read only after torch.cuda.synchronize(). Each batch is copied to the GPU with
.cuda(non_blocking=pin_memory).

pinring runs its daemon (cuda backend, discard sink) and N loader processes on a config with the
same shapes; its loaders *generate* every byte (the synthetic dataset), so it does strictly more
work per batch than the PyTorch side. GB/s is payload bytes per second on both sides.

Usage: torch_dataloader.py --pinring DIR [--out DIR] [--batches N] [--warm N]
(DIR holds the pinring binary.)
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
from torch.utils.data import DataLoader, Dataset

SHAPE = (512, 512)
BATCH = 32
BATCH_BYTES = BATCH * SHAPE[0] * SHAPE[1] * 4


class PooledSynthetic(Dataset):
    """n samples served from a pool of pre-generated tensors."""

    def __init__(self, n, pool=64):
        g = torch.Generator().manual_seed(0)
        self.pool = [torch.randn(SHAPE, generator=g) for _ in range(pool)]
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.pool[i % len(self.pool)]


def torch_gbps(workers, pin, batches, warm):
    ds = PooledSynthetic((batches + warm) * BATCH)
    kwargs = dict(batch_size=BATCH, num_workers=workers, pin_memory=pin, shuffle=False)
    if workers > 0:
        kwargs.update(persistent_workers=True, prefetch_factor=4)
    loader = DataLoader(ds, **kwargs)
    it = iter(loader)
    for _ in range(warm):
        x = next(it).cuda(non_blocking=pin)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    n = 0
    for b in it:
        x = b.cuda(non_blocking=pin)
        n += 1
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    del x, it, loader
    return n * BATCH_BYTES / dt / 1e9, n, dt


PINRING_CONFIG = """
[ring]
name = "{ring}"
slots = {slots}
[dataset]
samples = {samples}
sample_shape = [512, 512]
dtype = "f32"
[plan]
batch_size = 32
epochs = 1
"""


def pinring_run(exe, loaders, batches, slots, out):
    ring = f"torchcmp-{os.getpid()}"
    with tempfile.TemporaryDirectory() as d:
        cfg = os.path.join(d, "cmp.toml")
        with open(cfg, "w") as f:
            f.write(PINRING_CONFIG.format(ring=ring, slots=slots, samples=batches * BATCH))
        summary = os.path.join(out, f"pinring-{loaders}-loaders.json")
        env = dict(os.environ, RUST_LOG="warn")
        daemon = subprocess.Popen(
            [exe, "daemon", "--config", cfg, "--backend", "cuda", "--sink", "discard",
             "--summary", summary], env=env)
        kids = [subprocess.Popen([exe, "loader", "--config", cfg, "--wait-secs", "60"], env=env)
                for _ in range(loaders)]
        rc = daemon.wait(timeout=600)
        for k in kids:
            k.wait(timeout=30)
        if rc != 0:
            raise SystemExit(f"pinring daemon exited with {rc}")
        with open(summary) as f:
            return json.load(f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pinring", required=True, help="directory holding the pinring binary")
    ap.add_argument("--out", default=".")
    ap.add_argument("--batches", type=int, default=100)
    ap.add_argument("--warm", type=int, default=10)
    ap.add_argument("--pinring-batches", type=int, default=600)
    ap.add_argument("--slots", type=int, default=12)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    exe = os.path.join(args.pinring, "pinring")
    dev = torch.cuda.get_device_name(0)
    print(f"GPU: {dev}; torch {torch.__version__}; {os.cpu_count()} CPUs; "
          f"batch {BATCH} x {SHAPE[0]}x{SHAPE[1]} float32 = {BATCH_BYTES / 2**20:.0f} MiB")
    results = {"gpu": dev, "torch": torch.__version__, "batch_bytes": BATCH_BYTES, "torch_runs": [],
               "pinring_runs": []}
    print(f"{'pipeline':<36} {'GB/s':>8} {'batches':>8} {'seconds':>8}")
    for workers in (0, 4, 8):
        for pin in (False, True):
            gbps, n, dt = torch_gbps(workers, pin, args.batches, args.warm)
            name = f"DataLoader workers={workers} pin_memory={pin}"
            print(f"{name:<36} {gbps:>8.2f} {n:>8} {dt:>8.2f}", flush=True)
            results["torch_runs"].append(dict(workers=workers, pin_memory=pin, gbps=gbps,
                                              batches=n, seconds=dt))
    for loaders in (4, 8, 12):
        s = pinring_run(exe, loaders, args.pinring_batches, args.slots, args.out)
        name = f"pinring loaders={loaders}"
        print(f"{name:<36} {s['gbps']:>8.2f} {s['batches_delivered']:>8} {s['seconds']:>8.2f}"
              f"   bound={s['bound']}", flush=True)
        results["pinring_runs"].append(dict(loaders=loaders, summary=s))
    ref = next(r for r in results["torch_runs"] if r["workers"] == 8 and r["pin_memory"])
    best = max(results["pinring_runs"], key=lambda r: r["summary"]["gbps"])
    p8 = next(r for r in results["pinring_runs"] if r["loaders"] == 8)
    ratio8 = p8["summary"]["gbps"] / ref["gbps"]
    print(f"\npinring (8 loaders) / DataLoader (8 workers, pin_memory=True): "
          f"{p8['summary']['gbps']:.2f} / {ref['gbps']:.2f} = {ratio8:.1f}x")
    print(f"best pinring ({best['loaders']} loaders): {best['summary']['gbps']:.2f} GB/s = "
          f"{best['summary']['gbps'] / ref['gbps']:.1f}x")
    results["ratio_8_loaders_vs_8_workers_pinned"] = ratio8
    with open(os.path.join(args.out, "torch_vs_pinring.json"), "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
