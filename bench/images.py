#!/usr/bin/env python3
"""Images and tokens from files, read by pinring's Rust loaders, side by side with PyTorch's
DataLoader on the same files, in one run, on one GPU.

Parts (--parts, default all of them, in this order):
  sweep     images/s of the input pipeline alone (no training) against the number of loader
            processes: torch's DataLoader with 1..15 PIL workers (--sweep-workers) and pinring
            with 1..12 `pinring-loader` processes (--sweep-loaders). The one-process points
            are the per-process comparison.
  resnet    a ResNet-50 training step (torchvision, weights=None, 1000 classes, channels_last,
            bf16 autocast, SGD with momentum) on batches of 256 images: from a batch already
            on the device (the ceiling), fed by the DataLoader (--dl-workers PIL workers), and
            fed by pinring (--loaders loader processes, each a list entry).
  tokens    GB/s of a `kind = "tokens"` ring (u16 token file of --tokens-gb GB, seq_len 2048,
            i64 fields, batch 64, 8 loaders, consumer in this process), page-cached and cold
            (posix_fadvise(DONTNEED) on the file first), with the disk's sequential read rate
            (O_DIRECT) beside the cold figure.

Images: --images JPEGs of 500x375 (quality 90, ~100 KB, bench/torch_loader.py's make_jpeg) in
torchvision's ImageFolder layout under --classes class directories, made first by a process
pool. Both loaders do the same work per image: decode, RandomResizedCrop(224) with scale
(0.08, 1) and ratio (3/4, 4/3), horizontal flip half of the time, u8 HWC out:
  DataLoader  PIL (`Image.open(...).convert("RGB")`) and torchvision's PIL transforms, in
              `num_workers` spawned workers, pin_memory=True, prefetch_factor=2,
              persistent_workers, shuffle, batch 256, `.to(device, non_blocking=True)`; its
              epoch is 400 batches long (index i reads file i % --images), so no window crosses
              an epoch's end.
  pinring     `kind = "imagefolder"` with `[dataset.image] transform = "train"`, output u8;
              the daemon embedded in this process (`pinring.Loader(embedded=True)`), CUDA;
              N `pinring-loader` processes.
On the device both batches go through the same normalisation: u8 NHWC -> f32 NCHW
(channels_last), (x/255 - mean)/std.

Windows: the DataLoader's w workers each make one whole batch per "wave", so its windows hold
whole waves: 2w batches of warm-up, --waves x w measured (at least --min-batches). pinring's
loaders fill parts of one batch together: the same counts at its loader count. Each window is
timed between two torch.cuda.synchronize() calls.

Output: tables on stdout, OUT/images_sweep.csv, OUT/images_resnet.csv, OUT/images_tokens.csv,
and one JSON line at the end.

Usage: images.py [--parts sweep,resnet,tokens] [--images 2048] [--sweep-workers 1,2,4,8,12,15]
                 [--sweep-loaders 1,2,4,8,12] [--dl-workers 15] [--loaders 8,12]
                 [--steps 60] [--tokens-gb 4] [--bin-dir DIR] [--out DIR]
DIR holds pinring-loader (default: $PINRING_BIN_DIR, else ./bin).
"""

import argparse
import csv
import gc
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_loader import JpegSamples, make_jpegs  # noqa: E402
from trainer import binary, close_pinring, make_step, measure, measure_ring, open_pinring  # noqa: E402

BATCH = 256
CROP = 224

IMAGE_CONFIG = """\
[ring]
slot_bytes = "auto"
[dataset]
kind = "imagefolder"
[dataset.imagefolder]
root = "{root}"
[dataset.image]
transform = "train"
crop = {crop}
output = "u8"
[plan]
batch_size = {batch}
shuffle = true
epochs = {epochs}
drop_last = true
"""

TOKENS_CONFIG = """\
[ring]
slot_bytes = "auto"
[dataset]
kind = "tokens"
[dataset.tokens]
files = ["{path}"]
token_dtype = "u16"
seq_len = {seq_len}
[plan]
batch_size = {batch}
shuffle = {shuffle}
epochs = 1
drop_last = true
"""


