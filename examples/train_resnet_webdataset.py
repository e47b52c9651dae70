#!/usr/bin/env python3
"""Train ResNet-50 on WebDataset shards of JPEGs, in bf16, fed by pinring's Rust loaders.

    pip install pinring-*.whl torch torchvision   # the wheel: README.md, "Install"
    python examples/train_resnet_webdataset.py --shards '/data/imagenet/train-*.tar' --loaders 14

Each shard is a tar of samples ``KEY.jpg`` (or ``.jpeg``, ``.png``) and ``KEY.cls`` (the class
as an ASCII integer), as WebDataset writes them. ``pinring.Loader`` runs the daemon inside this
process (the ring pinned and registered with CUDA once) and starts ``--loaders``
``pinring-loader`` processes. They decode each image, take a RandomResizedCrop of ``--crop``
pixels (scale 0.08-1, ratio 3/4-4/3) with a horizontal flip half of the time, and write the
``u8`` HWC pixels into the ring's slots. The daemon uploads each batch to the GPU, so a batch
arrives there as ``images`` ``[B, crop, crop, 3]`` ``u8`` and ``labels`` ``[B]`` ``i64``. The
step normalises it on the device, channels_last, and trains under bf16 autocast with SGD.

``--on-device-steps N`` first times the same step on one batch that stays on the device. That is
the step's own rate, the most any input pipeline can feed, and the loop's rate is then printed
as a share of it. At the end the example prints images/s, the share of the loop's time spent
waiting for a batch, and, on a GPU, how long the GPU sat idle between steps (CUDA events).

Usage: train_resnet_webdataset.py --shards PATH|GLOB ... [--loaders N] [--batch-size 256]
           [--crop 224] [--epochs 1] [--steps 0] [--lr 0.1] [--warmup 10]
           [--on-device-steps 0] [--device cuda] [--loaders-cpus 0-11]
"""

from __future__ import annotations

import argparse
import glob
import os
import time
from typing import Callable, List, Optional, Sequence, Tuple


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shards", nargs="+", required=True, help="tar shards: paths or globs")
    # Decoding is the work: every core but the trainer's and the daemon's (on a 16-core H200
    # host 14 loaders feed the step at its on-device rate, 12 reach 85-88% of it).
    p.add_argument("--loaders", type=int, default=max(1, len(os.sched_getaffinity(0)) - 2),
                   help="pinring-loader processes (default: the CPUs this process may use, less 2)")
    p.add_argument("--loaders-cpus", default=None, help="CPUs to pin the loaders to: 0-11,16")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--crop", type=int, default=224)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: epochs)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=10, help="steps not counted in the figures")
    p.add_argument("--on-device-steps", type=int, default=0,
                   help="first time the step on a batch resident on the device")
    p.add_argument("--device", default=None,
                   help="cuda, cuda:N or cpu (default: cuda where torch sees a GPU, else cpu)")
    return p.parse_args()


# The arguments are read before torch and torchvision are imported: --help and a wrong argument
# answer at once, not after the seconds that importing them takes.
if __name__ == "__main__":
    ARGS = parse()

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from torchvision.models import resnet50  # noqa: E402

