#!/usr/bin/env python3
"""A real training step fed three ways, on one GPU, in one run: from a batch already on the
device (the ceiling), from PyTorch's DataLoader at its best, and from a pinring ring (its daemon
attached as a separate process, and embedded in the trainer).

The step is torchvision's ResNet-18 (weights=None, conv1 taking 1 channel) on 32 x 512x512 f32
single-channel images with labels in [0, 1000): forward under bf16 autocast, cross-entropy,
backward, SGD step. `--model mlp` is a lighter step (an MLP over the 2x-average-pooled image).

Configurations:
  on-device          one fixed batch resident on the device: the pure step time.
  dataloader         a Dataset that makes each 512x512 f32 sample per index (a cheap pattern:
                     one pass over a base array) and its label; DataLoader(batch_size=32,
                     pin_memory=True, persistent_workers=True), copies with non_blocking=True;
                     every (--workers x --prefetch) pair is run and the best (samples/s) is kept.
  pinring-attached   pinring-daemon --backend cuda --sink consumer and N pinring-loader processes
                     on a config this script writes; pinring.Loader(ring=NAME) yields
                     {"images": [32,512,512] f32, "labels": [32] i64}, already on the device: the
                     trainer copies each batch out of the ring itself (daemon.copies = "consumer").
  pinring-attached-daemon
                     the same with daemon.copies = "daemon": the daemon copies into device buffers
                     the trainer opens through CUDA IPC (a second CUDA context on the GPU).
  pinring-embedded   the same with pinring.Loader(embedded=True, ...): the daemon runs on threads
                     of this process; the loaders are started after it.

Each configuration runs --warmup steps, then --steps measured steps. Measured: wall time between
two torch.cuda.synchronize() calls (at the start and end of the window only, never per step);
step times from CUDA events recorded on the stream after each step (GPU timeline, intervals
between step ends, so a step that waited for data is longer); data_wait_fraction = host wall time
spent inside next() of the batch iterator / window wall time; gpu_idle_fraction = time the stream
had nothing to do between the end of one step and the start of the next (events; the DataLoader's
host-to-device copy is part of its step, not of the idle time); cpu_s_per_step = this process's
CPU seconds (time.process_time(), all its threads: DataLoader's pin thread, an embedded daemon)
per step.

`--verify N` instead takes N raw batches from an attached ring (and from an embedded one) and
checks every byte of every field, on the device, against pinring's generator; exit 1 on any
mismatch.

Output: a table on stdout, OUT/trainer.csv, and one JSON line (the last line of stdout).

Usage:
  trainer.py [--model resnet18|mlp] [--channels-last] [--workers 4,8,12] [--prefetch 2,4]
             [--loaders 8] [--bin-dir DIR] [--out DIR] [--warmup 20] [--steps 200]
  trainer.py --verify 64 [--bin-dir DIR]
  trainer.py --quick --backend host --bin-dir DIR       (CPU smoke test: 64x64, 5 steps)
DIR holds pinring-daemon, pinring-loader and pinring (default: $PINRING_BIN_DIR, else ./bin).
"""

import argparse
import csv
import gc
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

BATCH = 32
CLASSES = 1000
CONFIGS = ("on-device", "dataloader", "pinring-attached", "pinring-attached-daemon", "pinring-embedded")
CSV_COLUMNS = ["config", "workers", "prefetch", "step_ms_mean", "step_ms_p50", "step_ms_p90",
               "samples_per_s", "data_wait_fraction", "cpu_s_per_step", "gpu_idle_fraction"]


# -- the model and its step -----------------------------------------------------------------