class Normalise:
    """u8 NHWC batches on the device -> f32 NCHW (channels_last strides), ImageNet-normalised."""

    def __init__(self, dev):
        self.mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1) * 255
        self.std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1) * 255

    def __call__(self, u8_nhwc):
        x = u8_nhwc.permute(0, 3, 1, 2).float()
        return (x - self.mean) / self.std


def resnet_step(dev):
    """A ResNet-50 training step (trainer.py's make_step) on u8 NHWC batches, normalised on the
    device, channels_last."""
    from torchvision.models import resnet50

    model = resnet50(weights=None, num_classes=1000).to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return make_step(model, opt, dev, True, prepare=Normalise(dev))


def noop_step(dev):
    """The pipeline alone: the batch reaches the device, nothing else."""

    def step(images, labels):
        if images.device != dev:
            images = images.to(dev, non_blocking=True)
            labels = labels.to(dev, non_blocking=True)
        return None

    return step


def window(a, procs):
    return 2 * procs, max(a.min_batches, a.waves * procs)


def dataloader_fetch(files, workers, dev):
    ds = JpegSamples(files, size=CROP, length=400 * BATCH)
    dl = torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=workers,
                                     pin_memory=dev.type == "cuda", prefetch_factor=2,
                                     persistent_workers=True, drop_last=True,
                                     multiprocessing_context="spawn")
    it = iter(dl)

    def fetch():
        x, y = next(it)
        return x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)

    def close():
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        gc.collect()

    return fetch, close


def run_dataloader(a, files, workers, dev, step):
    warmup, batches = window(a, workers)
    fetch, close = dataloader_fetch(files, workers, dev)
    try:
        return measure(step, fetch, dev, warmup, batches, batch=BATCH)
    finally:
        close()


def run_pinring(a, tmp, root, loaders, dev, step, tag, mode="embedded"):
    """`mode`: embedded (the daemon on threads of this process), attached (a pinring-daemon
    process, the trainer copying out of the ring: daemon.copies = "consumer") or attached-daemon
    (daemon.copies = "daemon": the daemon copies, the trainer opens its buffers through CUDA IPC)."""
    warmup, batches = window(a, loaders)
    per_epoch = a.images // BATCH
    epochs = (warmup + batches) // per_epoch + 2
    text = IMAGE_CONFIG.format(root=root, crop=CROP, batch=BATCH, epochs=epochs)
    embedded = mode == "embedded"
    copies = "daemon" if mode == "attached-daemon" else None
    ring, loader = open_pinring(a, tmp, embedded, loaders, f"{tag}{mode}", warmup + batches, config_text=text,
                                copies=copies)
    r, summary = measure_ring(ring, loader, embedded, step, dev, warmup, batches, batch=BATCH)
    summary = summary or {}
    r["bad_samples_skipped"] = summary.get("bad_samples_skipped")
    return r


def write_csv(path, rows, keys):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def part_sweep(a, tmp, root, files, dev):
    rows = []
    step = noop_step(dev)
    runs = [("torch-pil", int(v)) for v in a.sweep_workers.split(",") if v]
    runs += [("pinring", int(v)) for v in a.sweep_loaders.split(",") if v]
    for loader, n in runs:
        if loader == "torch-pil":
            r = run_dataloader(a, files, n, dev, step)
        else:
            r = run_pinring(a, tmp, root, n, dev, step, f"sweep{n}")
        rows.append({"loader": loader, "procs": n, **r})
        print(f"sweep {loader} procs={n}: {r['samples_per_s']:.0f} images/s", flush=True)
        # After every point, so a sweep cut short by a time limit keeps what it measured.
        write_csv(os.path.join(a.out, "images_sweep.csv"), rows,
                  ["loader", "procs", "samples_per_s", "cpu_s_per_step", "steps", "wall_s"])
    print(f"{'loader':10} {'procs':>5} {'images/s':>9} {'per process':>11}")
    for r in rows:
        print(f"{r['loader']:10} {r['procs']:5} {r['samples_per_s']:9.0f} "
              f"{r['samples_per_s'] / r['procs']:11.0f}")
    one = {r["loader"]: r["samples_per_s"] for r in rows if r["procs"] == 1}
    out = {"rows": [(r["loader"], r["procs"], round(r["samples_per_s"], 1)) for r in rows]}
    if "torch-pil" in one and "pinring" in one:
        out["per_process_ratio"] = one["pinring"] / one["torch-pil"]
        print(f"one process: pinring-loader {one['pinring']:.0f} images/s, PIL worker "
              f"{one['torch-pil']:.0f}: {out['per_process_ratio']:.2f}x")
    return out


