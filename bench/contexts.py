"""Run on a GPU host: python3 contexts.py BIN_DIR.

1. Does another process's CUDA context, doing a little periodic work, slow the daemon's copies?
   The discard sink alone, then with such a process beside it, twice.
2. Do CuPy and JAX take pinring's fields through DLPack, byte-exact?
3. Do loaders exit promptly when an embedded daemon stops while a tensor of its buffers lives?

Lines starting with RESULT are the findings (docs/BENCHMARKS.md, "The trainer's end at full rate").
"""
import json, subprocess, sys, tempfile, time, uuid
from pathlib import Path
bin_dir = sys.argv[1]
cfg = Path(tempfile.mkdtemp()) / "c.toml"
cfg.write_text('[dataset]\nsamples = 4096\nsample_shape = [512, 512]\ndtype = "f32"\n[plan]\nbatch_size = 32\nepochs = 16\n')
NOISE = """
import torch, time
s = torch.cuda.Stream(); e = torch.cuda.Event()
x = torch.zeros(1, device="cuda")
print("ready", flush=True)
while True:
    with torch.cuda.stream(s):
        x += 1
    e.record(s); e.synchronize()
    time.sleep(0.0005)
"""
def discard(noise):
    ring = f"cx-{uuid.uuid4().hex[:6]}"; summ = Path(tempfile.mkdtemp()) / "s.json"
    n = None
    if noise:
        n = subprocess.Popen([sys.executable, "-c", NOISE], stdout=subprocess.PIPE, text=True); n.stdout.readline()
    d = subprocess.Popen([f"{bin_dir}/pinring-daemon","--ring",ring,"--backend","cuda","--sink","discard","--config",str(cfg),"--summary",str(summ)], stderr=subprocess.DEVNULL)
    ls = [subprocess.Popen([f"{bin_dir}/pinring-loader","--ring",ring,"--config",str(cfg),"--wait-secs","60"], stderr=subprocess.DEVNULL) for _ in range(8)]
    d.wait(300)
    for l in ls: l.wait(30)
    if n: n.kill(); n.wait()
    return json.loads(summ.read_text())["gbps"]
for i in range(2):
    print(f"RESULT discard alone {discard(False):.2f} GB/s; with another process's context doing light work {discard(True):.2f} GB/s", flush=True)
# DLPack into CuPy and JAX
import pinring
ring = f"dl-{uuid.uuid4().hex[:6]}"
small = Path(tempfile.mkdtemp()) / "s.toml"
small.write_text('[dataset]\nsamples = 256\nsample_shape = [64, 64]\ndtype = "f32"\n[plan]\nbatch_size = 8\nepochs = 1\n')
loader = pinring.Loader(ring=ring, embedded=True, config=str(small), backend="cuda")
ls = [subprocess.Popen([f"{bin_dir}/pinring-loader","--ring",ring,"--config",str(small),"--wait-secs","60"], stderr=subprocess.DEVNULL) for _ in range(2)]
c = loader._attach()
import cupy, numpy as np
b = c.next_batch(30)
want = c.expected(b.batch)
cp_img = cupy.from_dlpack(b.fields["images"])
cp_lab = cupy.from_dlpack(b.fields["labels"])
ok_cp = cupy.asnumpy(cp_img).tobytes() == want["images"] and cupy.asnumpy(cp_lab).tobytes() == want["labels"]
print("RESULT cupy", cp_img.shape, cp_img.dtype, cp_lab.dtype, "bytes match:", ok_cp, flush=True)
try:
    import jax, jax.dlpack
    j = jax.dlpack.from_dlpack(b.fields["labels"])
    print("RESULT jax", j.shape, j.dtype, j.devices(), "match:", np.asarray(j).tobytes() == want["labels"], flush=True)
except Exception as e:
    print("jax:", type(e).__name__, e)
del cp_img, cp_lab, b
while (x := c.next_batch(30)) is not None:
    del x
loader.close()          # the JAX array still holds its batch
t = time.time()
for l in ls: l.wait(30)
print(f"RESULT loaders exited {time.time() - t:.2f} s after the embedded daemon stopped, a JAX array still alive: {j.shape}", flush=True)
