"""How ``pinring.torch.DataLoader``'s workers start and end, seen from a training script:

- each start method (fork, spawn, forkserver) delivers every sample;
- a script without ``if __name__ == "__main__":`` runs under fork, and under spawn or
  forkserver fails at once with a ``UsageError`` naming the guard (never a hang, a restart or
  blame on the dataset);
- a 1 GB in-memory dataset reaches its first batch about as fast as through torch's DataLoader
  (its workers inherit it: nothing is pickled);
- a trainer that ends in any way (normal exit, exception, Ctrl-C, SIGTERM, SIGKILL, with a
  worker hung in ``__getitem__``) leaves no worker, no zygote and nothing in /dev/shm;
- the seed's workload runs in a 64 MiB /dev/shm (as root, in a mount namespace of its own);
- Ctrl-C in the loop and ``close()`` after a ``Timeout`` return quickly;
- the lease warning reaches stderr under Python's default logging.

Scripts run in child processes (``python -c``) with this directory on ``sys.path``."""

import contextlib
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

torch = pytest.importorskip("torch")

import pinring  # noqa: E402
from pinring.torch import DataLoader, _procs  # noqa: E402

import loader_datasets as ds  # noqa: E402

HERE = pathlib.Path(__file__).parent
# Seconds a child script may run before the test calls it hung (a guard, not a figure).
HUNG = 120
# What "at once" and "within a second" may take on a loaded CI machine: the design figures are
# 1 s (everything of a dead trainer gone; in practice milliseconds, since it is event-driven:
# a pidfd and PR_SET_PDEATHSIG) and 0.5 s (Ctrl-C).
GONE_WITHIN = 5.0


@contextlib.contextmanager
def script_file(body):
    """`body` as a script file (with no main guard, as the seed's has none), removed after."""
    path = HERE / f"_script_{os.getpid()}_{time.monotonic_ns()}.py"
    path.write_text(textwrap.dedent(body))
    try:
        yield path
    finally:
        path.unlink()


