#!/usr/bin/env python3
"""The two examples under examples/, run as a user runs them, on generated data, on one GPU.

  resnet  examples/train_resnet_webdataset.py on --images JPEGs (500x375, ~100 KB each,
          torch_loader.py's make_jpeg) in --shards WebDataset shards with .cls labels; batch
          256, crop 224, --loaders pinring-loader processes started by pinring.Loader itself.
          Each run first times the step on a batch resident on the device
          (--on-device-steps), then the fed loop, in the same process: the share is the
          example's own line.
  gpt     examples/train_gpt_tokens.py on a --tokens-m million-token u16 train.bin (random
          ids below 50257), GPT-2 small's shape (12 layers, 12 heads, 768, block 1024),
          batch 16, --gpt-loaders loaders: tokens/s and the GPU's idle share between steps.

Each is run --rounds times, alternated. Output: the examples' own lines, a table, and
OUT/examples.json (every run's parsed figures and its whole stdout).

Usage: examples.py [--parts resnet,gpt] [--images 4096] [--shards 16] [--loaders 12]
                   [--steps 150] [--on-device-steps 40] [--tokens-m 200] [--gpt-loaders 4]
                   [--gpt-steps 100] [--rounds 2] [--out DIR]
"""

import argparse
import io
import json
import math
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")
sys.path.insert(0, HERE)
from torch_loader import make_jpeg  # noqa: E402


def write_shard(path, first, count, classes=1000):
    """Shard of images first..first+count: KEY.jpg and KEY.cls, as WebDataset writes them."""
    with tempfile.TemporaryDirectory() as d, tarfile.open(path, "w") as tar:
        for i in range(first, first + count):
            jpg = make_jpeg(os.path.join(d, "x.jpg"), i)
            for ext, data in (("jpg", open(jpg, "rb").read()), ("cls", str(i % classes).encode())):
                info = tarfile.TarInfo(f"{i:08d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def make_shards(d, images, shards):
    per = images // shards
    with ProcessPoolExecutor(os.cpu_count()) as pool:
        jobs = [pool.submit(write_shard, os.path.join(d, f"train-{s:06d}.tar"), s * per, per)
                for s in range(shards)]
        return [j.result() for j in jobs]


def run(args):
    t = time.monotonic()
    r = subprocess.run([sys.executable, *args], capture_output=True, text=True)
    sys.stdout.write(r.stdout)
    if r.returncode != 0:
        sys.stdout.write(r.stderr[-4000:])
        raise SystemExit(f"{args[0]} exited {r.returncode}")
    return r.stdout, time.monotonic() - t


def figure(pattern, text, cast=float):
    m = re.search(pattern, text)
    return cast(m.group(1).replace(",", "")) if m else None


def resnet(a, shards):
    per_epoch = a.images // 256
    epochs = math.ceil((a.steps + 1) / per_epoch)
    out, wall = run([os.path.join(EXAMPLES, "train_resnet_webdataset.py"), "--shards", *shards,
                     "--loaders", str(a.loaders), "--steps", str(a.steps), "--epochs",
                     str(epochs), "--on-device-steps", str(a.on_device_steps)])
    return {
        "example": "resnet", "loaders": a.loaders, "wall_s": wall,
        "on_device_images_per_s": figure(r"on-device step: ([\d,.]+) images/s", out),
        "images_per_s": figure(r"s: ([\d,.]+) images/s", out),
        "share_of_on_device": figure(r"images/s, ([\d.]+)% of the on-device", out),
        "waiting": figure(r"waiting for batches ([\d.]+)%", out),
        "gpu_idle": figure(r"GPU idle between steps: ([\d.]+)%", out),
        "stdout": out,
    }


def gpt(a, data):
    out, wall = run([os.path.join(EXAMPLES, "train_gpt_tokens.py"), "--data", data,
                     "--loaders", str(a.gpt_loaders), "--steps", str(a.gpt_steps)])
    return {
        "example": "gpt", "loaders": a.gpt_loaders, "wall_s": wall,
        "tokens_per_s": figure(r"s: ([\d,.]+) tokens/s", out),
        "ms_per_step": figure(r"([\d.]+) ms/step", out),
        "waiting": figure(r"waiting for batches ([\d.]+)%", out),
        "gpu_idle": figure(r"GPU idle between steps: ([\d.]+)%", out),
        "stdout": out,
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--parts", default="resnet,gpt")
    p.add_argument("--images", type=int, default=4096)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--loaders", type=int, default=12)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--on-device-steps", type=int, default=40)
    p.add_argument("--tokens-m", type=int, default=200)
    p.add_argument("--gpt-loaders", type=int, default=4)
    p.add_argument("--gpt-steps", type=int, default=100)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=".")
    a = p.parse_args()
    parts = a.parts.split(",")
    os.makedirs(a.out, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        shards = make_shards(tmp, a.images, a.shards) if "resnet" in parts else []
        data = os.path.join(tmp, "gpt")
        if "gpt" in parts:
            os.makedirs(data)
            rng = np.random.default_rng(0)
            rng.integers(0, 50257, a.tokens_m * 1_000_000, dtype=np.uint16).tofile(
                os.path.join(data, "train.bin"))
        for r in range(a.rounds):
            for part in parts:
                row = resnet(a, shards) if part == "resnet" else gpt(a, data)
                row["round"] = r
                rows.append(row)
                with open(os.path.join(a.out, "examples.json"), "w") as f:
                    json.dump(rows, f, indent=1)
    print(f"{'example':8} {'round':>5} {'rate':>12} {'on-device':>10} {'share':>7} "
          f"{'waiting':>8} {'GPU idle':>8}")
    for row in rows:
        rate = row.get("images_per_s") or row.get("tokens_per_s")
        print(f"{row['example']:8} {row['round']:5} {rate or 0:12,.0f} "
              f"{row.get('on_device_images_per_s') or 0:10,.0f} "
              f"{row.get('share_of_on_device') or 0:6.1f}% {row['waiting'] or 0:7.1f}% "
              f"{row['gpu_idle'] or 0:7.2f}%")
    print(json.dumps([{k: v for k, v in row.items() if k != "stdout"} for row in rows]))


if __name__ == "__main__":
    main()
