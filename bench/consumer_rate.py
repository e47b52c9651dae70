#!/usr/bin/env python3
"""The trainer's end at full rate: GB/s a training process receives through ``pinring.Loader``
against the daemon's own discard sink, in one run, alternating, on the same config.

Three configurations, each run ``--repeat`` times, alternated (discard, attached, embedded,
discard, ...):

* ``discard``: ``pinring-daemon --sink discard`` (the pipeline's ceiling, no consumer);
* ``attached``: ``pinring-daemon --sink consumer`` and ``pinring.Loader(ring=...)`` in this
  process, which copies each batch out of the ring's slots itself (``daemon.copies =
  "consumer"``, the default);
* ``attached-daemon``: the same with ``daemon.copies = "daemon"``: the daemon copies into device
  buffers the trainer opens through CUDA IPC (two CUDA contexts on the GPU);
* ``embedded``: ``pinring.Loader(embedded=True)``, the daemon on a thread of this process;
* ``rust`` (not in the default ``--modes``): ``pinring-daemon --sink consumer`` and ``pinring
  consume``, the Rust client taking each batch (copied out of the ring's slots, as
  ``attached``) and dropping it: the protocol's consumer side without Python's per-batch cost.

Each run: the seed workload (32 x 512x512 f32 batches, synthetic), N loader processes. The
comparison uses one measurement for all three: the daemon's summary GB/s (payload bytes, images
and labels, from the ring's READY to the last delivery; for a consumer, a delivery is its take).
The consumer's own clock (first batch to last, a synchronize at both ends) is reported beside it.
The consumer does what a trainer that only receives does: takes each batch as torch tensors
(``torch.from_dlpack``, its stream waits on the upload's event) and drops them.

Then, unless ``--no-step``, the training-step comparison: bench/trainer.py's seed-shaped ResNet-18
step (bf16, 32 x 512x512) on the device alone, fed attached (the trainer copying, then the daemon
copying) and fed embedded, each as samples/s and as a share of the embedded step's.

Usage: consumer_rate.py --bin-dir DIR [--loaders 8] [--batches 2048] [--repeat 3] [--no-step]
                        [--out DIR]
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pinring

CONFIG = """
[ring]
slot_bytes = "auto"
[dataset]
samples = {samples}
sample_shape = [512, 512]
dtype = "f32"
classes = 1000
[plan]
batch_size = 32
shuffle = true
epochs = {epochs}
[daemon]
prefetch = {prefetch}
copies = "{copies}"
"""


def spawn(*args):
    return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def stop(procs, timeout=30):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def consume(loader, batch_bytes):
    """Takes every batch as a training loop does (``for batch in loader``, each field a torch
    tensor), to the end of the plan; the GB/s and batches on the consumer's own clock, from the
    first batch on."""
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

    def every_epoch():
        while True:
            took = False
            for batch in loader:
                took = True
                yield batch
            if not took:
                return

    it = every_epoch()
    first = next(it)
    del first
    sync()
    t0 = time.perf_counter()
    n = 0
    for b in it:
        del b
        n += 1
    sync()
    dt = time.perf_counter() - t0
    return n * batch_bytes / dt / 1e9, n


def cuda_ready(backend):
    """Imports torch and starts its CUDA before any run: both take seconds the first time,
    which would otherwise fall inside the first Python run's clock (the daemon's summary counts
    from the ring's start)."""
    import torch

    if backend != "host" and torch.cuda.is_available():
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()