@contextlib.contextmanager
def child_running(body, *args, command=None):
    """A child running `body` (or `command`, given the script's path) with pipes to it; killed
    if the test leaves it running."""
    with script_file(body) as path:
        argv = command(path) if command else [sys.executable, str(path), *args]
        child = subprocess.Popen(argv, cwd=HERE, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        try:
            yield child
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()


def run_script(body, *args, timeout=HUNG):
    """Runs `body` as a script in a child, to its end."""
    with script_file(body) as path:
        return subprocess.run([sys.executable, str(path), *args], cwd=HERE,
                              capture_output=True, text=True, timeout=timeout)


def held_in_dev_shm(pids):
    """The /dev/shm names processes `pids` have open or mapped now (a segment, a semaphore)."""
    names = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                names.update(line.split("/dev/shm/", 1)[1].split()[0]
                             for line in f if "/dev/shm/" in line)
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("/dev/shm/"):
                names.add(target[len("/dev/shm/"):].split()[0])
    return names


def left_in_dev_shm(pids, held=()):
    """What is in /dev/shm now of the names processes `pids` could have made: a name that
    carries one of their pids (pinring's rings are named after their process) or one they held
    (`held_in_dev_shm`, looked at while they ran). Names other processes of the machine make or
    remove meanwhile are not looked at."""
    import re

    mine = re.compile(r"(?<![0-9])(" + "|".join(str(p) for p in pids) + r")(?![0-9])")
    return sorted(n for n in os.listdir("/dev/shm") if n in held or mine.search(n))


def alive(pid):
    """Whether process `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def wait_gone(pids, within=GONE_WITHIN):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.01)
    return [p for p in pids if alive(p)]


# A dataset of 96 ids, defined at the top level of a script (where spawned processes find it).
IDS = """
import sys, numpy as np, torch
from pinring.torch import DataLoader

class Ids(torch.utils.data.Dataset):
    def __len__(self):
        return 96
    def __getitem__(self, i):
        return np.full(3, i, dtype=np.int64)
"""

SAMPLES = IDS + """
loader = DataLoader(Ids(), batch_size=8, shuffle=True, num_workers=2, device="cpu",
                    multiprocessing_context=None if sys.argv[1] == "default" else sys.argv[1])
got = sorted(x for b in loader for x in b[:, 0].tolist())
assert got == list(range(96)), got
print("ok", loader.start_method)
"""


GUARDED = IDS + """
if __name__ == "__main__":
    loader = DataLoader(Ids(), batch_size=8, shuffle=True, num_workers=2, device="cpu",
                        multiprocessing_context=sys.argv[1])
    for epoch in range(2):
        got = sorted(x for b in loader for x in b[:, 0].tolist())
        assert got == list(range(96)), got
    loader.close()
    print("ok", loader.start_method)
"""


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_each_start_method_delivers_every_sample(method):
    """A script with a main guard: every sample once per epoch under each start method."""
    r = run_script(GUARDED, method)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ok", method], r.stdout


def test_a_script_without_a_main_guard_runs_under_fork():
    """The seed's script has no main guard: with the default start method (fork on Linux up to
    Python 3.13, as torch's) it runs, as it does with torch's DataLoader."""
    if _procs.start_method(None) != "fork":
        pytest.skip("this Python's default start method is not fork")
    r = run_script(SAMPLES, "default")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ok", "fork"], r.stdout
    r = run_script(SAMPLES, "fork")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_script_without_a_main_guard_under_spawn_fails_at_once_with_the_fix(method):
    t = time.monotonic()
    with child_running(SAMPLES, method) as child:
        out, err = child.communicate(timeout=HUNG)
    r = subprocess.CompletedProcess(child.args, child.returncode, out, err)
    took = time.monotonic() - t
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("pinring.UsageError"), r.stderr
    assert 'if __name__ == "__main__":' in last and 'multiprocessing_context="fork"' in last, last
    assert "bootstrapping phase" not in r.stderr and "crashes the interpreter" not in r.stderr
    # Once: the zygote that found the script unguarded ends, nothing is restarted (a guard
    # against a hang or a loop of restarts, not a speed figure).
    assert took < HUNG / 2, f"{took:.1f} s"
    assert left_in_dev_shm([child.pid]) == []


FIRST_BATCH = """
import json, time, numpy as np, torch
from pinring.torch import DataLoader

class Seed(torch.utils.data.Dataset):
    def __init__(self):
        self.data = [np.full((512, 512), i, dtype=np.float32) for i in range(1000)]
    def __len__(self):
        return len(self.data)
    def __getitem__(self, i):
        return self.data[i]

data = Seed()
def first(make):
    t = time.monotonic()
    loader = make()
    it = iter(loader)
    batch = next(it)
    return time.monotonic() - t, batch, loader

t_torch, b, loader = first(lambda: torch.utils.data.DataLoader(
    data, batch_size=32, num_workers=4, multiprocessing_context="fork"))
del b, loader
t_pin, b, loader = first(lambda: DataLoader(
    data, batch_size=32, num_workers=4, device="cpu", multiprocessing_context="fork"))
assert b.shape == (32, 512, 512)
print(json.dumps({"torch": t_torch, "pinring": t_pin}))
"""


def test_a_1gb_dataset_reaches_its_first_batch_about_as_fast_as_through_torch():
    """The seed's dataset (1000 arrays of 512x512 float32 in a list, 1 GB) with 4 forked
    workers: pinring's workers inherit it, so its first batch comes about as soon as torch's
    DataLoader's. The target (torch's time + 0.5 s) is measured in bench/seed_script.py; this
    bound only catches a dataset pickled to every worker (56 s before)."""
    r = run_script(FIRST_BATCH)
    assert r.returncode == 0, r.stderr
    t = json.loads(r.stdout)
    print(f"first batch: torch {t['torch']:.2f} s, pinring {t['pinring']:.2f} s")
    assert t["pinring"] < 2 * t["torch"] + 3.0, t


LEFT_BEHIND = """
import json, os, signal, sys, time, numpy as np, torch
from pinring.torch import DataLoader
signal.signal(signal.SIGINT, signal.default_int_handler)

