# GPU decode check and rate (run on a GPU host; needs torch, torchvision, PIL, numpy): WebDataset shards of 500x375 q90 JPEGs (PIL), a few odd ones
# (progressive, grayscale, CMYK, 4:4:4, a PNG); pinring.Loader with decode="cpu" and "gpu" on the
# cuda backend, every batch compared (mean abs difference per batch, labels exact); then the
# decode rate of decode="gpu" against torchvision's batched decode_jpeg(device="cuda") plus
# resized_crop on the same bytes, side by side.
import io, os, sys, tarfile, time, glob, json
import numpy as np
from PIL import Image
import torch, torchvision
from torchvision.io import decode_jpeg
import torchvision.transforms.v2.functional as F
import pinring

root = os.environ.get("PINRING_DECODE_SHARDS", "/tmp/pinring-decode-shards")
os.makedirs(root, exist_ok=True)
rng = np.random.default_rng(0)

def photo(w, h, seed):
    r = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * (1 + seed % 3) + y) % 256, (y * 2 + seed) % 256, (x + y * 3 + 7 * seed) % 256], -1)
    noise = r.integers(0, 8, (h, w, 3))
    return ((base * 0.8 + noise) % 256).astype(np.uint8)

def encode(k):
    img = Image.fromarray(photo(500, 375, k))
    b = io.BytesIO()
    kind = "jpg"
    if k % 97 == 1:
        img.save(b, "JPEG", quality=90, progressive=True)
    elif k % 97 == 2:
        img.convert("L").save(b, "JPEG", quality=90)
    elif k % 97 == 3:
        img.convert("CMYK").save(b, "JPEG", quality=90)
    elif k % 97 == 4:
        img.save(b, "JPEG", quality=90, subsampling=0)
    elif k % 97 == 5:
        img.save(b, "JPEG", quality=90, subsampling=1)
    elif k % 97 == 6:
        img.save(b, "PNG"); kind = "png"
    else:
        img.save(b, "JPEG", quality=90)
    return b.getvalue(), kind

n_shards, per = 4, 512
raw = []
if not glob.glob(f"{root}/*.tar"):
    t = time.time()
    for s in range(n_shards):
        with tarfile.open(f"{root}/s{s:02d}.tar", "w") as tf:
            for i in range(per):
                k = s * per + i
                data, kind = encode(k)
                for name, payload in ((f"{k:06d}.{kind}", data), (f"{k:06d}.cls", str(k % 1000).encode())):
                    ti = tarfile.TarInfo(name); ti.size = len(payload)
                    tf.addfile(ti, io.BytesIO(payload))
    print(f"shards made in {time.time()-t:.1f}s", flush=True)
shards = sorted(glob.glob(f"{root}/*.tar"))

import resource
def cpu_s():
    a = resource.getrusage(resource.RUSAGE_SELF); b = resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime
def run(decode, output="u8", batches=None, loaders=2, bs=256, epochs=1):
    t0 = time.time(); n = 0; out_b = []; c0 = cpu_s()
    with pinring.Loader(dataset={"kind": "webdataset", "shards": shards, "on_bad_sample": "skip"},
                        image={"crop": 224, "decode": decode, "output": output,
                               **({"encoded_bytes": "64MiB"} if decode == "gpu" else {})},
                        batch_size=bs, loaders=loaders, embedded=True, device="cuda", epochs=epochs,
                        backend="cuda", progress=False) as loader:
        first = None
        for b in loader:
            if first is None:
                torch.cuda.synchronize(); first = time.time()
            n += b["images"].shape[0]
            if batches is not None:
                out_b.append((b["images"].cpu(), b["labels"].cpu()))
        torch.cuda.synchronize()
    dt = time.time() - (first or t0)
    print(f"  cpu cores (this process and its loaders, whole run incl. start): {(cpu_s()-c0)/(time.time()-t0):.2f}", flush=True)
    return n, dt, out_b

res = {}
n, dt, cpu_b = run("cpu", batches=True, loaders=12)
print(f"cpu decode, 12 loaders: {n} images {n/dt:.0f} img/s", flush=True)
n, dt, gpu_b = run("gpu", batches=True)
print(f"gpu decode, 2 loaders: {n} images {n/dt:.0f} img/s", flush=True)
diffs = []
for (ci, cl), (gi, gl) in zip(cpu_b, gpu_b):
    assert torch.equal(cl, gl), "labels differ"
    diffs.append((ci.float() - gi.float()).abs().mean().item())
print(f"pixels gpu vs cpu: mean abs diff per batch max {max(diffs):.3f}, mean {np.mean(diffs):.3f}; batches {len(diffs)}", flush=True)
res["max_mad"] = max(diffs)
reps = 0 if os.environ.get("GPU_DECODE_QUICK") else 2
for rep in range(reps):
    n, dt, _ = run("gpu", epochs=4)
    print(f"gpu decode u8, 2 loaders, rep {rep}: {n/dt:.0f} img/s", flush=True)
    n, dt, _ = run("gpu", output="bf16", epochs=4, loaders=4)
    print(f"gpu decode bf16, 4 loaders, rep {rep}: {n/dt:.0f} img/s", flush=True)
# torchvision on the same bytes: read the JPEG members, batched decode + resized_crop 224.
datas = []
for s in shards:
    with tarfile.open(s) as tf:
        for m in tf.getmembers():
            if m.name.endswith(".jpg") and int(m.name[:6]) % 97 not in (1, 2, 3, 4, 5, 6):
                datas.append(torch.frombuffer(bytearray(tf.extractfile(m).read()), dtype=torch.uint8))
datas = [d for i, d in enumerate(datas)][:4096]
for rep in range(max(reps, 1)):
    torch.cuda.synchronize(); t = time.time(); n = 0
    for i in range(0, len(datas) - 255, 256):
        imgs = decode_jpeg(datas[i:i+256], device="cuda", mode=torchvision.io.ImageReadMode.RGB)
        outb = torch.stack([F.resized_crop(im, 40, 60, 300, 380, [224, 224], antialias=True) for im in imgs])
        n += len(imgs)
    torch.cuda.synchronize(); dt = time.time() - t
    print(f"torchvision decode_jpeg(cuda)+resized_crop rep {rep}: {n/dt:.0f} img/s", flush=True)
