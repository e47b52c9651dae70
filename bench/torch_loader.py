#!/usr/bin/env python3
"""The same Dataset through ``torch.utils.data.DataLoader`` and through
``pinring.torch.DataLoader``, side by side in one run, on one GPU.

Cases (each a Dataset class that both loaders take as it is):
  seed   512x512 f32 samples and an int label, batch 32 (the seed workload's shape). A sample is
         a row of a 16-sample base array picked by index: __getitem__ costs next to nothing,
         so the loader's own transport is what is measured.
  captions  a text+image sample as a CLIP-style dataset returns it: a 3x224x224 u8 image (a
         row of a 16-sample base array), a caption str of 4-23 words, and 77 int64 token ids;
         batch 256. The captions reach the trainer as a list of str, with both loaders.
  ragged the captions case with token ids of 8-77 per sample (a variable-length field), batched
         by the same padding collate_fn in both loaders (torch's runs it in its workers,
         pinring in the training process, on the batch's tensors on the GPU).
  stream the captions case's samples from an IterableDataset (worker w of W yields samples w,
         w + W, ...), batch 256, no shuffle: each worker iterates its own copy, and the batches
         interleave round-robin with both loaders.
  jpeg   JPEG files (500x375, quality 90, made by this script first), decoded with PIL,
         torchvision's RandomResizedCrop(224) and RandomHorizontalFlip, returned as u8 HWC
         224x224x3 arrays with an int label; batch 256. The epoch is 400 batches long (index i
         reads file i % --images), so no run crosses an epoch's end.

For each --workers value: torch's DataLoader at every (pin_memory, prefetch_factor) pair of
--pin x --prefetch, with ``persistent_workers=True`` and ``.to(device, non_blocking=True)``; then
``pinring.torch.DataLoader`` with the same ``num_workers`` (embedded daemon, CUDA), whose batches
are already on the device. Each run takes warm-up batches, then times measured batches between
two ``torch.cuda.synchronize()`` calls: seed 40 and 400; jpeg 2w and --waves x w for w workers
(each of torch's w workers makes one whole batch per "wave", so the window holds whole waves: a
window of a few batches would time one burst of ready batches). --batches and --warmup override.
Measured: samples/s, GB/s of batch data, and the trainer process's CPU seconds per batch
(``time.process_time()``: all its threads, the DataLoader's pin thread or pinring's embedded
daemon). --repeat N runs the whole sweep N times, alternating the loaders.

Output: a table of every run, OUT/torch_loader_CASE.csv (a row per run), a table of medians per
worker count (torch's best configuration by median against pinring's median, with min-max), and
one JSON line of it.

Usage: torch_loader.py --case seed|captions|ragged|stream|jpeg [--workers 4,8,12] [--pin 1,0] [--prefetch 2,4]
                       [--batches N] [--warmup N] [--waves 3] [--repeat 1] [--images N]
                       [--out DIR] [--device cuda]
"""

import argparse
import csv
import functools
import json
import os
import statistics
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
    """JPEG files decoded with PIL, RandomResizedCrop(224) + flip, u8 HWC, and a label. With
    `length` > len(files), index i reads file i % len(files) (a long epoch over few files)."""

    def __init__(self, files, size=224, length=None, log_dir=None):
        self.files = files
        self.size = size
        self.length = length or len(files)
        self.tf = None
        # With log_dir: each process appends "samples cpu_seconds wall_seconds" (CPU and wall
        # time inside __getitem__) to log_dir/PID after its first sample and then every 64
        # (getitem_cpu() sums them; run() counts the processes that have started).
        self.log_dir = log_dir
        self._n = 0
        self._cpu = 0.0
        self._wall = 0.0

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        from PIL import Image
        from torchvision import transforms

        if self.tf is None:
            self.tf = transforms.Compose(
                [transforms.RandomResizedCrop(self.size), transforms.RandomHorizontalFlip()]
            )
        c0, w0 = time.process_time(), time.perf_counter()
        with Image.open(self.files[i % len(self.files)]) as im:
            img = self.tf(im.convert("RGB"))
        out = np.asarray(img, dtype=np.uint8), i % 1000
        if self.log_dir is not None:
            self._n += 1
            self._cpu += time.process_time() - c0
            self._wall += time.perf_counter() - w0
            if self._n % 64 == 0 or self._n == 1:
                with open(os.path.join(self.log_dir, str(os.getpid())), "a") as f:
                    f.write(f"{self._n} {self._cpu} {self._wall}\n")
        return out