class HangsAt(torch.utils.data.Dataset):
    # Sample 40 never loads: the worker that takes it hangs in __getitem__.
    def __len__(self):
        return 200
    def __getitem__(self, i):
        if i == 40:
            time.sleep(3600)
        return np.full((64, 64), i, dtype=np.float32)

how = sys.argv[1]
loader = DataLoader(HangsAt(), batch_size=8, num_workers=2, device="cpu")
it = iter(loader)
next(it)
print(json.dumps({
    "workers": [w.pid for w in loader._pool.workers],
    "zygote": loader._zygote.pid,
    "ring": loader._ticket.path,
}), flush=True)
if how == "exit":
    sys.exit(0)
if how == "exception":
    raise RuntimeError("the training step failed")
for batch in it:  # waits for sample 40's batch, which never comes
    pass
"""


@pytest.mark.parametrize("how", ["exit", "exception", "sigint", "sigterm", "sigkill"])
def test_a_trainer_that_ends_in_any_way_leaves_nothing_behind(how):
    with child_running(LEFT_BEHIND, how) as child:
        line = child.stdout.readline()
        assert line, child.stderr.read()
        seen = json.loads(line)
        pids = seen["workers"] + [seen["zygote"]]
        assert all(alive(p) for p in pids)
        held = held_in_dev_shm([child.pid, *pids])
        assert seen["ring"].startswith(f"/proc/{child.pid}/fd/"), seen
        if how.startswith("sig"):
            child.send_signal({"sigint": signal.SIGINT, "sigterm": signal.SIGTERM,
                               "sigkill": signal.SIGKILL}[how])
        child.wait(HUNG)
        t = time.monotonic()
        left = wait_gone(pids)
        assert left == [], f"still running {time.monotonic() - t:.1f} s after the trainer: {left}"
        assert left_in_dev_shm([child.pid, *pids], held) == []
        if how == "sigint":
            assert "KeyboardInterrupt" in child.stderr.read()


ON_DISK = IDS + """
import json, time
import pinring

# The DataLoader first: its zygote is forked before any daemon runs here.
loader = DataLoader(Ids(), batch_size=8, num_workers=2, device="cpu")
next(iter(loader))
files = pinring.Loader(config=sys.argv[1], loaders=2, backend="host", as_numpy=True)
next(files.batches())
data = pinring.Loader(dataset={"samples": 256, "sample_shape": [4], "dtype": "f32"},
                      batch_size=8, loaders=1, backend="host", as_numpy=True)
next(data.batches())
print(json.dumps(files.loader_pids + data.loader_pids + [w.pid for w in loader._pool.workers]
                 + [loader._zygote.pid]), flush=True)
time.sleep(3600)  # SIGKILLed here
"""


def test_a_sigkilled_trainer_leaves_nothing_on_disk(tmp_path):
    """pinring.Loader(loaders=N) (a config file, and a config given as data) and the
    DataLoader keep their configs and the loaders' logs in memfds: a trainer SIGKILLed while
    all three run leaves nothing in its $TMPDIR (a directory of configs and logs each, before)."""
    from test_consumer import CONFIG

    config = tmp_path / "pinring.toml"
    config.write_text(CONFIG.replace("epochs = 2", "epochs = 100"))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    with script_file(ON_DISK) as path:
        child = subprocess.Popen([sys.executable, str(path), str(config)], cwd=HERE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env={**os.environ, "TMPDIR": str(tmp)})
        try:
            line = child.stdout.readline()
            assert line, child.stderr.read()
            pids = json.loads(line)
            child.kill()
            child.wait(HUNG)
            assert wait_gone(pids) == [], "the loaders, workers and zygote end with the trainer"
            assert sorted(os.listdir(tmp)) == []
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()


SMALL_SHM = """
import json, sys, numpy as np, torch
from pinring.torch import DataLoader
import pinring.torch._dataloader as dl

