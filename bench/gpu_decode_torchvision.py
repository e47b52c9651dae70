#!/usr/bin/env python3
"""pinring decode="gpu" (eval: Resize(256) + CenterCrop(224) resampled as one box, u8) against
torchvision's decode_jpeg(device="cuda") + v2 Resize(256, antialias=True) + CenterCrop(224) on the
same JPEGs (the shards bench/gpu_decode.py makes; run it first): mean absolute difference per
image, for decode="gpu" and, as the reference, decode="cpu". Needs a GPU, torch, torchvision."""
import glob, io, os, sys, tarfile, time
import numpy as np, torch, torchvision
from torchvision.io import decode_jpeg
import torchvision.transforms.v2.functional as F
import pinring
shards = sorted(glob.glob(os.environ.get("PINRING_DECODE_SHARDS", "/tmp/pinring-decode-shards") + "/*.tar"))[:1]
tv = {}
with tarfile.open(shards[0]) as tf:
    for m in tf.getmembers():
        if m.name.endswith(".jpg") and int(m.name[:6]) % 97 not in (1, 2, 3, 4, 5, 6):
            data = torch.frombuffer(bytearray(tf.extractfile(m).read()), dtype=torch.uint8)
            img = decode_jpeg(data, device="cuda", mode=torchvision.io.ImageReadMode.RGB)
            img = F.center_crop(F.resize(img, [256], antialias=True), [224, 224])
            tv[int(m.name[:6]) % 1000] = img.permute(1, 2, 0).cpu()
for decode in ("gpu", "cpu"):
    diffs = []
    with pinring.Loader(dataset={"kind": "webdataset", "shards": shards, "on_bad_sample": "skip"},
                        image={"crop": 224, "transform": "eval", "decode": decode, "output": "u8"},
                        batch_size=64, loaders=2, embedded=True, device="cuda", epochs=1,
                        shuffle=False, backend="cuda", progress=False) as loader:
        for b in loader:
            imgs, labels = b["images"].cpu(), b["labels"].cpu()
            for i, l in enumerate(labels.tolist()):
                if l in tv:
                    diffs.append((imgs[i].float() - tv[l].float()).abs().mean().item())
    d = np.array(diffs)
    print(f"torchvision eval vs pinring decode={decode}: {len(d)} images, mean abs diff mean {d.mean():.3f}, max {d.max():.3f}, p99 {np.percentile(d, 99):.3f}", flush=True)
