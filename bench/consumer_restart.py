#!/usr/bin/env python3
"""A trainer SIGKILLed and restarted against a running daemon: how soon the new one has its first
batch on the device, whether every batch still comes exactly once and in order, and whether the
batches prefetched for the dead one survive it.

For each ``daemon.copies`` setting (``consumer``: the trainer copies out of the ring's slots;
``daemon``: the daemon copies into buffers opened through CUDA IPC), on the seed workload (32 x
512x512 f32 batches, synthetic) with N loaders:

1. A child trainer (``pinring.Loader(ring=...)``) takes ``--take`` batches as torch tensors,
   printing each seq, keeps the last two alive, and is killed with SIGKILL.
2. After ``--pause`` seconds, ``pinring status --json`` says how many batches wait for a consumer
   in the ring (prefetched, not taken).
3. This process attaches (``pinring.Loader(ring=...)``) and times attach to the first batch's
   tensors on the device (``torch.cuda.synchronize()``), then takes the rest of the plan and
   checks the seqs: the first right after the dead trainer's last take, each next one a batch
   further, none missing, none twice.

Usage: consumer_restart.py --bin-dir DIR [--loaders 8] [--batches 512] [--take 50] [--repeat 3]
"""

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

CONFIG = """
[ring]
slot_bytes = "auto"
[dataset]
samples = 4096
sample_shape = [512, 512]
dtype = "f32"
classes = 1000
[plan]
batch_size = 32
shuffle = true
epochs = {epochs}
[daemon]
prefetch = 8
copies = "{copies}"
"""

CHILD = textwrap.dedent(
    """
    import sys, torch, pinring
    loader = pinring.Loader(ring=sys.argv[1])
    held = []
    for i, b in enumerate(loader.batches()):
        held = held[-1:] + [{k: torch.from_dlpack(f) for k, f in b.fields.items()}]
        torch.cuda.synchronize()
        print(b.seq, flush=True)
        if i + 1 == int(sys.argv[2]):
            print("done", flush=True)
            sys.stdin.read()
    """
)


def spawn(*args, **kw):
    return subprocess.Popen(args, stdin=subprocess.DEVNULL, **kw)


def once(args, copies, cfg):
    import torch

    import pinring

    name = f"restart-{uuid.uuid4().hex[:8]}"
    procs = [spawn(f"{args.bin_dir}/pinring-daemon", "--ring", name, "--backend", "cuda", "--sink", "consumer",
                   "--config", str(cfg), "--log-level", "warn", stderr=subprocess.DEVNULL)]
    procs += [spawn(f"{args.bin_dir}/pinring-loader", "--ring", name, "--config", str(cfg), "--wait-secs", "60",
                    stderr=subprocess.DEVNULL) for _ in range(args.loaders)]
    child = None
    try:
        child = subprocess.Popen([sys.executable, "-c", CHILD, name, str(args.take)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        seqs = []
        for line in child.stdout:
            if line.strip() == "done":
                break
            seqs.append(int(line))
        child.send_signal(signal.SIGKILL)
        child.wait()
        time.sleep(args.pause)
        st = json.loads(subprocess.run([f"{args.bin_dir}/pinring", "status", "--json", "--interval", "0.1", name],
                                       capture_output=True, text=True, check=True).stdout)
        waiting = st[0]["snapshot"]["consumer"]["waiting"]
        t0 = time.perf_counter()
        loader = pinring.Loader(ring=name)
        it = iter(loader.batches())
        b = next(it)
        tensors = {k: torch.from_dlpack(f) for k, f in b.fields.items()}
        torch.cuda.synchronize()
        first_s = time.perf_counter() - t0
        got = [b.seq]
        del b, tensors
        for b in it:
            got.append(b.seq)
            del b
        parts = loader.parts_per_batch if hasattr(loader, "parts_per_batch") else None
        loader.close()
        step = got[1] - got[0] if len(got) > 1 else 1
        expect_first = seqs[-1] + step
        in_order = got == list(range(expect_first, expect_first + step * len(got), step))
        total = (len(seqs) + len(got))
        return {"copies": copies, "first_batch_s": first_s, "dead_took": len(seqs), "then_took": len(got),
                "all_batches": total, "plan_batches": args.batches, "first_seq_after": got[0],
                "expected_first_seq": expect_first, "exactly_once_in_order": in_order and total == args.batches,
                "waiting_at_restart": waiting, "parts": parts}
    finally:
        if child is not None and child.poll() is None:
            child.kill()
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--loaders", type=int, default=8)
    ap.add_argument("--batches", type=int, default=512, help="batches in the plan (a multiple of 128)")
    ap.add_argument("--take", type=int, default=50)
    ap.add_argument("--pause", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    rows = []
    for r in range(args.repeat):
        for copies in ("consumer", "daemon"):
            cfg = tmp / f"{copies}.toml"
            cfg.write_text(CONFIG.format(epochs=max(1, args.batches // 128), copies=copies))
            row = once(args, copies, cfg)
            rows.append(row)
            print(f"run {r + 1} copies={copies:8s} first batch {row['first_batch_s']:.3f} s, "
                  f"{row['waiting_at_restart']} batches waiting at the restart, dead took {row['dead_took']}, "
                  f"then {row['then_took']}, exactly once in order: {row['exactly_once_in_order']}", flush=True)
    print(json.dumps(rows))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "consumer_restart.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