_WORDS = ("a photo of the small large red blue dog cat on in under grass street near tree "
          "sky with two people walking running sitting table").split()


class CaptionSamples(torch.utils.data.Dataset):
    """A 3x224x224 u8 image, a caption of 4-23 words and 77 token ids per sample."""

    def __init__(self, n=65536):
        self.n = n
        self.base = np.random.default_rng(0).integers(0, 256, (16, 3, 224, 224), dtype=np.uint8)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        caption = " ".join(_WORDS[(i * 7 + k) % len(_WORDS)] for k in range(4 + i % 20))
        return {"image": self.base[i % 16], "caption": caption,
                "tokens": np.arange(77, dtype=np.int64) + i}


class RaggedCaptions(CaptionSamples):
    """CaptionSamples with 8-77 token ids per sample."""

    def __getitem__(self, i):
        sample = super().__getitem__(i)
        sample["tokens"] = sample["tokens"][:8 + (i * 37) % 70]
        return sample


def pad_captions(batch):
    """The images stacked, the captions listed, the token ids padded to the batch's longest."""
    from torch.nn.utils.rnn import pad_sequence

    return {"image": torch.stack([torch.as_tensor(b["image"]) for b in batch]),
            "caption": [b["caption"] for b in batch],
            "tokens": pad_sequence([torch.as_tensor(b["tokens"]) for b in batch],
                                   batch_first=True)}


class CaptionStream(torch.utils.data.IterableDataset):
    """CaptionSamples' samples as a stream, split by torch's worker info."""

    def __init__(self, n=65536):
        self.samples = CaptionSamples(n)

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        w, workers = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(w, len(self.samples), workers):
            yield self.samples[i]


def _tensors(batch):
    """The batch's tensors (its str lists left out)."""
    items = batch.values() if isinstance(batch, dict) else batch
    return [t for t in items if isinstance(t, torch.Tensor)]


def getitem_cpu(log_dir):
    """{pid: (samples, cpu seconds, wall seconds inside __getitem__)} from the last line of
    each log."""
    out = {}
    for name in os.listdir(log_dir):
        with open(os.path.join(log_dir, name)) as f:
            last = f.read().split("\n")[-2:]
        line = [x for x in last if x.strip()]
        if line:
            n, cpu, wall = line[-1].split()
            out[name] = (int(n), float(cpu), float(wall))
    return out


def pin_worker(cpus, worker_id):
    """worker_init_fn of --affinity: worker k runs on CPU cpus[k % len(cpus)] alone."""
    os.sched_setaffinity(0, {cpus[worker_id % len(cpus)]})


def make_jpeg(path, i):
    """JPEG number i: 500x375, smooth gradients plus noise, quality 90 (about ImageNet's
    100 KB); the same bytes for the same i."""
    from PIL import Image

    rng = np.random.default_rng(i)
    y, x = np.mgrid[0:375, 0:500]
    base = np.stack([(x * (i % 7 + 1)) % 256, (y * (i % 5 + 1)) % 256, (x + y + i) % 256], -1)
    img = np.clip(base + rng.normal(0, 24, base.shape), 0, 255).astype(np.uint8)
    Image.fromarray(img).save(path, quality=90)
    return path


def make_jpegs(d, n, classes=1, procs=None):
    """n JPEGs (make_jpeg) in d, made by a process pool; with classes > 1, image i goes into
    d/class_{i % classes}/ (torchvision's ImageFolder layout)."""
    import multiprocessing

    paths = []
    for i in range(n):
        sub = d if classes <= 1 else os.path.join(d, f"class_{i % classes:03d}")
        os.makedirs(sub, exist_ok=True)
        paths.append(os.path.join(sub, f"{i:06d}.jpg"))
    with multiprocessing.get_context("spawn").Pool(procs or os.cpu_count()) as pool:
        return pool.starmap(make_jpeg, [(p, i) for i, p in enumerate(paths)], chunksize=16)