class Seed(torch.utils.data.Dataset):
    def __init__(self):
        self.data = [np.random.rand(512, 512).astype(np.float32) for _ in range(200)]
    def __len__(self):
        return len(self.data)
    def __getitem__(self, i):
        return self.data[i]

# A ring of 64 slots of 2 MiB (128 MiB), twice what /dev/shm holds here.
config = dl.DataLoader._config
def bigger(self, ring):
    c = config(self, ring)
    c["ring"].update(slot_bytes="2MiB", slots=64)
    return c
dl.DataLoader._config = bigger
loader = DataLoader(Seed(), batch_size=32, shuffle=True, num_workers=4, device="cpu")
it = iter(loader)
for _ in range(3):
    assert next(it).shape == (32, 512, 512)
print(json.dumps({"workers": [w.pid for w in loader._pool.workers], "zygote": loader._zygote.pid}),
      flush=True)
for batch in it:
    pass
"""


def test_the_seed_workload_runs_in_a_64_mib_dev_shm_and_leaves_nothing_when_killed():
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("SKIPPED: needs root and unshare(1) to mount a 64 MiB /dev/shm of its own")
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs -o size=1m tmpfs /dev/shm"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"SKIPPED: this machine refuses a mount namespace with a tmpfs of its own "
                    f"({probe.stderr.decode().strip()})")

    def command(path):
        # The shell stays in the mount namespace after the trainer dies and lists its /dev/shm.
        shell = (
            "mount -t tmpfs -o size=64m tmpfs /dev/shm || exit 99; "
            f"{sys.executable} {path} & pid=$!; echo trainer $pid; wait $pid; "
            "echo status $?; read go; echo shm; ls -A /dev/shm; echo end"
        )
        return ["unshare", "-m", "--propagation", "private", "sh", "-c", shell]

    with child_running(SMALL_SHM, command=command) as child:

        def fail(what):
            child.kill()
            return f"{what}; stderr: {child.communicate()[1]}"

        first = child.stdout.readline().split()
        assert first[:1] == ["trainer"], fail(first)
        trainer = int(first[1])
        line = child.stdout.readline()
        assert line.startswith("{"), fail(line)
        seen = json.loads(line)
        pids = seen["workers"] + [seen["zygote"]]
        os.kill(trainer, signal.SIGKILL)
        assert child.stdout.readline().split() == ["status", str(128 + signal.SIGKILL)]
        left = wait_gone(pids)
        assert left == [], f"still running after the trainer's SIGKILL: {left}"
        out, err = child.communicate("go\n", timeout=HUNG)
        assert out.split() == ["shm", "end"], (out, err)


def test_close_after_a_timeout_returns_at_once_and_ends_the_workers():
    """A worker hung in ``__getitem__``: the loop's Timeout, then close() within a second
    (it took 11.5 s: the workers were waited for 10 s)."""
    loader = DataLoader(ds.Hangs(16), batch_size=4, num_workers=2, device="cpu", timeout=0.5)
    it = iter(loader)
    with pytest.raises(pinring.Timeout):
        next(it)
    pids = [w.pid for w in loader._pool.workers] + [loader._zygote.pid]
    t = time.monotonic()
    loader.close()
    took = time.monotonic() - t
    # Documented: within a second (0.45-0.56 s measured under a load of 6 on 2 cores); it took
    # 2 s while the daemon's drain waited 1.5 s for the killed workers' parts.
    assert took < 1.5, f"close() took {took:.2f} s"
    assert wait_gone(pids) == []


CTRL_C = """
import signal, sys, numpy as np, torch
signal.signal(signal.SIGINT, signal.default_int_handler)
from pinring.torch import DataLoader
import loader_datasets as ds
loader = DataLoader(ds.Hangs(16, pid_dir=sys.argv[1]), batch_size=4, num_workers=2,
                    device="cpu")
try:
    next(iter(loader))
except KeyboardInterrupt:
    print("interrupted", len(loader._pool.workers) if loader._pool else 0, flush=True)
    sys.exit(0)
