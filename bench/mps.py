#!/usr/bin/env python3
"""The attached trainer under CUDA MPS, on a GPU host where nobody else runs MPS: what MPS
changes in the trainer's rate, and what a fatal GPU fault in another process does to the
daemon and to the trainer.

1. Starts an MPS control daemon of its own (pipe and log directories in a temporary folder).
2. Runs bench/consumer_rate.py under it (every sink, ``--repeat`` alternated rounds).
3. For each ``daemon.copies`` setting, first without MPS, then under it: a daemon with 4 loaders and a trainer taking batches
   (printing each seq); after 20 batches another process launches a kernel that writes to
   address 0x10 (a fatal fault in its context); 3 s later: are the daemon and the trainer (which
   takes 100 batches a second, so the plan outlasts the check) alive, and how many batches did
   the trainer take meanwhile.
4. Stops the MPS control daemon (``quit``).

Usage: mps.py --bin-dir DIR [--repeat 2] [--out DIR]
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent

CONFIG = """
[ring]
slots = 16
[dataset]
samples = 4096
sample_shape = [512, 512]
dtype = "f32"
[plan]
batch_size = 32
epochs = 20
[daemon]
prefetch = 4
copies = "{copies}"
"""

TRAINER = textwrap.dedent(
    """
    import sys, time, torch, pinring
    loader = pinring.Loader(ring=sys.argv[1])
    for b in loader.batches():
        t = {k: torch.from_dlpack(f) for k, f in b.fields.items()}
        s = float(t["images"][0, 0, 0].item())
        print(b.seq, flush=True)
        del t, b
        time.sleep(0.01)  # a step: the plan outlasts the check
    """
)

FAULT = textwrap.dedent(
    """
    import cupy
    k = cupy.RawKernel(r'extern "C" __global__ void f() { *(volatile int*)0x10 = 1; }', "f")
    k((1,), (1,), ())
    cupy.cuda.runtime.deviceSynchronize()
    """
)


def fault_check(args, env, copies, tmp):
    cfg = tmp / f"fault-{copies}.toml"
    cfg.write_text(CONFIG.format(copies=copies))
    name = f"mps-{uuid.uuid4().hex[:8]}"
    daemon = subprocess.Popen([f"{args.bin_dir}/pinring-daemon", "--ring", name, "--backend", "cuda", "--sink",
                               "consumer", "--config", str(cfg), "--log-level", "warn"], env=env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    loaders = [subprocess.Popen([f"{args.bin_dir}/pinring-loader", "--ring", name, "--config", str(cfg),
                                 "--wait-secs", "60"], env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(4)]
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, name], env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    os.set_blocking(trainer.stdout.fileno(), False)
    seen = []

    def read():
        while True:
            line = trainer.stdout.readline()
            if not line:
                return
            seen.append(int(line))

    try:
        deadline = time.time() + 60
        while len(seen) < 20 and time.time() < deadline and trainer.poll() is None:
            read()
            time.sleep(0.01)
        before = len(seen)
        fault = subprocess.run([sys.executable, "-c", FAULT], env=env, capture_output=True, text=True)
        time.sleep(3)
        read()
        after = len(seen)
        return {
            "copies": copies,
            "fault_process_exit": fault.returncode,
            "fault_error": (fault.stderr.strip().splitlines() or [""])[-1][:200],
            "daemon_alive_3s_after": daemon.poll() is None,
            "trainer_alive_3s_after": trainer.poll() is None,
            "trainer_exit": trainer.poll(),
            "trainer_batches_before_fault": before,
            "trainer_batches_in_3s_after": after - before,
        }
    finally:
        for p in [trainer, *loaders, daemon]:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in [trainer, *loaders, daemon]:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        err = trainer.stderr.read() if trainer.stderr else ""
        if err.strip():
            print(f"  trainer ({copies}) said: {err.strip().splitlines()[-1][:300]}", flush=True)
        err = daemon.stderr.read() if daemon.stderr else ""
        if err.strip():
            print(f"  daemon ({copies}) said: {err.strip().splitlines()[-1][:300]}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--faults-only", action="store_true", help="skip the rate comparison")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(tmp / "pipe"), CUDA_MPS_LOG_DIRECTORY=str(tmp / "log"))
    (tmp / "pipe").mkdir()
    (tmp / "log").mkdir()
    results = {"faults_without_mps": [fault_check(args, dict(os.environ), c, tmp) for c in ("consumer", "daemon")]}
    for f in results["faults_without_mps"]:
        print("no mps", json.dumps(f), flush=True)
    subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, check=True)
    try:
        if not args.faults_only:
            rate = subprocess.run([sys.executable, str(HERE / "consumer_rate.py"), "--bin-dir", args.bin_dir,
                                   "--repeat", str(args.repeat)], env=env, capture_output=True, text=True)
            for line in rate.stdout.splitlines():
                if line.startswith("run ") or line.startswith("mode") or "%" in line:
                    print("mps", line, flush=True)
            results["rate"] = json.loads(rate.stdout.strip().splitlines()[-1])
        results["faults"] = [fault_check(args, env, copies, tmp) for copies in ("consumer", "daemon")]
        for f in results["faults"]:
            print("mps", json.dumps(f), flush=True)
    finally:
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env=env, text=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "mps.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