def children_cpu():
    """CPU seconds (user + system) of this process's live child processes (the loaders'
    workers), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    pid = os.getpid()
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    kids = set()
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids.update(int(k) for k in f.read().split())
        except OSError:
            pass
    for kid in kids:
        try:
            with open(f"/proc/{kid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
        except (OSError, IndexError, ValueError):
            pass
    return total / tick


def run(make_iter, batches, warmup, device, log_dir=None, workers=0):
    """Times `batches` batches after `warmup` ones. With log_dir, the warm-up also goes on until
    `workers` new processes have run __getitem__ (at most 50x `warmup` batches): pinring's first
    batches can be made by the workers that started first, so without this the window could
    still hold the others' start-up (spawn, imports)."""
    before = set(os.listdir(log_dir)) if log_dir else set()
    it = make_iter()
    for i in range(max(1, warmup) * 50):
        batch = next(it)
        started = len(set(os.listdir(log_dir)) - before) if log_dir else workers
        if i + 1 >= warmup and started >= workers:
            break
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda d: None)
    sync(device)
    g0 = getitem_cpu(log_dir) if log_dir else {}
    k0 = children_cpu()
    t0, c0 = time.perf_counter(), time.process_time()
    samples = nbytes = 0
    for _ in range(batches):
        batch = [t.to(device, non_blocking=True) for t in _tensors(next(it))]
        samples += batch[0].shape[0]
        nbytes += sum(t.nbytes for t in batch)
    sync(device)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    workers_cpu = children_cpu() - k0
    g1 = getitem_cpu(log_dir) if log_dir else {}
    del batch
    r = {"samples_per_s": samples / wall, "gb_per_s": nbytes / wall / 1e9,
         "cpu_s_per_batch": cpu / batches, "workers_cpu_ms_per_sample": workers_cpu / samples * 1e3,
         "workers_busy": workers_cpu / wall}
    if log_dir:
        z = (0, 0.0, 0.0)
        made = sum(v[0] - g0.get(pid, z)[0] for pid, v in g1.items())
        spent = sum(v[1] - g0.get(pid, z)[1] for pid, v in g1.items())
        wall = sum(v[2] - g0.get(pid, z)[2] for pid, v in g1.items())
        r["getitem_cpu_ms"] = spent / made * 1e3 if made else float("nan")
        r["getitem_wall_ms"] = wall / made * 1e3 if made else float("nan")
    return r


def endless(loader):
    while True:
        yield from loader


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", choices=["seed", "captions", "ragged", "stream", "jpeg"], required=True)
    ap.add_argument("--workers", default="4,8,12")
    ap.add_argument("--pin", default="1,0")
    ap.add_argument("--prefetch", default="2,4")
    ap.add_argument("--batches", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--waves", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--images", type=int, default=3072)
    ap.add_argument("--out", default=".")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--affinity", action="store_true")
    a = ap.parse_args()
    device = torch.device(a.device)
    tmp = tempfile.mkdtemp(prefix="pinring-bench-")
    data, batch_size, log_dir = dataset_for(a, tmp)
    rows = measure(a, data, batch_size, log_dir, device)
    report(a, rows)


def dataset_for(a, tmp):
    """The case's dataset, its batch size, and where its samples log their __getitem__ times
    (jpeg: files made under ``tmp``; None for the others)."""
    log_dir = None
    if a.case == "seed":
        data, batch_size = SeedSamples(), 32
    elif a.case == "captions":
        data, batch_size = CaptionSamples(), 256
    elif a.case == "stream":
        data, batch_size = CaptionStream(), 256
    elif a.case == "ragged":
        data, batch_size = RaggedCaptions(), 256
    else:
        t = time.perf_counter()
        files = make_jpegs(tmp, a.images)
        print(f"made {a.images} JPEGs in {time.perf_counter() - t:.1f} s", flush=True)
        batch_size = 256
        log_dir = os.path.join(tmp, "getitem")
        os.makedirs(log_dir)
        data = JpegSamples(files, length=400 * batch_size, log_dir=log_dir)
    return data, batch_size, log_dir