"""


def test_a_peer_that_closed_with_messages_unread_is_the_end_of_the_stream_not_an_error():
    """A zygote's socket after the training process closed its end with exit reports unread
    (Ctrl-C): ECONNRESET, which printed a ConnectionResetError traceback from the zygote."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    _procs._send(theirs, ("exit", 1, 0))
    ours.close()
    assert _procs._recv(theirs) == (None, [])
    theirs.close()


def parent_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def test_ctrl_c_in_the_loop_raises_keyboard_interrupt_and_stops_the_workers(tmp_path):
    with child_running(CTRL_C, str(tmp_path)) as child:
        # Both workers are inside __getitem__, and the loop waits for a batch.
        deadline = time.monotonic() + HUNG
        while len(os.listdir(tmp_path)) < 2:
            assert child.poll() is None, child.communicate()[1]
            assert time.monotonic() < deadline, "the workers never started"
            time.sleep(0.01)
        workers = [int(p) for p in os.listdir(tmp_path)]
        zygote = parent_of(workers[0])
        t = time.monotonic()
        child.send_signal(signal.SIGINT)
        out = child.stdout.readline().split()
        took = time.monotonic() - t
        assert out == ["interrupted", "0"], (out, child.stderr.read())
        # Documented: 0.1 s (0.04-0.13 s measured under a load of 6 on 2 cores); it took 2 s
        # while the workers had 0.4 s to leave and the daemon drained for 1.5 s.
        assert took < 1.0, f"{took:.2f} s"
        # The loop stopped (killed) the workers before the exception reached the script.
        assert wait_gone(workers) == []
        child.wait(HUNG)
        assert wait_gone(workers + [zygote]) == []


LEASE = """
import os, sys, time, numpy as np, torch
from pinring.torch import DataLoader

class SlowOnce(torch.utils.data.Dataset):
    # Sample 5 takes 1.5 s the first time it is loaded, longer than the lease.
    def __len__(self):
        return 16
    def __getitem__(self, i):
        if i == 5 and not os.path.exists(sys.argv[1]):
            open(sys.argv[1], "w").close()
            time.sleep(1.5)
        return np.full(2, i, dtype=np.int64)

loader = DataLoader(SlowOnce(), batch_size=4, num_workers=2, lease_ms=500, epochs=1,
                    device="cpu", timeout=60)
got = sorted(x for b in loader for x in b[:, 0].tolist())
assert got == list(range(16)), got
print("ok")
"""


def test_the_lease_warning_reaches_stderr_with_default_logging(tmp_path):
    r = run_script(LEASE, str(tmp_path / "slow"))
    assert r.returncode == 0 and r.stdout.split() == ["ok"], r.stderr
    assert "longer than the ring's lease (daemon.lease_ms = 500 ms)" in r.stderr, r.stderr


CUDA_IN_WORKER = """
import numpy as np, torch
from pinring.torch import DataLoader

class UsesCuda(torch.utils.data.Dataset):
    def __len__(self):
        return 16
    def __getitem__(self, i):
        if os.getpid() != OWNER:
            torch.zeros(1, device="cuda")  # a worker touching CUDA
        return np.full(2, i, dtype=np.int64)

import os
OWNER = os.getpid()
torch.zeros(1, device="cuda")  # the trainer has initialised CUDA, as a training script has
loader = DataLoader(UsesCuda(), batch_size=4, num_workers=2, epochs=1)
list(loader)
"""


def test_a_forked_worker_that_uses_cuda_fails_with_a_clear_message():
    """The workers are forked after the trainer initialised CUDA (as torch's are): one that
    uses CUDA gets torch's refusal, raised in the loop with pinring's note and the fix."""
    if not torch.cuda.is_available():
        pytest.skip("SKIPPED: needs a CUDA device")
    r = run_script(CUDA_IN_WORKER)
    assert r.returncode != 0
    assert "forked subprocess" in r.stderr, r.stderr
    assert 'multiprocessing_context="spawn"' in r.stderr, r.stderr
    assert "Segmentation fault" not in r.stderr and "core dumped" not in r.stderr


