#!/usr/bin/env python3
"""A ResNet-50 training step (bf16 autocast, channels_last, SGD, batch 256) on a batch already on
the device, then fed by pinring with decode="gpu" from the shards bench/gpu_decode.py makes,
with 2 loaders: images/s, and the CPU cores of the loaders, of pinring's threads in this
process and of the main thread (against the on-device run's). Two ring sizings: "auto", and
32 MiB slots at 128 KiB an image. Needs a GPU, torch, torchvision. STEPS sets the window."""
import glob, os, sys, time
import numpy as np, torch, torch.nn as nn
from torchvision.models import resnet50
import pinring
shards = sorted(glob.glob(os.environ.get("PINRING_DECODE_SHARDS", "/tmp/pinring-decode-shards") + "/*.tar"))
dev = torch.device("cuda")
model = resnet50(weights=None, num_classes=1000).to(dev).to(memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
loss_fn = nn.CrossEntropyLoss()
mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1) * 255
std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1) * 255
def step(u8, labels):
    x = ((u8.permute(0, 3, 1, 2).float() - mean) / std).contiguous(memory_format=torch.channels_last)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = loss_fn(model(x), labels)
    opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
def threads():
    out = {}
    for t in os.listdir("/proc/self/task"):
        try:
            name = open(f"/proc/self/task/{t}/comm").read().strip()
            f = open(f"/proc/self/task/{t}/stat").read().rsplit(")", 1)[1].split()
            out[(t, name)] = (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            pass
    return out
def proc_cpu(pid):
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0
def window(fetch, warm, steps, pids=()):
    for _ in range(warm):
        step(*fetch())
    torch.cuda.synchronize()
    t0, th0, p0 = time.time(), threads(), {p: proc_cpu(p) for p in pids}
    for _ in range(steps):
        step(*fetch())
    torch.cuda.synchronize()
    dt = time.time() - t0
    th1 = threads(); p1 = {p: proc_cpu(p) for p in pids}
    by = {}
    for k, v in th1.items():
        by[k[1]] = by.get(k[1], 0.0) + v - th0.get(k, 0.0)
    loaders = sum(p1[p] - p0[p] for p in pids)
    return 256 * steps / dt, dt, by, loaders
x = torch.randint(0, 256, (256, 224, 224, 3), device=dev, dtype=torch.uint8)
y = torch.randint(0, 1000, (256,), device=dev)
steps = int(os.environ.get("STEPS", "60"))
for rep in range(2):
    rate, dt, by, _ = window(lambda: (x, y), 10, steps)
    main = by.get("python", 0) + by.get("python3", 0)
    print(f"on-device rep {rep}: {rate:.0f} img/s; main thread {main/dt:.2f} cores; threads {{{', '.join(f'{k}: {v/dt:.2f}' for k, v in sorted(by.items()) if v/dt > 0.02)}}}", flush=True)
    base_main = main / dt
variants = [("auto slots", None, None), ("32MiB slots, 128KiB/sample", "32MiB", "32MiB")]
for name, slot, enc in variants:
    for rep in range(1):
        image = {"crop": 224, "decode": "gpu", "output": "u8"}
        if enc:
            image["encoded_bytes"] = enc
        extra = {"config": {"ring": {"slot_bytes": slot}}} if slot else {}
        with pinring.Loader(dataset={"kind": "webdataset", "shards": shards, "on_bad_sample": "skip"},
                            image=image, **extra,
                            batch_size=256, loaders=2, embedded=True, device="cuda", epochs=100,
                            backend="cuda", progress=False) as loader:
            it = iter(loader)
            def fetch():
                global it
                try:
                    b = next(it)
                except StopIteration:
                    it = iter(loader); b = next(it)
                return b["images"], b["labels"]
            pids = loader.loader_pids()
            rate, dt, by, lcpu = window(fetch, 15, steps, pids)
            main = by.get("python", 0) + by.get("python3", 0)
            pin = sum(v for k, v in by.items() if k.startswith("pinring"))
            print(f"pinring decode=gpu 2 loaders, {name}, parts/batch {loader._attach().parts_per_batch}: {rate:.0f} img/s; loaders {lcpu/dt:.2f} cores; pinring threads {pin/dt:.2f}; main thread {main/dt:.2f} (on-device {base_main:.2f}); threads {{{', '.join(f'{k}: {v/dt:.2f}' for k, v in sorted(by.items()) if v/dt > 0.02)}}}; counts {loader.decode_counts()}", flush=True)