import pinring  # noqa: E402

Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def make_step(dev: torch.device, classes: int, lr: float) -> Step:
    """One training step on a batch already on ``dev``: u8 NHWC -> normalised f32 NCHW in
    channels_last memory, ResNet-50 forward under bf16 autocast, cross-entropy, backward, SGD."""
    model = resnet50(weights=None, num_classes=classes).to(dev, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True,
                          weight_decay=5e-5)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1) * 255

    def step(images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # NHWC permuted to NCHW is channels_last already: no copy before the normalisation.
        x = (images.permute(0, 3, 1, 2).float() - mean) / std
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss: torch.Tensor = loss_fn(model(x), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def on_device_rate(step: Step, dev: torch.device, batch: int, crop: int, classes: int,
                   steps: int) -> float:
    """Images/s of ``step`` on one batch that never leaves the device: after 10 steps' warm-up
    (cuDNN's autotuning runs in the first), ``steps`` steps and at least one second of them, so
    that small steps are timed over as many as the fed loop runs."""
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randint(0, 256, (batch, crop, crop, 3), generator=g, device=dev, dtype=torch.uint8)
    y = torch.randint(0, classes, (batch,), generator=g, device=dev)
    for _ in range(10):
        step(x, y)
    sync(dev)
    done, t = 0, time.perf_counter()
    while done < steps or time.perf_counter() - t < 1.0:
        step(x, y)
        done += 1
        if done % 10 == 0:
            sync(dev)
    sync(dev)
    return done * batch / (time.perf_counter() - t)


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def shard_paths(patterns: Sequence[str]) -> List[str]:
    """The shards named, each a path or a glob, in order (a glob's matches sorted)."""
    out: List[str] = []
    for p in patterns:
        found = sorted(glob.glob(p)) if glob.has_magic(p) else [p]
        if not found:
            raise SystemExit(f"--shards {p!r}: no file matches")
        out += found
    return out


def cpu_list(text: Optional[str]) -> Optional[List[int]]:
    """``0-11,16`` -> [0, 1, ..., 11, 16]."""
    if not text:
        return None
    cpus: List[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus += range(int(lo), int(hi or lo) + 1)
    return cpus


def main(args: argparse.Namespace) -> None:
    dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = dev.type == "cuda"
    torch.manual_seed(0)
    if cuda:
        torch.backends.cudnn.benchmark = True
    step = make_step(dev, args.classes, args.lr)
    ceiling = None
    if args.on_device_steps:
        ceiling = on_device_rate(step, dev, args.batch_size, args.crop, args.classes,
                                 args.on_device_steps)
        print(f"on-device step: {ceiling:,.0f} images/s", flush=True)

    loader = pinring.Loader(
        dataset={"kind": "webdataset", "shards": shard_paths(args.shards)},
        image={"transform": "train", "crop": args.crop, "output": "u8"},
        batch_size=args.batch_size,
        shuffle=True,
        drop_last=True,
        epochs=args.epochs,
        loaders=args.loaders,
        loaders_cpus=cpu_list(args.loaders_cpus),
        device=dev,  # a torch.device: "cuda" or "cuda:N" (the CUDA backend) or "cpu" (the host's)
    )
    total = args.steps or len(loader) * args.epochs
    events: List[Tuple[torch.cuda.Event, torch.cuda.Event]] = []
    waited = 0.0
    t0: Optional[float] = None
    done = 0
    loss = torch.zeros((), device=dev)
    with loader:
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            t = time.perf_counter()
            for batch in loader:
                if done == args.warmup:
                    sync(dev)
                    t0, waited, events = time.perf_counter(), 0.0, []
                else:
                    waited += time.perf_counter() - t
                if cuda:
                    start = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    start.record()
                loss = step(batch["images"], batch["labels"])
                if cuda:
                    end.record()
                    events.append((start, end))
                done += 1
                if done >= total:
                    break
                t = time.perf_counter()
            if done >= total:
                break
        sync(dev)
        wall = time.perf_counter() - t0 if t0 is not None else 0.0
        summary = loader.close()
    print(f"step {done}: loss {loss.item():.3f}")
    if t0 is None:
        return
    measured = done - args.warmup
    rate = measured * args.batch_size / wall
    # The fed loop cannot outrun the same step on a resident batch: a share above 100% (beyond
    # the two timings' noise) means the on-device timing did not measure the ceiling (a step
    # so small that the host's kernel launches, not the device, set its pace), so none is given.
    share = ""
    if ceiling and rate <= 1.03 * ceiling:
        share = f", {rate / ceiling:.1%} of the on-device step"
    elif ceiling:
        share = (f" (faster than the on-device step's {ceiling:,.0f} images/s: a step this small "
                 "is bound by kernel launches, not the device, so no share is given)")
    print(f"{measured} steps in {wall:.2f} s: {rate:,.0f} images/s{share}, waiting for batches "
          f"{waited / wall:.1%}")
    if cuda and len(events) > 1:
        idle = sum(max(0.0, a[1].elapsed_time(b[0])) for a, b in zip(events, events[1:]))
        span = events[0][0].elapsed_time(events[-1][1])
        print(f"GPU idle between steps: {idle / span:.2%} of {span / 1e3:.2f} s")
    if summary:
        print(f"pinring: {summary.get('batches_delivered')} batches delivered, verdict "
              f"{summary.get('bound')}")


if __name__ == "__main__":
    main(ARGS)
