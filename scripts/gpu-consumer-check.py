#!/usr/bin/env python3
"""The trainer's end on a GPU host, checked: every byte of every batch, on the device, in order,
in attached mode (the trainer copying out of the ring's slots, daemon.copies = "consumer"; and the
daemon copying into buffers opened through CUDA IPC, daemon.copies = "daemon") and embedded mode; a tensor kept for many batches stays intact; a
consumer killed while holding buffers is replaced and the next one resumes after what it took.

Usage: gpu-consumer-check.py --bin-dir DIR   (exit 0: every check passed)
"""

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path

import torch

import pinring

# 127 x 255 f32 samples: a batch's images fill 2,072,640 bytes, a multiple of 16 but not of 256,
# so the labels start at a 16-byte-aligned offset only (pinring_data::FIELD_ALIGN).
CONFIG = """
[ring]
slots = 16
[dataset]
samples = 1024
sample_shape = [127, 255]
dtype = "f32"
seed = 11
[plan]
batch_size = 16
epochs = 2
[daemon]
prefetch = 4
"""
BATCHES = 128


def spawn(*args, **kw):
    return subprocess.Popen(args, stdin=subprocess.DEVNULL, **kw)


class Ring:
    def __init__(self, bin_dir, cfg, daemon=True, loaders=4):
        self.bin = bin_dir
        self.name = f"gpuc-{uuid.uuid4().hex[:8]}"
        self.cfg = cfg
        self.procs = []
        if daemon:
            self.procs.append(
                spawn(f"{bin_dir}/pinring-daemon", "--ring", self.name, "--backend", "cuda", "--sink", "consumer",
                      "--config", str(cfg))
            )
        for _ in range(loaders):
            self.loader()

    def loader(self):
        self.procs.append(spawn(f"{self.bin}/pinring-loader", "--ring", self.name, "--config", str(self.cfg),
                                "--wait-secs", "60"))

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


def expected_on_device(consumer, batch_number, fields):
    want = consumer.expected(batch_number)
    return {
        k: torch.frombuffer(bytearray(want[k]), dtype=t.dtype).to(t.device).view_as(t) for k, t in fields.items()
    }


def check_all(loader, start=0, keep_at=5):
    c = loader._attach()
    n = 0
    kept = None
    for b in loader.batches():
        assert b.seq == start + n, f"seq {b.seq}, expected {start + n}"
        fields = {k: torch.from_dlpack(f) for k, f in b.fields.items()}
        assert fields["images"].is_cuda and fields["images"].shape == (16, 127, 255)
        assert fields["labels"].dtype == torch.int64
        want = expected_on_device(c, b.batch, fields)
        for k in fields:
            # Bitwise: random f32 bit patterns include NaNs, which never compare equal.
            if not torch.equal(fields[k].view(torch.uint8), want[k].view(torch.uint8)):
                got = fields[k]
                same = (got == want[k]).float().mean().item()
                host = got.cpu()
                print(f"MISMATCH batch {b.seq} (number {b.batch}) field {k}: {same:.1%} equal, "
                      f"zeros {(host == 0).float().mean().item():.1%}, ptr {got.data_ptr():#x}, "
                      f"first {host.flatten()[:4].tolist()} want {want[k].cpu().flatten()[:4].tolist()}",
                      flush=True)
                for other in range(max(0, b.batch - 2), b.batch + 3):
                    w = expected_on_device(c, other, {k: got})[k]
                    print(f"  vs batch {other}: {(got == w).float().mean().item():.1%} equal", flush=True)
                torch.cuda.synchronize()
                print(f"  after synchronize: {torch.equal(got, want[k])}", flush=True)
                raise AssertionError(f"batch {b.seq} field {k} differs on the device")
        if n == keep_at:
            kept = (b.batch, {k: v.clone() for k, v in fields.items()}, fields)
        del b, fields, want
        n += 1
    if kept is not None:
        batch, copy, live = kept
        for k in copy:
            same = torch.equal(copy[k].view(torch.uint8), live[k].view(torch.uint8))
            assert same, f"kept batch {batch} field {k} was overwritten"
    return n


CHILD = textwrap.dedent(
    """
    import sys, torch, pinring
    c = pinring.Consumer(sys.argv[1])
    held = []
    while True:
        b = c.next_batch(60)
        held.append({k: torch.from_dlpack(f) for k, f in b.fields.items()})
        torch.cuda.synchronize()
        print(b.seq, flush=True)
    """
)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    args = ap.parse_args()
    cfg = Path(tempfile.mkdtemp()) / "check.toml"
    cfg.write_text(CONFIG)
    cfgs = {"consumer": cfg, "daemon": cfg.with_name("check-daemon-copies.toml")}
    cfgs["daemon"].write_text(CONFIG + 'copies = "daemon"\n')
    results = {}

    for copies, c in cfgs.items():
        r = Ring(args.bin_dir, c)
        try:
            loader = pinring.Loader(ring=r.name)
            assert loader.device == "cuda:0", loader.device
            results[f"attached_{copies}_copies_batches_verified"] = check_all(loader)
            loader.close()
        finally:
            r.close()
        assert results[f"attached_{copies}_copies_batches_verified"] == BATCHES, results

    r = Ring(args.bin_dir, cfg, daemon=False, loaders=0)
    try:
        loader = pinring.Loader(ring=r.name, embedded=True, config=str(cfg), backend="cuda")
        for _ in range(4):
            r.loader()
        results["embedded_batches_verified"] = check_all(loader)
        summary = loader.close()
        results["embedded_summary_batches"] = summary["batches_delivered"]
    finally:
        r.close()
    assert results["embedded_batches_verified"] == BATCHES, results

    # A consumer killed while it holds every buffer: the daemon takes back what it held (no event
    # to wait on: its context died with it) and the next consumer resumes right after its takes.
    for copies, c in cfgs.items():
        r = Ring(args.bin_dir, c)
        try:
            child = subprocess.Popen([sys.executable, "-c", CHILD, r.name], stdout=subprocess.PIPE, text=True)
            taken = [int(child.stdout.readline()) for _ in range(4)]
            child.send_signal(signal.SIGKILL)
            child.wait()
            # The next consumer's attach takes the dead one's buffers back (RECLAIMED).
            loader = pinring.Loader(ring=r.name)
            results[f"after_kill_{copies}_copies_verified"] = check_all(loader, start=taken[-1] + 1, keep_at=-1)
            results[f"killed_consumer_{copies}_copies_took"] = taken
            loader.close()
        finally:
            r.close()
        assert results[f"after_kill_{copies}_copies_verified"] == BATCHES - 4, results
    print(json.dumps(results))
    print("gpu consumer check: OK")


if __name__ == "__main__":
    main()