def measure(a, data, batch_size, log_dir, device):
    """Every run: torch's DataLoader for each pin and prefetch, then pinring's, per worker count;
    the rows, saved as CSV after each."""
    from pinring.torch import DataLoader as PinringLoader

    def window(w):
        """(warm-up, measured) batches for w workers. jpeg: whole waves (each of torch's workers
        makes one whole batch per wave, so a window of part of a wave would time a burst)."""
        if a.case == "seed":
            return a.warmup or 40, a.batches or 400
        if a.case in ("captions", "ragged", "stream"):
            return a.warmup or 2 * w, a.batches or max(60, a.waves * w)
        return a.warmup or 2 * w, a.batches or a.waves * w

    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, f"torch_loader_{a.case}.csv")
    keys = ["case", "run", "loader", "workers", "pin", "prefetch", "batches", "affinity",
            "samples_per_s", "gb_per_s", "cpu_s_per_batch", "workers_cpu_ms_per_sample",
            "workers_busy", "getitem_cpu_ms", "getitem_wall_ms"]

    def save():  # after every run, so a run cut short by a time limit keeps what it measured
        with open(path, "w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
            wr.writeheader()
            wr.writerows(rows)

    cpus = sorted(os.sched_getaffinity(0))
    shuffle = None if a.case == "stream" else True  # an IterableDataset takes no shuffle
    collate = pad_captions if a.case == "ragged" else None
    rows = []
    for run_no in range(a.repeat):
        for w in [int(v) for v in a.workers.split(",")]:
            warmup, batches = window(w)
            init = None
            if a.affinity:
                # The same placement for both loaders: worker k alone on one of the last w CPUs,
                # the training process (its pin thread or pinring's daemon threads) on the rest.
                worker_cpus = cpus[-w:]
                os.sched_setaffinity(0, cpus[:-w] or cpus)
                init = functools.partial(pin_worker, worker_cpus)
            for pin in [bool(int(v)) for v in a.pin.split(",")]:
                for pf in [int(v) for v in a.prefetch.split(",")]:
                    dl = torch.utils.data.DataLoader(
                        data, batch_size=batch_size, shuffle=shuffle, num_workers=w, pin_memory=pin,
                        prefetch_factor=pf, persistent_workers=True, drop_last=True,
                        multiprocessing_context="spawn", worker_init_fn=init, collate_fn=collate,
                    )
                    try:
                        r = run(lambda: endless(dl), batches, warmup, device, log_dir, w)
                    except RuntimeError as e:  # a DataLoader worker died: recorded, not fatal
                        print(f"torch DataLoader workers={w} pin={pin} prefetch={pf} failed: {e}")
                        continue
                    finally:
                        del dl
                    rows.append({"case": a.case, "run": run_no, "loader": "torch", "workers": w,
                                 "pin": int(pin), "prefetch": pf, "batches": batches,
                                 "affinity": int(a.affinity), **r})
                    print(rows[-1], flush=True)
                    save()
            pl = PinringLoader(data, batch_size=batch_size, shuffle=shuffle, num_workers=w,
                               drop_last=True, device=device, worker_init_fn=init,
                               collate_fn=collate)
            r = run(lambda: endless(pl), batches, warmup, device, log_dir, w)
            pl.close()
            rows.append({"case": a.case, "run": run_no, "loader": "pinring", "workers": w, "pin": 1,
                         "prefetch": 0, "batches": batches, "affinity": int(a.affinity), **r,
                         "restarts": pl.worker_restarts})
            print(rows[-1], flush=True)
            save()
            os.sched_setaffinity(0, cpus)
    return rows


def report(a, rows):
    """Prints the rows, each worker count's medians against torch's best, and the alternated
    pairs; then the summary as JSON."""
    print(f"{'run':>3} {'loader':8} {'workers':>7} {'pin':>3} {'pf':>3} {'samples/s':>10} {'GB/s':>6} "
          f"{'cpu ms/batch':>12} {'worker cpu ms/sample':>20} {'workers busy':>12} "
          f"{'getitem cpu ms':>14}")
    for r in rows:
        print(f"{r['run']:3} {r['loader']:8} {r['workers']:7} {r['pin']:3} {r['prefetch']:3} "
              f"{r['samples_per_s']:10.1f} {r['gb_per_s']:6.2f} {r['cpu_s_per_batch'] * 1e3:12.2f} "
              f"{r['workers_cpu_ms_per_sample']:20.2f} {r['workers_busy']:12.2f} "
              f"{r.get('getitem_cpu_ms', float('nan')):14.2f}")
    # Medians over the runs of each configuration; per worker count, pinring's median against
    # the best torch configuration's median.
    groups = {}
    for r in rows:
        groups.setdefault((r["workers"], r["loader"], r["pin"], r["prefetch"]), []).append(r)
    medians = {k: statistics.median(x["samples_per_s"] for x in v) for k, v in groups.items()}
    summary = {}
    print(f"{'workers':>7} {'torch best (pin/pf): median [min-max]':>40} {'pinring: median [min-max]':>28} {'ratio':>6}")
    for w in sorted({k[0] for k in groups}):
        torch_keys = [k for k in groups if k[0] == w and k[1] == "torch"]
        pk = (w, "pinring", 1, 0)
        if not torch_keys or pk not in groups:
            continue
        tk = max(torch_keys, key=lambda k: medians[k])
        spread = lambda k: (min(x["samples_per_s"] for x in groups[k]),
                            max(x["samples_per_s"] for x in groups[k]))
        ratio = medians[pk] / medians[tk]
        summary[w] = {"torch": medians[tk], "torch_pin": tk[2], "torch_prefetch": tk[3],
                      "pinring": medians[pk], "ratio": ratio, "runs": len(groups[pk])}
        t_lo, t_hi = spread(tk)
        p_lo, p_hi = spread(pk)
        print(f"{w:7} {medians[tk]:12.1f} ({tk[2]}/{tk[3]}) [{t_lo:.0f}-{t_hi:.0f}]{'':10} "
              f"{medians[pk]:10.1f} [{p_lo:.0f}-{p_hi:.0f}] {ratio:6.2f}")
    # Alternated pairs: within each run, pinring against every torch configuration of the same
    # run and worker count (samples/s, and CPU per sample inside __getitem__).
    pairs = {}
    for r in rows:
        if r["loader"] != "pinring":
            continue
        for t in rows:
            if t["loader"] == "torch" and t["run"] == r["run"] and t["workers"] == r["workers"]:
                k = (r["workers"], t["pin"], t["prefetch"])
                pairs.setdefault(k, []).append(
                    (r["samples_per_s"] / t["samples_per_s"],
                     r.get("getitem_cpu_ms", float("nan")) / t.get("getitem_cpu_ms", float("nan"))))
    for (w, pin, pf), v in sorted(pairs.items()):
        speed = sorted(x[0] for x in v)
        cpu = sorted(x[1] for x in v)
        print(f"pairs workers={w} torch pin={pin} prefetch={pf}: {len(v)} pairs, pinring/torch "
              f"samples/s median {statistics.median(speed):.3f} [{speed[0]:.3f}-{speed[-1]:.3f}]"
              f", __getitem__ CPU median {statistics.median(cpu):.3f} [{cpu[0]:.3f}-{cpu[-1]:.3f}]")
        summary.setdefault(w, {})[f"pairs_pin{pin}_pf{pf}"] = {
            "n": len(v), "speed_ratio": statistics.median(speed),
            "getitem_cpu_ratio": statistics.median(cpu)}
    print(json.dumps({"case": a.case, "by_workers": summary}))


if __name__ == "__main__":
    main()