class PooledMLP(nn.Module):
    """The light step: 2x average pooling, then two linear layers."""

    def __init__(self, size, hidden=512):
        super().__init__()
        self.pool = nn.AvgPool2d(2)
        self.net = nn.Sequential(nn.Flatten(), nn.Linear((size // 2) ** 2, hidden), nn.ReLU(),
                                 nn.Linear(hidden, CLASSES))

    def forward(self, x):
        return self.net(self.pool(x))


def build_model(args, dev):
    if args.model == "mlp":
        model = PooledMLP(args.size)
    else:
        try:
            from torchvision.models import resnet18
        except ImportError as e:
            raise SystemExit(f"--model resnet18 needs torchvision ({e}); --model mlp does not")
        model = resnet18(weights=None, num_classes=CLASSES)
        model.conv1 = nn.Conv2d(1, 64, kernel_size=7, stride=2, padding=3, bias=False)
    model = model.to(dev)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    return model, opt


def make_step(model, opt, dev, channels_last, prepare=lambda images: images.unsqueeze(1)):
    """One training step (bf16 autocast, SGD) on a batch of images and labels [B]; returns the
    loss (a device tensor: reading it would synchronise). `prepare` turns the batch's images
    into the model's input (by default [B, H, W] -> [B, 1, H, W])."""
    loss_fn = nn.CrossEntropyLoss()

    def step(images, labels):
        if images.device != dev:  # DataLoader's pinned batches; a host-backend ring on a GPU
            images = images.to(dev, non_blocking=True)
            labels = labels.to(dev, non_blocking=True)
        x = prepare(images)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
            loss = loss_fn(model(x), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    return step


# -- measuring ------------------------------------------------------------------------------


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def pct(sorted_values, q):
    """The q-th percentile (0..100) of sorted values, linear between ranks."""
    if not sorted_values:
        return float("nan")
    k = (len(sorted_values) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def measure(step, fetch, dev, warmup, steps, batch=BATCH):
    """Runs warm-up steps, then `steps` measured steps of `batch` samples; `fetch()` returns
    (images, labels).

    The device is synchronised only before and after the measured window. On CUDA, events are
    recorded on the current stream right after each fetch (`got`) and after each step (`done`);
    they are read once, after the final synchronisation."""
    for _ in range(warmup):
        images, labels = fetch()
        step(images, labels)
        del images, labels
    cuda = dev.type == "cuda"
    if cuda:
        start = torch.cuda.Event(enable_timing=True)
        got = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
        done = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
    host_done = []
    wait = 0.0
    loss = None
    sync(dev)
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    if cuda:
        start.record()
    for i in range(steps):
        a = time.perf_counter()
        images, labels = fetch()
        wait += time.perf_counter() - a
        if cuda:
            got[i].record()
        loss = step(images, labels)
        if cuda:
            done[i].record()
        else:
            host_done.append(time.perf_counter())
        del images, labels
    sync(dev)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    if cuda:
        ends = [start] + done
        step_ms = [ends[i].elapsed_time(ends[i + 1]) for i in range(steps)]
        idle_ms = sum(max(0.0, ends[i].elapsed_time(got[i])) for i in range(steps))
        gpu_idle = idle_ms / 1e3 / wall
    else:
        ends = [t0] + host_done
        step_ms = [(ends[i + 1] - ends[i]) * 1e3 for i in range(steps)]
        gpu_idle = wait / wall  # no stream: the device waits exactly when the host does
    s = sorted(step_ms)
    return {
        "step_ms_mean": sum(step_ms) / steps,
        "step_ms_p50": pct(s, 50),
        "step_ms_p90": pct(s, 90),
        "samples_per_s": steps * batch / wall,
        "data_wait_fraction": wait / wall,
        "cpu_s_per_step": cpu / steps,
        "gpu_idle_fraction": gpu_idle,
        "wall_s": wall,
        "steps": steps,
        "loss": float(loss.detach()) if loss is not None else None,
    }


# -- 1. data already on the device ----------------------------------------------------------


def run_on_device(step, dev, args):
    g = torch.Generator(device=dev).manual_seed(0)
    images = torch.rand((BATCH, args.size, args.size), generator=g, device=dev)
    labels = torch.randint(0, CLASSES, (BATCH,), generator=g, device=dev)
    batches = itertools.repeat((images, labels))
    return measure(step, lambda: next(batches), dev, args.warmup, args.steps)


# -- 2. PyTorch DataLoader ------------------------------------------------------------------


class PatternSynthetic(Dataset):
    """n samples of size x size f32, each made when asked for: a base array plus a per-index
    offset (one pass over 1 MiB at 512x512, the cheapest honest per-sample work), and a label."""

    def __init__(self, n, size):
        self.base = np.random.default_rng(0).random((size, size), dtype=np.float32)
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        x = self.base + np.float32((i % 1024) / 1024)
        return x, (i * 7919 + 13) % CLASSES


def run_dataloader(step, dev, args, workers, prefetch):
    ds = PatternSynthetic((args.warmup + args.steps) * BATCH, args.size)
    kwargs = dict(batch_size=BATCH, shuffle=False, pin_memory=dev.type == "cuda", drop_last=True,
                  num_workers=workers)
    if workers > 0:
        kwargs.update(persistent_workers=True, prefetch_factor=prefetch)
    loader = DataLoader(ds, **kwargs)
    it = iter(loader)

    def fetch():
        images, labels = next(it)
        return images.to(dev, non_blocking=True), labels.to(dev, non_blocking=True)

    try:
        return measure(step, fetch, dev, args.warmup, args.steps)
    finally:
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        del it, loader
        gc.collect()


# -- 3. and 4. pinring, attached and embedded -----------------------------------------------


PINRING_CONFIG = """\
[ring]
slot_bytes = "auto"
[dataset]
kind = "synthetic"
samples = {samples}
sample_shape = [{size}, {size}]
dtype = "f32"
classes = {classes}
[plan]
batch_size = {batch}
epochs = {epochs}
drop_last = true
"""


def binary(args, name, required=True):
    path = os.path.join(args.bin_dir, name)
    if os.access(path, os.X_OK):
        return path
    if required:
        raise SystemExit(f"{path} not found: pass --bin-dir DIR (or set PINRING_BIN_DIR) to the folder "
                         f"holding pinring-daemon, pinring-loader and pinring")
    return None


class PinringRing:
    """One ring for one configuration: its config file, its daemon (unless embedded), its
    loaders, their logs; everything stopped and removed by close()."""

    def __init__(self, args, tmp, tag, batches_needed, config_text=None, copies=None):
        """`config_text`: the ring's config (`ring.name` is given on the command lines); None:
        the synthetic config of this script, with enough epochs for `batches_needed`."""
        self.args = args
        self.name = f"trainer-{os.getpid()}-{tag}"
        self.config = os.path.join(tmp, f"{self.name}.toml")
        if config_text is None:
            per_epoch = args.samples // BATCH
            if per_epoch < 1:
                raise SystemExit(f"--samples {args.samples} is less than one batch of {BATCH}")
            epochs = math.ceil(batches_needed / per_epoch) + 1
            text = PINRING_CONFIG.format(samples=args.samples, size=args.size, classes=CLASSES,
                                         batch=BATCH, epochs=epochs)
        else:
            text = config_text
        daemon = ""
        if args.ring_prefetch:
            daemon += f"prefetch = {args.ring_prefetch}\n"
        if copies:
            daemon += f'copies = "{copies}"\n'
        if daemon:
            text += "[daemon]\n" + daemon
        with open(self.config, "w") as f:
            f.write(text)
        self.summary_path = os.path.join(args.out, f"{self.name}-daemon.json")
        self.daemon = None
        self.loaders = []
        self.logs = []
        self.env = dict(os.environ, RUST_LOG="warn")

    def _spawn(self, what, argv):
        log = open(os.path.join(self.args.out, f"{self.name}-{what}.log"), "w")
        self.logs.append(log)
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=self.env)

    def start_daemon(self):
        a = self.args
        self.daemon = self._spawn("daemon", [
            binary(a, "pinring-daemon"), "--backend", a.backend, "--device", str(a.device_index),
            "--sink", "consumer", "--config", self.config, "--ring", self.name,
            "--summary", self.summary_path, "--log-level", "warn"])

    def start_loaders(self, n):
        for i in range(n):
            self.loaders.append(self._spawn(f"loader{i}", [
                binary(self.args, "pinring-loader"), "--ring", self.name, "--config", self.config,
                "--wait-secs", "60", "--log-level", "warn"]))

    def check_alive(self):
        if self.daemon is not None and self.daemon.poll() is not None:
            raise RuntimeError(f"pinring-daemon of ring {self.name} exited with {self.daemon.returncode}; "
                               f"see {self.args.out}/{self.name}-daemon.log")

    def wait_attached(self, n, timeout=60.0):
        """Waits until n loaders are in the ring's loader table (`pinring status --json`). Without
        the pinring binary, the warm-up steps are the only wait."""
        exe = binary(self.args, "pinring", required=False)
        if exe is None:
            return False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            out = subprocess.run([exe, "status", self.name, "--json", "--interval", "0.1"],
                                 capture_output=True, text=True, env=self.env)
            if out.returncode == 0:
                try:
                    rings = json.loads(out.stdout)
                    if rings and len(rings[0]["snapshot"]["loaders"]) >= n:
                        return True
                except (ValueError, KeyError, IndexError, TypeError):
                    pass
            time.sleep(0.05)
        raise RuntimeError(f"{n} loaders never attached to ring {self.name} in {timeout:.0f} s")

    def daemon_summary(self):
        try:
            with open(self.summary_path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def close(self):
        """SIGTERM the daemon (it drains) and wait for it; the loaders leave when their ring
        closes, and are killed if they have not within a few seconds."""
        rc = None
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.send_signal(signal.SIGTERM)
            try:
                rc = self.daemon.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
                rc = self.daemon.wait()
        elif self.daemon is not None:
            rc = self.daemon.returncode
        deadline = time.monotonic() + 5
        for p in self.loaders:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for log in self.logs:
            log.close()
        seg = f"/dev/shm/pinring.{self.name}"
        if os.path.exists(seg):
            os.unlink(seg)
        return rc


def open_pinring(args, tmp, embedded, loaders, tag, batches_needed, config_text=None, copies=None):
    """Starts a ring for one configuration (see PinringRing for `config_text` and `copies`);
    returns (ring, pinring.Loader)."""
    import pinring

    ring = PinringRing(args, tmp, tag, batches_needed, config_text, copies)
    device = args.device_index if args.backend == "cuda" else None
    try:
        if embedded:
            loader = pinring.Loader(ring=ring.name, device=device, embedded=True, config=ring.config,
                                    backend=args.backend)
            ring.start_loaders(loaders)
        else:
            ring.start_daemon()
            ring.start_loaders(loaders)
            loader = pinring.Loader(ring=ring.name, device=device, wait_for_ring=60.0)
        ring.wait_attached(loaders)
        return ring, loader
    except BaseException:
        ring.close()
        raise


def close_pinring(ring, loader, embedded):
    """Detaches (an embedded daemon stops and drains here), then stops the rest; returns the
    daemon's summary."""
    gc.collect()
    summary = loader.close()
    rc = ring.close()
    if not embedded:
        summary = ring.daemon_summary()
        if rc not in (0, None):
            print(f"  note: pinring-daemon of {ring.name} exited with {rc}", flush=True)
    return summary


def measure_ring(ring, loader, embedded, step, dev, warmup, batches, **kw):
    """Times `step` (`measure`) over the batches of `loader`, one epoch after another, then
    closes the ring (`close_pinring`); returns (measure's result, the daemon's summary)."""
    try:
        state = {"it": iter(loader)}

        def fetch():
            try:
                b = next(state["it"])
            except StopIteration:  # an epoch ended: the next one
                state["it"] = iter(loader)
                b = next(state["it"])
            return b["images"], b["labels"]

        r = measure(step, fetch, dev, warmup, batches, **kw)
        del state, fetch
    except BaseException:
        gc.collect()
        loader.close()
        ring.close()
        raise
    return r, close_pinring(ring, loader, embedded)


def run_pinring(step, dev, args, tmp, embedded, loaders, copies=None):
    tag = f"{'emb' if embedded else 'att'}{loaders}{copies or ''}"
    ring, loader = open_pinring(args, tmp, embedded, loaders, tag, args.warmup + args.steps, copies=copies)
    r, summary = measure_ring(ring, loader, embedded, step, dev, args.warmup, args.steps)
    if summary:
        keys = ["bound", "gbps", "batches_delivered", "parts_per_batch", "latency_p50_us",
                "latency_p99_us", "error"]
        if not embedded:  # an embedded daemon's CPU is this process's, already in cpu_s_per_step
            keys.append("daemon_cpu_seconds")
        r["daemon"] = {k: summary.get(k) for k in keys}
    r["prefetch"] = args.ring_prefetch or "auto"
    return r


# -- --verify N -------------------------------------------------------------------------------


def verify(args, tmp, dev, n):
    """Takes n raw batches from an attached ring, then from an embedded one, and compares every
    byte of every field, where the field is (on the GPU with the cuda backend), with the
    generator's bytes of that batch number. Returns the number of mismatches."""
    bad = 0
    for embedded in (False, True):
        what = "embedded" if embedded else "attached"
        ring, loader = open_pinring(args, tmp, embedded, args.verify_loaders, f"verify-{what[:3]}", n)
        checked = nbytes = 0
        where = None
        try:
            c = loader._attach()
            for b in loader.batches():
                want = c.expected(b.batch)
                for name, field in b.fields.items():
                    t = torch.from_dlpack(field)
                    where = str(t.device)
                    got = t.reshape(-1).view(torch.uint8)
                    exp = torch.frombuffer(bytearray(want[name]), dtype=torch.uint8).to(t.device)
                    if got.numel() != exp.numel() or not torch.equal(got, exp):
                        bad += 1
                        if got.numel() != exp.numel():
                            detail = f"{got.numel()} bytes, expected {exp.numel()}"
                        else:
                            first = int(torch.nonzero(got != exp)[0])
                            detail = f"first differing byte at {first}"
                        print(f"  MISMATCH {what}: batch {b.batch} (seq {b.seq}), field {name} "
                              f"{tuple(t.shape)} {field.dtype}: {detail}", flush=True)
                    nbytes += exp.numel()
                    del t, got, exp
                checked += 1
                del b
                if checked >= n:
                    break
        finally:
            gc.collect()
            loader.close()
            ring.close()
        print(f"verify {what}: {checked} batches, {nbytes / 2**20:.1f} MiB compared on {where}"
              f"{'' if checked == n else f' (wanted {n})'}", flush=True)
        if checked < n:
            bad += 1
    return bad


# -- the run ----------------------------------------------------------------------------------


def ints(text):
    return [int(x) for x in str(text).split(",") if x.strip()]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=("resnet18", "mlp"), default="resnet18")
    ap.add_argument("--channels-last", action="store_true", help="model and input in channels_last")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--size", type=int, default=None, help="image side (default 512; --quick: 64)")
    ap.add_argument("--samples", type=int, default=None, help="pinring dataset samples (default 4096)")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up steps (default 20; --quick: 2)")
    ap.add_argument("--steps", type=int, default=None, help="measured steps (default 200; --quick: 5)")
    ap.add_argument("--workers", default=None, help="DataLoader workers to sweep (default 4,8,12; --quick: 2)")
    ap.add_argument("--prefetch", default=None, help="DataLoader prefetch_factor to sweep (default 2,4; --quick: 2)")
    ap.add_argument("--loaders", default=None, help="pinring loader processes, a list (default 8; --quick: 2)")
    ap.add_argument("--ring-prefetch", type=int, default=None,
                    help="the ring's daemon.prefetch (batch buffers; default: pinring's auto)")
    ap.add_argument("--backend", choices=("cuda", "host"), default="cuda",
                    help="pinring's backend (host: CPU tensors, for a smoke test without a GPU)")
    ap.add_argument("--device", default=None, help="torch device (default cuda:0, else cpu)")
    ap.add_argument("--bin-dir", default=os.environ.get("PINRING_BIN_DIR", "bin"),
                    help="folder of pinring-daemon, pinring-loader, pinring "
                         "(default $PINRING_BIN_DIR, else ./bin)")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"which to run (default {','.join(CONFIGS)})")
    ap.add_argument("--out", default=".")
    ap.add_argument("--quick", action="store_true", help="CPU smoke test: --size 64, 5 steps, 2 workers")
    ap.add_argument("--verify", type=int, default=0, metavar="N",
                    help="only check N batches of an attached and of an embedded ring, byte for byte")
    ap.add_argument("--verify-loaders", type=int, default=4)
    args = ap.parse_args(argv)
    quick = args.quick
    for name, full, small in (("size", 512, 64), ("samples", 4096, 512), ("warmup", 20, 2), ("steps", 200, 5),
                              ("workers", "4,8,12", "2"), ("prefetch", "2,4", "2"), ("loaders", "8", "2")):
        if getattr(args, name) is None:
            setattr(args, name, small if quick else full)
    if args.device is None:
        args.device = "cuda:0" if torch.cuda.is_available() else "cpu"
    dev = torch.device(args.device)
    args.device_index = (dev.index or 0) if dev.type == "cuda" else 0
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = set(args.configs) - set(CONFIGS)
    if unknown:
        ap.error(f"unknown --configs {sorted(unknown)}; choose from {','.join(CONFIGS)}")
    return args, dev


def finite(x):
    """x with every non-finite float (a NaN loss) as None, so the JSON line is strict JSON."""
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def describe(dev):
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return "cpu"


def main(argv=None):
    args, dev = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    args.bin_dir = os.path.abspath(args.bin_dir)
    args.out = os.path.abspath(args.out)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        torch.backends.cudnn.benchmark = True
    mib = BATCH * args.size * args.size * 4 / 2**20
    print(f"device: {describe(dev)}; torch {torch.__version__}; {os.cpu_count()} CPUs; model {args.model}"
          f"{' channels_last' if args.channels_last else ''}; batch {BATCH} x {args.size}x{args.size} f32 "
          f"= {mib:.1f} MiB; pinring backend {args.backend}", flush=True)

    with tempfile.TemporaryDirectory(prefix="pinring-trainer-") as tmp:
        if args.verify:
            if dev.type != "cuda" and args.backend == "cuda":
                raise SystemExit("--verify with --backend cuda needs a CUDA device (or pass --backend host)")
            bad = verify(args, tmp, dev, args.verify)
            print(json.dumps({"bench": "trainer-verify", "batches": args.verify, "backend": args.backend,
                              "mismatches": bad, "ok": bad == 0}))
            return 1 if bad else 0

        model, opt = build_model(args, dev)
        step = make_step(model, opt, dev, args.channels_last)
        pinring_ok = not (dev.type != "cuda" and args.backend == "cuda")
        rows = []

        def report(config, workers, prefetch, r):
            r.update(config=config, workers=workers, prefetch=prefetch)
            rows.append(r)
            print(f"{config:<23} {workers:>7} {str(prefetch):>8} {r['step_ms_mean']:>9.2f} {r['step_ms_p50']:>8.2f} "
                  f"{r['step_ms_p90']:>8.2f} {r['samples_per_s']:>10.1f} {r['data_wait_fraction']:>9.3f} "
                  f"{r['gpu_idle_fraction']:>8.3f} {r['cpu_s_per_step'] * 1e3:>9.2f}", flush=True)

        print(f"\n{'config':<23} {'workers':>7} {'prefetch':>8} {'step ms':>9} {'p50':>8} {'p90':>8} "
              f"{'samples/s':>10} {'data wait':>9} {'GPU idle':>8} {'CPU ms/st':>9}")
        print("(workers: DataLoader workers or pinring loaders; prefetch: prefetch_factor or the ring's "
              "batch buffers; CPU: this process per step)")
        if "on-device" in args.configs:
            report("on-device", 0, "", run_on_device(step, dev, args))
        if "dataloader" in args.configs:
            for workers in ints(args.workers):
                for prefetch in ints(args.prefetch) if workers else [""]:  # no workers: no prefetch_factor
                    r = run_dataloader(step, dev, args, workers, prefetch)
                    report("dataloader", workers, prefetch, r)
        for config, embedded, copies in (("pinring-attached", False, None),
                                         ("pinring-attached-daemon", False, "daemon"),
                                         ("pinring-embedded", True, None)):
            if config not in args.configs:
                continue
            if not pinring_ok:
                print(f"{config:<23} skipped: no CUDA device here (pinring without a GPU: --backend host)")
                continue
            for n in ints(args.loaders):
                r = run_pinring(step, dev, args, tmp, embedded, n, copies)
                report(config, n, r["prefetch"], r)

    with open(os.path.join(args.out, "trainer.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for r in rows:
            w.writerow([r[c] if isinstance(r[c], (str, int)) else f"{r[c]:.6g}" for c in CSV_COLUMNS])

    def best(config):
        rs = [r for r in rows if r["config"] == config]
        return max(rs, key=lambda r: r["samples_per_s"]) if rs else None

    summary = {"bench": "trainer", "device": describe(dev), "torch": torch.__version__, "model": args.model,
               "channels_last": args.channels_last, "size": args.size, "batch": BATCH, "steps": args.steps,
               "warmup": args.warmup, "backend": args.backend, "cpus": os.cpu_count()}
    print()
    ceiling = best("on-device")
    dl = best("dataloader")
    for config in CONFIGS:
        b = best(config)
        if b is None:
            continue
        keep = {k: b[k] for k in CSV_COLUMNS + ["loss"] + (["daemon"] if "daemon" in b else [])}
        summary[config.replace("-", "_")] = keep
        line = f"{config:<23} {b['samples_per_s']:>10.1f} samples/s"
        if ceiling and config != "on-device":
            line += f", {b['samples_per_s'] / ceiling['samples_per_s']:.0%} of on-device"
            summary[config.replace("-", "_")]["of_on_device"] = b["samples_per_s"] / ceiling["samples_per_s"]
        if dl and config.startswith("pinring"):
            ratio = b["samples_per_s"] / dl["samples_per_s"]
            cpu = b["cpu_s_per_step"] / dl["cpu_s_per_step"] if dl["cpu_s_per_step"] else float("nan")
            line += (f", {ratio:.2f}x the best DataLoader ({dl['workers']} workers, prefetch {dl['prefetch'] or '-'}), "
                     f"trainer CPU {cpu:.2f}x its")
            summary[config.replace("-", "_")]["vs_best_dataloader"] = ratio
            summary[config.replace("-", "_")]["cpu_vs_best_dataloader"] = cpu
        if config == "dataloader":
            line += f" (best: {b['workers']} workers, prefetch {b['prefetch'] or '-'})"
        print(line)
    print(f"CSV: {os.path.join(args.out, 'trainer.csv')}")
    print(json.dumps(finite(summary)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