def part_resnet(a, tmp, root, files, dev):
    step = resnet_step(dev)
    rows = []
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randint(0, 256, (BATCH, CROP, CROP, 3), generator=g, device=dev, dtype=torch.uint8)
    y = torch.randint(0, 1000, (BATCH,), generator=g, device=dev)
    r = measure(step, lambda: (x, y), dev, 10, a.steps, batch=BATCH)
    rows.append({"config": "on-device", "procs": 0, **r})
    print(f"resnet on-device: {r['samples_per_s']:.0f} images/s", flush=True)
    old = a.min_batches
    a.min_batches = a.steps
    try:
        for n in [int(v) for v in a.dl_workers.split(",") if v]:
            r = run_dataloader(a, files, n, dev, step)
            rows.append({"config": "dataloader", "procs": n, **r})
            print(f"resnet dataloader workers={n}: {r['samples_per_s']:.0f} images/s, data wait "
                  f"{r['data_wait_fraction']:.0%}", flush=True)
        for _ in range(a.rounds):
            for n in [int(v) for v in a.loaders.split(",") if v]:
                for mode in a.pinring_modes.split(","):
                    r = run_pinring(a, tmp, root, n, dev, step, f"resnet{n}", mode)
                    config = "pinring" if mode == "embedded" else f"pinring-{mode}"
                    rows.append({"config": config, "procs": n, **r})
                    print(f"resnet {config} loaders={n}: {r['samples_per_s']:.0f} images/s, data wait "
                          f"{r['data_wait_fraction']:.0%}", flush=True)
    finally:
        a.min_batches = old
    keys = ["config", "procs", "samples_per_s", "step_ms_p50", "step_ms_p90",
            "data_wait_fraction", "gpu_idle_fraction", "cpu_s_per_step", "steps"]
    write_csv(os.path.join(a.out, "images_resnet.csv"), rows, keys)
    print(f"{'config':24} {'procs':>5} {'images/s':>9} {'step p50 ms':>11} {'data wait':>9} "
          f"{'gpu idle':>8} {'cpu ms/step':>11}")
    for r in rows:
        print(f"{r['config']:24} {r['procs']:5} {r['samples_per_s']:9.0f} {r['step_ms_p50']:11.1f} "
              f"{r['data_wait_fraction']:9.0%} {r['gpu_idle_fraction']:8.0%} "
              f"{r['cpu_s_per_step'] * 1e3:11.1f}")
    return {"rows": [(r["config"], r["procs"], round(r["samples_per_s"], 1)) for r in rows]}


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def disk_rate(path):
    """Sequential O_DIRECT read rate of the file (GB/s), with dd."""
    drop_cache(path)
    t = time.perf_counter()
    out = subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=16M", "iflag=direct"],
                         capture_output=True, text=True)
    wall = time.perf_counter() - t
    if out.returncode != 0:
        return None
    return os.path.getsize(path) / wall / 1e9


def tokens_run(a, tmp, path, shuffle, cold, dev, tag):
    seq_len = 2048
    text = TOKENS_CONFIG.format(path=path, seq_len=seq_len, batch=64,
                                shuffle=str(shuffle).lower())
    if cold:
        drop_cache(path)
    ring, loader = open_pinring(a, tmp, True, 8, tag, 0, config_text=text)
    try:
        n = nbytes = 0
        t0 = time.perf_counter()
        for b in loader:
            n += 1
            nbytes += b["input_ids"].nbytes + b["targets"].nbytes
            if n >= a.token_batches:
                break
            del b
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        wall = time.perf_counter() - t0
    finally:
        gc.collect()
        close_pinring(ring, loader, True)
    token_bytes = n * 64 * (seq_len + 1) * 2
    return {"shuffle": int(shuffle), "cache": "cold" if cold else "cached", "batches": n,
            "batch_gb_per_s": nbytes / wall / 1e9, "file_gb_per_s": token_bytes / wall / 1e9}


