#!/usr/bin/env python3
"""Token batches end to end: GB/s and batches/s that a training process receives through
``pinring.Loader`` from ``kind = "tokens"`` files, against the daemon's own discard sink on the
same config, alternated in one run.

For each sequence length and batch size asked, a config reads one flat u16 token file (made once
and read once before the runs, so it is in the page cache), ``plan.shuffle`` on, N loader
processes. Each point runs ``discard`` (``pinring-daemon --sink discard``), ``rust``
(``pinring-daemon --sink consumer`` and ``pinring consume``: the Rust client takes each batch
and drops it) and ``embedded`` (``pinring.Loader(embedded=True)``: the daemon on a thread of
this process, the loop takes each batch as torch tensors and drops them), ``--repeat`` times,
alternating; ``--modes`` can add ``attached``. The comparison is the daemon's summary GB/s for every mode (as
``consumer_rate.py``, whose runner this uses); batches/s is the delivered batches over the
summary's seconds. A batch is ``input_ids`` and ``targets``, ``batch x seq_len`` i64 each.

Usage: tokens_rate.py --bin-dir DIR [--seq-lens 1024,2048] [--batches 8,16,32,64]
       [--loaders 8] [--repeat 3] [--tokens 134217728] [--out DIR]
"""

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

import numpy as np

from consumer_rate import cuda_ready, run_one

CONFIG = """
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
shuffle = true
epochs = {epochs}
{daemon}"""


def token_file(directory, tokens):
    """A file of `tokens` u16 tokens, read once so that the page cache holds it."""
    path = Path(directory, "train.bin")
    rng = np.random.default_rng(7)
    rng.integers(0, 50257, size=tokens, dtype=np.uint16).tofile(path)
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", default=os.environ.get("PINRING_BIN_DIR", "bin"))
    ap.add_argument("--backend", default="cuda", help="cuda, or host for a dry run without a GPU")
    ap.add_argument("--seq-lens", default="1024,2048")
    ap.add_argument("--batches", default="8,16,32,64")
    ap.add_argument("--loaders", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--prefetch", type=int, default=None,
                    help="daemon.prefetch; unset: the daemon's own (64 MiB in flight, 4 to 64 batches)")
    ap.add_argument("--tokens", type=int, default=128 << 20, help="tokens in the file")
    ap.add_argument("--run-batches", type=int, default=40000, help="batches per run, at least")
    ap.add_argument("--modes", default="discard,rust,embedded")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cuda_ready(args.backend)

    work = Path(tempfile.mkdtemp())
    path = token_file(work, args.tokens)
    modes = args.modes.split(",")
    points = []
    print(f"{'seq_len':>7s} {'batch':>5s} {'KiB/field':>9s} {'mode':9s} {'GB/s':>7s} {'batches/s':>10s}", flush=True)
    for seq_len in map(int, args.seq_lens.split(",")):
        for batch in map(int, args.batches.split(",")):
            per_epoch = (args.tokens - 1) // seq_len // batch
            epochs = max(1, -(-args.run_batches // per_epoch))
            cfg = work / f"tokens-{seq_len}-{batch}.toml"
            daemon = "" if args.prefetch is None else f"[daemon]\nprefetch = {args.prefetch}\n"
            cfg.write_text(CONFIG.format(path=path, seq_len=seq_len, batch=batch, epochs=epochs,
                                         daemon=daemon))
            field = batch * seq_len * 8
            runs = {m: [] for m in modes}
            for _ in range(args.repeat):
                for m in modes:
                    gbps, _, _ = run_one(m, args, {"consumer": cfg, "daemon": cfg}, 2 * field)
                    rate = gbps * 1e9 / (2 * field)
                    runs[m].append((gbps, rate))
                    print(f"{seq_len:7d} {batch:5d} {field >> 10:9d} {m:9s} {gbps:7.2f} {rate:10.0f}", flush=True)
            point = {"seq_len": seq_len, "batch": batch, "field_bytes": field, "runs": runs}
            base = statistics.median(g for g, _ in runs["discard"]) if "discard" in runs else None
            for m in modes:
                med = statistics.median(g for g, _ in runs[m])
                point[m] = {
                    "gbps": med,
                    "batches_per_s": statistics.median(r for _, r in runs[m]),
                    "ratio_to_discard": med / base if base else None,
                }
            points.append(point)
    print()
    print(f"{'seq_len':>7s} {'batch':>5s} {'mode':9s} {'GB/s':>7s} {'batches/s':>10s} {'vs discard':>10s}")
    for p in points:
        for m in modes:
            r = p[m]
            share = f"{r['ratio_to_discard']:.1%}" if r["ratio_to_discard"] else "-"
            print(f"{p['seq_len']:7d} {p['batch']:5d} {m:9s} {r['gbps']:7.2f} {r['batches_per_s']:10.0f} {share:>10s}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "tokens_rate.json").write_text(json.dumps(points, indent=1))


if __name__ == "__main__":
    main()