TWO_LOADERS = """
import functools, gc, json, operator, os, sys, numpy as np, torch
from pinring.torch import DataLoader
from pinring import _native

class Ids(torch.utils.data.Dataset):
    def __init__(self, n, scale):
        self.n, self.scale = n, scale
        # A lambda: the dataset cannot be pickled, as many a validation set's transform.
        self.transform = (lambda i: i * scale) if sys.argv[2] == "lambda" else (
            functools.partial(operator.mul, scale))
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        return np.full(2, self.transform(i), dtype=np.int64)

gc.disable()  # a loader dropped by the script must end by its reference count alone
made_before = sys.argv[1] == "before"
train = DataLoader(Ids(64, 1), batch_size=8, num_workers=2, device="cpu")
if made_before:
    val = DataLoader(Ids(24, 10), batch_size=8, num_workers=2, device="cpu")
seen = {}
for epoch in range(2):
    got = []
    for batch in train:
        got += batch[:, 0].tolist()
        if len(got) == 8:
            # The training loader's daemon runs now: no zygote can be forked from here.
            assert _native._live_rings() > 0
            if epoch == 0:
                if sys.argv[1] == "same":  # the training loader's own dataset
                    val = DataLoader(train.dataset, batch_size=8, num_workers=2, device="cpu")
                elif not made_before:
                    val = DataLoader(Ids(24, 10), batch_size=8, num_workers=2, device="cpu")
                try:
                    vgot = sorted(x for b in val for x in b[:, 0].tolist())
                    assert vgot == (list(range(64)) if sys.argv[1] == "same" else
                                    [i * 10 for i in range(24)]), vgot
                except AttributeError as e:
                    vgot = str(e)
                seen = {"train": train._zygote.pid, "val": val._zygote and val._zygote.pid,
                        "vgot": vgot}
    assert sorted(got) == list(range(64)), got
if seen["val"]:
    with open(f"/proc/{seen['val']}/stat") as f:
        seen["val_parent"] = int(f.read().rsplit(")", 1)[1].split()[1])
seen["me"] = os.getpid()
del train, val, batch
seen["live_after_del"] = _native._live_rings()
print(json.dumps(seen))
"""


def test_a_validation_loader_made_before_training_starts_inherits_its_dataset():
    """A training and a validation loader made together, the validation one iterated while the
    training one runs: the validation loader's zygote was forked from the training process
    before the training loader's daemon started, so its dataset (holding a lambda here) is
    inherited, never pickled. Both loaders end when the script drops them, with the cycle
    collector off."""
    r = run_script(TWO_LOADERS, "before", "lambda")
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout)
    assert seen["vgot"] == [i * 10 for i in range(24)], seen
    assert seen["val_parent"] == seen["me"], seen
    assert seen["live_after_del"] == 0, seen
    assert wait_gone([seen["train"], seen["val"]]) == []


def test_a_loader_made_while_another_runs_forks_from_a_clean_zygote():
    """A loader made while another loader's daemon runs cannot fork its zygote from the
    training process: the running loader's zygote forks it, and its dataset is pickled to it
    once."""
    r = run_script(TWO_LOADERS, "after", "plain")
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout)
    assert seen["vgot"] == [i * 10 for i in range(24)], seen
    assert seen["val_parent"] == seen["train"], seen
    assert seen["live_after_del"] == 0, seen
    assert wait_gone([seen["train"], seen["val"]]) == []


def test_a_loader_made_while_another_runs_cannot_take_a_dataset_that_does_not_pickle():
    """The same with a dataset holding a lambda: the pickling error, with the note that says
    why it was pickled and how to avoid it."""
    r = run_script(TWO_LOADERS, "after", "lambda")
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout)
    assert "could not pickle its dataset" in seen["vgot"], seen
    assert "Make this loader before the other's first for" in seen["vgot"], seen
    assert seen["live_after_del"] == 0, seen


