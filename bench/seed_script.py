#!/usr/bin/env python3
"""The seed document's benchmark, run as a user runs it: once with torch's DataLoader and once
with one import switched to ``from pinring.torch import DataLoader``.

The script is the seed's: ``MyDataset(size=(512, 512), length=1000)`` (1000 NumPy arrays of
512x512 float32 held in a list, 1 GB), batch 32, shuffle, and two timed loops over one epoch,
without and with ``pin_memory=True``, each timed from before the DataLoader is made to after the
last batch is on the device (start-up included, as the seed times it). It has no
``if __name__ == "__main__":`` and uses the default start method, as the seed's does. Each
(DataLoader, workers) runs in a fresh interpreter, so start-up costs are a user's.

Besides each loop's time it reports, per loop, the time from the DataLoader's making to its
first batch, and the proportional set size (PSS) of the largest worker process then: torch's
workers are the trainer's children; pinring's are the children of its zygote (whose PSS is
reported apart).

Usage: seed_script.py [--workers 0,4,8] [--repeat 1] [--device cuda|cpu] [--out DIR]
Prints a Markdown table and writes seed_script.json under --out.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import textwrap

SCRIPT = """
import json, os, time
import numpy as np
import torch
{import_line}

class MyDataset(torch.utils.data.Dataset):
    def __init__(self, size=(512, 512), length=1000):
        self.data = [np.random.rand(*size).astype(np.float32) for _ in range(length)]

    def __len__(self):
        return len(self.data)

    def __getitem__(self, idx):
        return torch.from_numpy(self.data[idx])


def pss_kib(pid):
    try:
        with open(f"/proc/{{pid}}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def children(pid):
    out = []
    try:
        for task in os.listdir(f"/proc/{{pid}}/task"):
            with open(f"/proc/{{pid}}/task/{{task}}/children") as f:
                out += [int(p) for p in f.read().split()]
    except OSError:
        pass
    return out


def workers():
    # torch: the trainer's children; pinring: its zygote's children.
    kids = children(os.getpid())
    grand = [g for k in kids for g in children(k)]
    if grand:
        return grand, kids
    return kids, []


device = torch.device("{device}")
dataset = MyDataset(size=(512, 512), length=1000)
results = []
for pin in (False, True):
    start = time.time()
    loader = DataLoader(dataset, batch_size=32, shuffle=True, num_workers={workers},
                        pin_memory=pin)
    n = 0
    first = None
    for batch in loader:
        batch = batch.to(device, non_blocking=pin)
        n += 1
        if first is None:
            if device.type == "cuda":
                torch.cuda.synchronize()
            first = time.time() - start
            w, z = workers()
            worker_pss = max([pss_kib(p) for p in w], default=0)
            zygote_pss = max([pss_kib(p) for p in z], default=0)
    if device.type == "cuda":
        torch.cuda.synchronize()
    took = time.time() - start
    results.append(dict(pin_memory=pin, seconds=took, first_batch=first, batches=n,
                        worker_pss_kib=worker_pss, zygote_pss_kib=zygote_pss,
                        gbps=n * 32 * 512 * 512 * 4 / took / 1e9))
    del loader, batch
print("RESULT " + json.dumps(results), flush=True)
"""

IMPORTS = {
    "torch": "from torch.utils.data import DataLoader",
    "pinring": "from pinring.torch import DataLoader",
}


def run(which, workers, device):
    body = textwrap.dedent(SCRIPT).format(import_line=IMPORTS[which], workers=workers,
                                          device=device)
    with tempfile.TemporaryDirectory() as d:
        path = pathlib.Path(d) / "seed.py"
        path.write_text(body)
        r = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                           timeout=1800)
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise SystemExit(f"{which} with {workers} workers failed (exit {r.returncode}):\n{r.stderr}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="0,4,8")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    device = args.device
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for rep in range(args.repeat):
        for workers in [int(w) for w in args.workers.split(",")]:
            for which in ("torch", "pinring"):  # alternated, side by side
                for res in run(which, workers, device):
                    rows.append(dict(loader=which, workers=workers, repeat=rep, **res))
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(f"device {device}; seconds per loop (one epoch, start-up included), first batch, "
          "largest worker PSS")
    print("| workers | pin_memory | torch s | pinring s | pinring / torch | torch first s | "
          "pinring first s | torch worker PSS MiB | pinring worker PSS MiB (zygote) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    keys = sorted({(r["workers"], r["pin_memory"]) for r in rows})
    for workers, pin in keys:
        t = [r for r in rows if (r["workers"], r["pin_memory"], r["loader"]) ==
             (workers, pin, "torch")]
        p = [r for r in rows if (r["workers"], r["pin_memory"], r["loader"]) ==
             (workers, pin, "pinring")]

        def fmt(rs, key, scale=1.0):
            return ", ".join(f"{r[key] * scale:.2f}" for r in rs)

        ratio = ", ".join(f"{b['seconds'] / a['seconds']:.2f}" for a, b in zip(t, p))
        zyg = ", ".join(f"{r['zygote_pss_kib'] / 1024:.1f}" for r in p)
        print(f"| {workers} | {pin} | {fmt(t, 'seconds')} | {fmt(p, 'seconds')} | {ratio} | "
              f"{fmt(t, 'first_batch')} | {fmt(p, 'first_batch')} | "
              f"{fmt(t, 'worker_pss_kib', 1 / 1024)} | {fmt(p, 'worker_pss_kib', 1 / 1024)} "
              f"({zyg}) |")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "seed_script.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