def part_tokens(a, tmp, dev):
    path = os.path.join(tmp, "tokens.bin")
    n = int(a.tokens_gb * 1e9) // 2
    t = time.perf_counter()
    with open(path, "wb") as f:
        rng = np.random.default_rng(0)
        left = n
        while left:
            k = min(left, 1 << 26)
            f.write(rng.integers(0, 50257, k, dtype=np.uint16).tobytes())
            left -= k
    print(f"wrote {a.tokens_gb} GB of tokens in {time.perf_counter() - t:.1f} s", flush=True)
    disk = disk_rate(path)
    rows = []
    for shuffle in (False, True):
        for cold in (False, True):
            if not cold:  # page the file in first
                subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)
            r = tokens_run(a, tmp, path, shuffle, cold, dev, f"tok{int(shuffle)}{int(cold)}")
            r["disk_gb_per_s"] = disk
            rows.append(r)
            print(f"tokens shuffle={shuffle} {r['cache']}: file {r['file_gb_per_s']:.2f} GB/s, "
                  f"batches {r['batch_gb_per_s']:.2f} GB/s", flush=True)
    write_csv(os.path.join(a.out, "images_tokens.csv"), rows,
              ["shuffle", "cache", "batches", "file_gb_per_s", "batch_gb_per_s", "disk_gb_per_s"])
    print(f"disk, sequential O_DIRECT: {disk and round(disk, 2)} GB/s")
    os.unlink(path)
    return {"rows": rows, "disk_gb_per_s": disk}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="sweep,resnet,tokens")
    ap.add_argument("--images", type=int, default=2048)
    ap.add_argument("--classes", type=int, default=16)
    ap.add_argument("--sweep-workers", default="1,2,4,8,12,15")
    ap.add_argument("--sweep-loaders", default="1,2,4,8,12")
    ap.add_argument("--dl-workers", default="15")
    ap.add_argument("--loaders", default="8,12")
    ap.add_argument("--pinring-modes", default="embedded",
                    help="resnet: pinring's daemon, a list: embedded, attached (the trainer copies), "
                         "attached-daemon (the daemon copies, CUDA IPC); alternated")
    ap.add_argument("--rounds", type=int, default=1, help="resnet: rounds of the pinring modes")
    ap.add_argument("--waves", type=int, default=3)
    ap.add_argument("--min-batches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--tokens-gb", type=float, default=4.0)
    ap.add_argument("--token-batches", type=int, default=10000)
    ap.add_argument("--bin-dir", default=os.environ.get("PINRING_BIN_DIR", "bin"))
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    dev = torch.device(a.device)
    a.device_index = dev.index or 0
    a.backend = "cuda" if dev.type == "cuda" else "host"
    a.ring_prefetch = None
    os.makedirs(a.out, exist_ok=True)
    binary(a, "pinring-loader")
    tmp = tempfile.mkdtemp(prefix="pinring-images-")
    parts = a.parts.split(",")
    out = {}
    if "sweep" in parts or "resnet" in parts:
        root = os.path.join(tmp, "train")
        t = time.perf_counter()
        files = make_jpegs(root, a.images, classes=a.classes)
        mb = sum(os.path.getsize(f) for f in files) / len(files) / 1e3
        print(f"made {a.images} JPEGs ({mb:.0f} KB each) in {time.perf_counter() - t:.1f} s",
              flush=True)
        if "sweep" in parts:
            out["sweep"] = part_sweep(a, tmp, root, files, dev)
        if "resnet" in parts:
            out["resnet"] = part_resnet(a, tmp, root, files, dev)
    if "tokens" in parts:
        out["tokens"] = part_tokens(a, tmp, dev)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
