"""``pinring.Loader(loaders=N)``: an embedded daemon and N ``pinring-loader`` processes started
and supervised from Python, on the host backend. Every byte of every batch is the generator's,
once and in order; a loader SIGKILLed mid-epoch is started again and nothing is lost; a loader
that fails raises in the loop with its message; a trainer SIGKILLed leaves no loader behind."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import pinring
from test_consumer import CONFIG, check

np = pytest.importorskip("numpy")


def config(tmp_path, text=CONFIG, epochs=2):
    path = tmp_path / "pinring.toml"
    path.write_text(text.replace("epochs = 2", f"epochs = {epochs}"))
    return str(path)


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (not yet reaped by its parent) is gone as far as work goes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_loaders_started_from_python_deliver_every_batch_once_in_order(tmp_path):
    with pinring.Loader(config=config(tmp_path), loaders=3, backend="host", as_numpy=True,
                        timeout=60) as loader:
        pids = loader.loader_pids
        assert len(pids) == 3
        c = loader._attach()
        assert len(loader) == 64
        seqs = []
        for b in loader.batches():
            check(c, b)
            seqs.append(b.batch)
        assert seqs == list(range(128)), "two epochs, every batch once, in order"
        # The plan is done; the loaders stop with the loader.
        t = time.monotonic()
        summary = loader.close()
        assert time.monotonic() - t < 2.0, "close() stops the loaders within a second or so"
    assert summary["batches_delivered"] == 128 and summary["missing"] == 0
    assert not any(alive(p) for p in pids)
    assert not [f for f in os.listdir("/dev/shm") if loader.ring in f], "anonymous: no name"


def test_a_loader_killed_mid_epoch_is_restarted_and_nothing_is_lost(tmp_path):
    with pinring.Loader(config=config(tmp_path, epochs=4), loaders=2, backend="host",
                        as_numpy=True, timeout=60) as loader:
        c = loader._attach()
        seqs = []
        killed = None
        for b in loader.batches():
            check(c, b)
            seqs.append(b.batch)
            if len(seqs) == 40:
                killed = loader.loader_pids[0]
                os.kill(killed, signal.SIGKILL)
        assert killed is not None
        assert seqs == list(range(256)), "every batch once, in order, across the kill"
        assert killed not in loader.loader_pids


def test_a_loader_failing_on_bad_data_raises_its_message_in_the_loop(tmp_path):
    # A directory of per-sample .npy files, one of which is not a .npy file: the loader that
    # reads it fails (on_bad_sample = "fail", exit 3) naming the file, and the loop raises that.
    data = tmp_path / "samples"
    data.mkdir()
    for i in range(64):
        np.save(data / f"{i:03d}.npy", np.full((4, 4), i, dtype=np.float32))
    (data / "037.npy").write_bytes(b"not a numpy file at all" * 4)
    text = (
        f'[ring]\nslots = 8\n[dataset]\nkind = "npy"\non_bad_sample = "fail"\n'
        f'[dataset.npy]\npath = "{data}"\ndtype = "f32"\nshape = [4, 4]\n'
        "[plan]\nbatch_size = 8\nepochs = 1\n"
    )
    # Two loaders: the one that read the bad file is raised, not the other, which only saw
    # its daemon stop the run (exit 5).
    loader = pinring.Loader(config=config(tmp_path, text), loaders=2, backend="host",
                            as_numpy=True, timeout=30)
    try:
        with pytest.raises(pinring.ConfigError, match="loader . .*failed with exit code 3") as e:
            for _ in loader:
                pass
        assert "037.npy" in str(e.value), str(e.value)
    finally:
        loader.close()


TRAINER = textwrap.dedent(
    """
    import sys, time
    import pinring
    loader = pinring.Loader(config=sys.argv[1], loaders=2, backend="host", as_numpy=True)
    it = loader.batches()
    next(it)
    print(" ".join(map(str, loader.loader_pids)), flush=True)
    time.sleep(600)  # killed here, with its loaders busy filling the ring
    """
)


def test_a_trainer_killed_leaves_no_loader_within_a_second(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", TRAINER, config(tmp_path, epochs=100)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pids = [int(x) for x in p.stdout.readline().split()]
        assert len(pids) == 2, p.stderr.read()
        p.kill()
        p.wait()
        deadline = time.monotonic() + 1.0
        while any(alive(q) for q in pids) and time.monotonic() < deadline:
            time.sleep(0.02)
        left = [q for q in pids if alive(q)]
        assert not left, f"loaders {left} outlived the trainer by a second"
    finally:
        if p.poll() is None:
            p.kill()


def test_bad_arguments_are_refused_with_the_fix(tmp_path):
    with pytest.raises(pinring.UsageError, match="loaders=N"):
        pinring.Loader(config=config(tmp_path), loaders_cpus=[0])
    with pytest.raises(pinring.UsageError, match="loaders=-1"):
        pinring.Loader(config=config(tmp_path), loaders=-1)
    with pytest.raises(pinring.UsageError, match="loaders_cpus"):
        pinring.Loader(config=config(tmp_path), loaders=1, backend="host", loaders_cpus=[10**6])


def test_the_config_as_data_and_keywords_no_file(tmp_path):
    # The same settings as CONFIG, given as data: sections in config=, the dataset table and
    # the plan as keywords; checked by pinring's parser and fed by loaders started here.
    with pinring.Loader(config={"ring": {"slots": 8}, "daemon": {"prefetch": 3}},
                        dataset={"samples": 512, "sample_shape": [16, 32], "dtype": "f32",
                                 "seed": 7},
                        batch_size=8, epochs=1, loaders=2, backend="host", as_numpy=True,
                        timeout=60) as loader:
        c = loader._attach()
        got = 0
        for b in loader.batches():
            check(c, b)
            got += 1
        assert got == 64 == len(loader)
    # Bad settings get pinring's own message, naming the key and what is allowed.
    with pytest.raises(pinring.ConfigError, match="batch_size"):
        pinring.Loader(dataset={"samples": 64}, batch_size=0, backend="host")
    with pytest.raises(pinring.ConfigError, match="colour"):
        pinring.Loader(dataset={"samples": 64, "colour": "red"}, backend="host")
    with pytest.raises(pinring.UsageError, match="both in config= and as an argument"):
        pinring.Loader(config={"plan": {"batch_size": 4}}, batch_size=8, backend="host")
    with pytest.raises(pinring.UsageError, match="names a file"):
        pinring.Loader(config=config(tmp_path), batch_size=8, backend="host")