def run_one(mode, args, cfgs, batch_bytes):
    cfg_path = cfgs["daemon" if mode == "attached-daemon" else "consumer"]
    ring = f"rate-{uuid.uuid4().hex[:8]}"
    summary = Path(tempfile.mkdtemp()) / "summary.json"
    procs = []
    loader = None
    try:
        if mode == "embedded":
            loader = pinring.Loader(ring=ring, embedded=True, config=str(cfg_path), backend=args.backend)
        else:
            sink = "discard" if mode == "discard" else "consumer"
            procs.append(
                spawn(f"{args.bin_dir}/pinring-daemon", "--ring", ring, "--backend", args.backend, "--sink", sink,
                      "--config", str(cfg_path), "--summary", str(summary))
            )
        loaders = [spawn(f"{args.bin_dir}/pinring-loader", "--ring", ring, "--config", str(cfg_path),
                         "--wait-secs", "60") for _ in range(args.loaders)]
        procs += loaders
        if mode in ("discard", "rust"):
            if mode == "rust":
                took = subprocess.run([f"{args.bin_dir}/pinring", "consume", "--ring", ring, "--timeout-secs", "60"],
                                      stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
                if took.returncode != 0:
                    raise RuntimeError(f"pinring consume failed ({took.returncode}): {took.stderr.strip()[-500:]}")
            procs[0].wait(600)
            s = json.loads(summary.read_text())
            return s["gbps"], None, s["batches_delivered"]
        if loader is None:
            loader = pinring.Loader(ring=ring)
        consumer_gbps, n = consume(loader, batch_bytes)
        s = loader.close()
        loader = None
        if mode.startswith("attached"):
            procs[0].wait(60)
            s = json.loads(summary.read_text())
        return s["gbps"], consumer_gbps, n
    finally:
        if loader is not None:
            loader.close()
        stop(procs)


def training_step(args):
    """bench/trainer.py's step fed every way, in one run; returns samples/s per config and the
    attached configs' share of the embedded one."""
    import sys

    out = tempfile.mkdtemp()
    configs = "on-device,pinring-attached,pinring-attached-daemon,pinring-embedded"
    run = subprocess.run([sys.executable, str(Path(__file__).with_name("trainer.py")), "--configs", configs,
                          "--bin-dir", args.bin_dir, "--loaders", str(args.loaders), "--out", out],
                         capture_output=True, text=True)
    if run.returncode != 0:
        print(f"training step: trainer.py failed ({run.returncode}): {run.stderr.strip()[-500:]}")
        return None
    r = json.loads(run.stdout.strip().splitlines()[-1])
    rates = {c: r[c.replace("-", "_")]["samples_per_s"] for c in configs.split(",")
             if r.get(c.replace("-", "_"))}
    emb = rates.get("pinring-embedded")
    print()
    print(f"{'training step':24s} {'samples/s':>10s}  vs embedded")
    for c, v in rates.items():
        print(f"{c:24s} {v:10.1f}  {v / emb:6.1%}" if emb else f"{c:24s} {v:10.1f}")
    return {"samples_per_s": rates, "vs_embedded": {c: v / emb for c, v in rates.items()} if emb else None}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", default=os.environ.get("PINRING_BIN_DIR", "bin"))
    ap.add_argument("--backend", default="cuda", help="cuda, or host for a dry run without a GPU")
    ap.add_argument("--loaders", type=int, default=8)
    ap.add_argument("--batches", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--prefetch", type=int, default=8)
    ap.add_argument("--modes", default="discard,attached,attached-daemon,embedded")
    ap.add_argument("--no-step", action="store_true", help="skip the training-step comparison (bench/trainer.py)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cuda_ready(args.backend)

    samples = 4096
    epochs = max(1, -(-args.batches * 32 // samples))
    cfgs = {}
    for copies in ("consumer", "daemon"):
        cfgs[copies] = Path(tempfile.mkdtemp()) / f"rate-{copies}.toml"
        cfgs[copies].write_text(CONFIG.format(samples=samples, epochs=epochs, prefetch=args.prefetch,
                                              copies=copies))
    batch_bytes = 32 * (512 * 512 * 4 + 8)
    modes = args.modes.split(",")
    results = {m: [] for m in modes}
    own = {m: [] for m in modes}
    for r in range(args.repeat):
        for m in modes:
            gbps, consumer_gbps, n = run_one(m, args, cfgs, batch_bytes)
            results[m].append(gbps)
            extra = ""
            if consumer_gbps is not None:
                own[m].append(consumer_gbps)
                extra = f", consumer's clock {consumer_gbps:6.2f} GB/s"
            print(f"run {r + 1} {m:15s} {gbps:6.2f} GB/s ({n} batches{extra})", flush=True)
    print()
    print(f"{'mode':16s} {'median':>8s} {'min':>7s} {'max':>7s}  vs discard")
    base = statistics.median(results["discard"]) if "discard" in results else None
    summary = {}
    for m in modes:
        v = results[m]
        med = statistics.median(v)
        ratio = med / base if base else float("nan")
        summary[m] = {"runs": v, "median": med, "ratio_to_discard": ratio, "consumer_clock": own[m]}
        print(f"{m:16s} {med:8.2f} {min(v):7.2f} {max(v):7.2f}  {ratio:6.1%}")
    if not args.no_step and args.backend == "cuda":
        summary["training_step"] = training_step(args)
    print(json.dumps(summary))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "consumer_rate.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