def test_a_loader_made_while_another_runs_over_the_same_dataset_pickles_nothing():
    """A loader made while another runs, over the very dataset the running one's zygote holds
    (a validation pass over the training set, a loader made again each epoch): its zygote is
    forked from that zygote, with that zygote's copy of the dataset; nothing of it is pickled,
    so a dataset holding a lambda works."""
    r = run_script(TWO_LOADERS, "same", "lambda")
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout)
    assert seen["vgot"] == list(range(64)), seen
    assert seen["val_parent"] == seen["train"], seen
    assert seen["live_after_del"] == 0, seen
    assert wait_gone([seen["train"], seen["val"]]) == []


BESIDE_AN_EMBEDDED_LOADER = """
import json, os, numpy as np, torch, pinring
from pinring.torch import DataLoader

class Ids(torch.utils.data.Dataset):
    def __init__(self):
        self.transform = lambda i: i * 10  # does not pickle
    def __len__(self):
        return 24
    def __getitem__(self, i):
        return np.full(2, self.transform(i), dtype=np.int64)

val = DataLoader(Ids(), batch_size=8, num_workers=2, device="cpu")
dataset = {"kind": "synthetic", "samples": 64, "sample_shape": [16], "dtype": "f32"}
with pinring.Loader(embedded=True, loaders=1, device="cpu", batch_size=4, dataset=dataset) as l:
    next(iter(l))
    got = sorted(x for b in val for x in b[:, 0].tolist())
    with open(f"/proc/{val._zygote.pid}/stat") as f:
        parent = int(f.read().rsplit(")", 1)[1].split()[1])
print(json.dumps({"got": got, "parent": parent, "me": os.getpid()}))
"""


def test_a_dataloader_made_before_an_embedded_loader_starts_inherits_its_dataset():
    """A pinring.Loader's embedded daemon starts pinring threads in this process: the zygotes
    of the DataLoaders already made are forked first, so their datasets are inherited."""
    r = run_script(BESIDE_AN_EMBEDDED_LOADER)
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout)
    assert seen["got"] == [i * 10 for i in range(24)], seen
    assert seen["parent"] == seen["me"], seen


def test_close_with_a_batch_still_held_returns_at_once_and_the_batch_stays_valid():
    """The loop left mid-plan with the last batch's tensor still referenced: the embedded daemon
    does not wait for it (its memory is kept alive by the tensor itself), so close() takes no
    drain deadline (it took 1.6 s), and the tensor still reads right afterwards."""
    loader = DataLoader(ds.Ids(64), batch_size=8, num_workers=2, device=os.environ.get(
        "PINRING_TEST_DEVICE", "cpu"))
    for batch in loader:
        pass
    t = time.monotonic()
    loader.close()
    took = time.monotonic() - t
    assert batch.reshape(-1).tolist() == list(range(56, 64))
    # About 0.1 s (0.4 s at most for the workers); under the daemon's 1.5 s drain deadline,
    # which a wait for the held batch would run into.
    assert took < 1.4, f"close() took {took:.2f} s"


def test_a_forked_childs_copies_of_pinring_objects_are_never_torn_down_there(tmp_path):
    """A fork of a process that runs a loader (the user's own, or a library's) holds copies of
    its daemon, consumer, producer and batches. Freed there (by the child's garbage collector,
    or when the fork drops the other threads' frames), none of them may run the parent's
    teardown: join the daemon's thread (which does not exist in the child: a hang or a panic),
    leave the parent's seat in the loader table, free its buffers. The child ends cleanly and the
    parent's loader goes on."""
    import gc

    loader = DataLoader(ds.Ids(64), batch_size=8, num_workers=0, device="cpu")
    it = iter(loader)
    first = next(it)
    log = open(tmp_path / "child.log", "w")
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.dup2(log.fileno(), 2)  # what the child's teardown says (a panic) is kept
            del first
            loader._daemon = loader._consumer = None
            loader._pool.workers = []
            gc.collect()
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + HUNG
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the child hung tearing down its copies")
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(status) == 0
    log.close()
    said = (tmp_path / "child.log").read_text()
    assert "panicked" not in said and "Exception ignored" not in said, said
    assert [b.reshape(-1).tolist() for b in it] == [list(range(i, i + 8)) for i in range(8, 64, 8)]
    loader.close()
