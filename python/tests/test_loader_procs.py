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
    with pinring.Loader(config=config(tmp_path, epochs=4), loaders=4, backend="host",
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
        # The other loaders may have made the rest of the plan before the kernel finished the
        # killed one (a loaded machine schedules it late): wait for its death, bounded.
        deadline = time.monotonic() + 10
        while killed in loader.loader_pids:
            assert time.monotonic() < deadline, f"loader {killed} still listed 10 s after SIGKILL"
            time.sleep(0.01)


def bad_npy_config(tmp_path):
    """A directory of per-sample .npy files, one of which (037.npy) is not a .npy file; a
    loader that reads it fails (on_bad_sample = "fail", exit 3) naming the file."""
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
    return config(tmp_path, text)


def test_a_loader_failing_on_bad_data_raises_its_message_in_the_loop(tmp_path):
    # Two loaders: the one that read the bad file is raised, not the other, which only saw
    # its daemon stop the run (exit 5). The error the loop raised is the one a with block
    # lets out (its close() does not raise again), and a later close() is quiet too.
    with pytest.raises(pinring.ConfigError, match="loader . .*exited with code 3") as e:
        with pinring.Loader(config=bad_npy_config(tmp_path), loaders=2, backend="host",
                            as_numpy=True, timeout=30) as loader:
            for _ in loader:
                pass
    assert "037.npy" in str(e.value), str(e.value)
    assert loader.close() is None


def test_an_embedded_daemon_stopped_by_a_failed_part_raises_config_error(tmp_path):
    # The daemon stops the run at a part that failed on the data (pinring-daemon exits 3), and
    # its stop() raises that error as its class, ConfigError, with the loader's message.
    path = bad_npy_config(tmp_path)
    daemon = pinring.EmbeddedDaemon(config=path, backend="host", anonymous=True)
    try:
        loader = subprocess.run(
            pinring.program("pinring-loader") + ["--ring", daemon.ring, "--ring-path",
                                                 daemon.path, "--config", path],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        assert loader.returncode == 3, loader.stderr
        deadline = time.monotonic() + 30
        while daemon.running and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not daemon.running, "the daemon did not stop at the failed part"
    finally:
        with pytest.raises(pinring.ConfigError, match="037.npy") as e:
            daemon.stop()


def test_an_embedded_daemon_with_loaders_started_by_hand_raises_its_own_failure(tmp_path):
    # embedded=True, the loader started by hand: the daemon stops at the part that failed, and
    # the loop raises its error (the loader's message), not the consumer's "its daemon stopped;
    # restart it with --start-seq", a flag this training process never had.
    path = bad_npy_config(tmp_path)
    name = f"py-hand-{os.getpid()}"
    with pinring.Loader(config=path, embedded=True, ring=name, backend="host", as_numpy=True,
                        timeout=60) as loader:
        hand = subprocess.Popen(pinring.program("pinring-loader") + ["--ring", name, "--config",
                                                                     path],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            with pytest.raises(pinring.ConfigError, match="037.npy") as e:
                for _ in loader:
                    pass
        finally:
            hand.wait(60)
    assert "--" not in str(e.value), str(e.value)


def test_an_embedded_daemon_with_loaders_started_by_hand_goes_only_forward_saying_so(tmp_path):
    path = config(tmp_path, epochs=3)
    name = f"py-fwd-{os.getpid()}"
    with pinring.Loader(config=path, embedded=True, ring=name, backend="host", as_numpy=True,
                        timeout=60) as loader:
        hand = subprocess.Popen(pinring.program("pinring-loader") + ["--ring", name, "--config",
                                                                     path],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            start = loader.state_dict()
            assert sum(1 for _ in loader) == 64
            loader.set_epoch(0)
            with pytest.raises(pinring.UsageError, match="cannot go back") as e:
                next(iter(loader))
            assert "--" not in str(e.value) and "loaders=N" in str(e.value), str(e.value)
            with pytest.raises(pinring.UsageError, match="cannot go back") as e:
                loader.load_state_dict(start)
            assert "--" not in str(e.value) and "loaders=N" in str(e.value), str(e.value)
        finally:
            loader.close()
            hand.wait(60)


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



def epoch_batches(loader):
    """One ``for`` over ``loader``: the number of each batch it yielded, found by matching its
    every byte against the generator's batches (``Consumer.expected``)."""
    per_epoch = len(loader)
    out = []
    for fields in loader:
        c = loader._consumer  # the loop's own: a jump starts a new one
        got = {name: a.tobytes() for name, a in fields.items()}
        # A batch of epoch e at index i is batch e * per_epoch + i: look in each epoch at the
        # index this one has.
        i = len(out)
        match = [e * per_epoch + i for e in range(4) if c.expected(e * per_epoch + i) == got]
        assert len(match) == 1, f"batch {i} of the for matches {match}"
        out.append(match[0])
    return out


def test_set_epoch_starts_the_daemon_and_loaders_again_at_that_epoch(tmp_path):
    # 64 batches per epoch, 4 epochs (shuffled: each epoch's batches differ). Each for is one
    # epoch; set_epoch jumps back and forth, and each jump yields that epoch's batches.
    text = CONFIG.replace("[plan]", "[plan]\nshuffle = true")
    with pinring.Loader(config=config(tmp_path, text, epochs=4), loaders=2, backend="host",
                        as_numpy=True, timeout=60) as loader:
        n = len(loader)
        assert epoch_batches(loader) == list(range(n))
        loader.set_epoch(2)
        pids = loader.loader_pids
        assert epoch_batches(loader) == list(range(2 * n, 3 * n))
        assert loader.loader_pids and not set(loader.loader_pids) & set(pids), \
            "the jump started new loaders"
        loader.set_epoch(1)  # back: the daemon starts again there
        assert epoch_batches(loader) == list(range(n, 2 * n))
        loader.set_epoch(2)  # the next epoch anyway: no restart
        pids = loader.loader_pids
        assert epoch_batches(loader) == list(range(2 * n, 3 * n))
        assert loader.loader_pids == pids
        loader.set_epoch(4)
        with pytest.raises(pinring.UsageError, match="runs 4 epochs"):
            next(iter(loader))
        with pytest.raises(pinring.UsageError, match="epochs count from 0"):
            loader.set_epoch(-1)


class Terminal:
    """A stderr that says it is a terminal, keeping what is written."""

    def __init__(self):
        self.text = ""

    def isatty(self):
        return True

    def write(self, s):
        self.text += s

    def flush(self):
        pass


def test_the_progress_line(tmp_path, capsys):
    from pinring._progress import Progress

    # Not a terminal and not asked for: nothing on stderr.
    with pinring.Loader(config=config(tmp_path, epochs=1), loaders=1, backend="host",
                        as_numpy=True, timeout=60) as loader:
        assert sum(1 for _ in loader) == 64
    assert "pinring epoch" not in capsys.readouterr().err
    # Asked for, stderr a pipe: a line now and then, and one at each epoch's end.
    with pinring.Loader(config=config(tmp_path, epochs=2), loaders=1, backend="host",
                        as_numpy=True, timeout=60, progress=True) as loader:
        for _ in range(2):
            assert sum(1 for _ in loader) == 64
    lines = capsys.readouterr().err.splitlines()
    ends = [line for line in lines if " 64/64 100% " in line]
    assert [line.split()[2] for line in ends] == ["0", "1"], lines
    assert all("batch/s" in line and "B/s " in line and "bound: " in line for line in ends)
    # On a terminal: redrawn in place, one finished line per epoch, the verdict one of
    # pinring status's.
    term = Terminal()
    with pinring.Loader(config=config(tmp_path, epochs=1), loaders=2, backend="host",
                        as_numpy=True, timeout=60) as loader:
        loader._progress = Progress(stream=term, interval=0.0)
        assert sum(1 for _ in loader) == 64
    assert term.text.endswith("\n") and term.text.count("\n") == 1, repr(term.text[-200:])
    draws = term.text.rstrip("\n").split("\r")[1:]
    assert len(draws) == 64, "every batch redraws with interval 0"
    assert draws[-1].startswith("pinring epoch 0  64/64 100% ")
    verdicts = {d.split("bound: ")[1].removesuffix("\x1b[K") for d in draws}
    assert verdicts <= {"loaders", "upload", "consumer", "balanced", "idle"}, verdicts


def test_a_file_kinds_keys_may_be_given_flat(tmp_path):
    tokens = tmp_path / "train.bin"
    np.arange(4097, dtype=np.uint16).tofile(tokens)
    flat = {"kind": "tokens", "files": [str(tokens)], "seq_len": 64}
    with pinring.Loader(dataset=flat, batch_size=8, epochs=1, loaders=1, backend="host",
                        as_numpy=True, timeout=60) as loader:
        batches = list(loader)
    assert len(batches) == 8  # 64 windows of 64 tokens, 8 a batch
    starts = sorted(int(b["input_ids"][i, 0]) for b in batches for i in range(8))
    assert starts == list(range(0, 4096, 64)), "every window once"
    assert all((b["targets"][:, :-1] == b["input_ids"][:, 1:]).all() for b in batches)
    nested = {"kind": "tokens", "tokens": {"files": [str(tokens)]}, "seq_len": 64}
    with pytest.raises(pinring.UsageError, match=r"beside its 'tokens' table"):
        pinring.Loader(dataset=nested, backend="host")


def test_relative_paths_reach_loaders_started_from_python(tmp_path, monkeypatch):
    # The loaders read the ring's config from a directory of their own: a relative path is
    # resolved where the user meant it (the file's directory, or the working directory for
    # settings given as data) and stored absolute.
    data = tmp_path / "data"
    data.mkdir()
    np.arange(4097, dtype=np.uint16).tofile(data / "train.bin")
    (data / "train.toml").write_text(
        '[dataset]\nkind = "tokens"\n[dataset.tokens]\nfiles = ["train.bin"]\nseq_len = 64\n'
        "[plan]\nbatch_size = 8\nepochs = 1\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    with pinring.Loader(config="../data/train.toml", loaders=2, backend="host", as_numpy=True,
                        timeout=60) as loader:
        assert sum(1 for _ in loader) == 8
    monkeypatch.chdir(data)
    with pinring.Loader(dataset={"kind": "tokens", "files": ["train.bin"], "seq_len": 64},
                        batch_size=8, epochs=1, loaders=2, backend="host", as_numpy=True,
                        timeout=60) as loader:
        assert sum(1 for _ in loader) == 8


def test_a_saved_state_resumes_with_nothing_made_again(tmp_path):
    path = config(tmp_path, epochs=2)
    with pinring.Loader(config=path, loaders=2, backend="host", as_numpy=True,
                        timeout=60) as loader:
        it = loader.batches()
        taken = [next(it).batch for _ in range(70)]
        state = loader.state_dict()
        del it
    assert taken == list(range(70))
    # A new training process: the daemon and loaders start at the saved batch, so the run
    # makes only what is left, each batch once and in order, every byte the generator's.
    with pinring.Loader(config=path, loaders=2, backend="host", as_numpy=True,
                        timeout=60) as loader:
        loader.load_state_dict(state)
        c = loader._attach()
        rest = []
        for b in loader.batches():
            check(c, b)
            rest.append(b.batch)
        summary = loader.close()
    assert rest == list(range(70, 128))
    assert summary["batches_delivered"] == 128 - 70, summary
    # A state of another plan is refused, naming the fingerprints.
    other = config(tmp_path, CONFIG.replace("seed = 7", "seed = 8"))
    with pinring.Loader(config=other, loaders=1, backend="host", as_numpy=True) as loader:
        with pytest.raises(pinring.RefusedError, match="fingerprint"):
            loader.load_state_dict(state)


def test_a_state_saved_after_the_last_batch_resumes_to_nothing(tmp_path):
    # A job killed after its last batch (waiting at a barrier, say) and started again: the
    # loader has nothing left to make, and says so by ending, not by failing.
    path = config(tmp_path, epochs=1)
    with pinring.Loader(config=path, loaders=1, backend="host", as_numpy=True,
                        timeout=60) as loader:
        assert sum(1 for _ in loader.batches()) == 64
        state = loader.state_dict()
    with pinring.Loader(config=path, loaders=1, backend="host", as_numpy=True,
                        timeout=60) as loader:
        loader.load_state_dict(state)
        assert loader.loader_pids == [], "nothing left to make: no loader runs"
        assert list(loader) == [] and list(loader.batches()) == []
        assert len(loader) == 64 and loader.state_dict() == state
        with pytest.raises(pinring.UsageError, match=r"plan.epochs = 1"):
            list(loader)  # past the plan: the rest of the saved epoch was the for before
        assert loader.device == "cpu", "where its batches were, though its ring has gone"
        loader.set_epoch(0)  # and it can still go back
        assert sum(1 for _ in loader) == 64


def supervisor(n, now):
    """A ``_Loaders`` of ``n`` loaders that starts nothing (each start only counts), on the
    clock ``now[0]``."""
    from pinring import _loaders, _memfd

    s = object.__new__(_loaders._Loaders)
    s.procs = [None] * n
    s.finished = [False] * n
    s._logs = [_memfd.holding(f"test-log-{i}") for i in range(n)]
    s._books = pinring._native.Supervisor(n, now[0])
    s.started = []

    def start(i):
        s.started.append(i)
        s.procs[i] = Ended(None)  # running

    s._start = start
    return s


class Ended:
    """A loader process that has ended with ``code`` (``Popen.returncode``; None: running)."""

    def __init__(self, code, pid=4242):
        self.code, self.pid = code, pid

    def poll(self):
        return self.code


def test_the_books_policies_restart_workers_until_their_total_and_streams_never():
    """One set of books, three policies: a DataLoader's workers restart on any ending booked,
    max_restarts in all whatever the clock, and keep their count across runs; an iterable
    dataset's never restart; a loader program's restart on a signal only."""
    S = pinring._native.Supervisor
    w = S(2, 0.0, policy="workers", max_restarts=2)
    assert (w.policy, w.max_restarts, w.restarts) == ("workers", 2, 0)
    assert w.ended(0, 10, 0, 0.0) == "restart"
    assert w.ended(1, 11, 3, 1000.0) == "restart"
    assert w.ended(0, 12, -9, 5000.0) == "stop" and w.restarts == 2
    code, sentence = w.failure()
    assert code == pinring.PeerDied.exit_code and "after 2 restarts" in sentence, sentence
    assert w.ended(1, 13, -9, 5000.0) == "leave", "the run is stopping"
    w.next_run()
    assert w.failure() is None and w.restarts == 2
    assert w.ended(1, 14, -9, 5000.0) == "stop", "the count outlives the run"
    s = S(1, 0.0, policy="stream")
    assert (s.policy, s.max_restarts) == ("stream", 0)
    assert s.ended(0, 20, -9, 0.0) == "stop" and s.restarts == 0
    loaders = S(1, 0.0)
    assert (loaders.policy, loaders.max_restarts) == ("loaders", None)
    assert loaders.ended(0, 30, 3, 0.0) == "stop", "a loader program's bad data stops"


def test_the_books_refuse_a_policy_they_do_not_know_or_a_budget_it_does_not_take():
    S = pinring._native.Supervisor
    with pytest.raises(pinring.UsageError, match=r'policy="worker".*no such policy.*"workers"'):
        S(1, 0.0, policy="worker")
    with pytest.raises(pinring.UsageError, match=r'policy="workers".*pass max_restarts='):
        S(1, 0.0, policy="workers")
    with pytest.raises(pinring.UsageError, match=r'policy="loaders", max_restarts=3.*own budget'):
        S(1, 0.0, max_restarts=3)


def test_each_loader_may_be_restarted_5_times_in_any_minute(monkeypatch):
    # As pinring run (the same books): the budget is each loader's own, in any 60 s window.
    from pinring import _loaders

    now = [1000.0]
    monkeypatch.setattr(_loaders.time, "monotonic", lambda: now[0])
    s = supervisor(2, now)
    killed = Ended(-signal.SIGKILL)

    def dies(i):
        s.procs[i] = killed
        s.check()

    for _ in range(5):
        dies(0)
        now[0] += 1.0
    # Loader 1 has its own budget, untouched by loader 0's restarts.
    dies(1)
    with pytest.raises(pinring.PeerDied, match="loader 0 .*SIGKILL.*after 5 restarts") as e:
        dies(0)
    assert str(e.value).endswith("(it printed nothing)"), str(e.value)
    assert s.started == [0] * 5 + [1]
    # Anew: 60 s after its first restart, loader 0 may be restarted once more.
    now[0] = 1000.0
    s = supervisor(1, now)
    for _ in range(5):
        dies(0)
        now[0] += 1.0
    now[0] = 1000.0 + 60.5
    dies(0)
    assert s.started[-1] == 0 and len(s.started) == 6
    os.write(s._logs[0], b"line one\nthe last line\n")
    now[0] += 0.1
    with pytest.raises(pinring.PeerDied) as e:
        for _ in range(5):
            dies(0)
    assert str(e.value).endswith("its last lines:\nline one\nthe last line"), str(e.value)


def test_a_loader_that_exits_0_or_5_is_left_and_one_with_bad_data_is_raised_first(monkeypatch):
    from pinring import _loaders

    now = [5.0]
    monkeypatch.setattr(_loaders.time, "monotonic", lambda: now[0])
    s = supervisor(4, now)
    s.procs = [Ended(0, 10), Ended(5, 11), Ended(4, 12), Ended(3, 13)]
    with pytest.raises(pinring.ConfigError, match=r"^loader 3 \(pid 13\) exited with code 3"):
        s.check()
    assert s.finished == [True, True, False, True] and s.started == []


# -- epochs -----------------------------------------------------------------------------------

# 32 synthetic samples in batches of 8: 4 batches an epoch.
SMALL = {"samples": 32, "sample_shape": [4], "dtype": "f32"}


def small_file(tmp_path, epochs=None):
    """SMALL as a config file, with plan.epochs only where ``epochs`` is given."""
    path = tmp_path / f"small-{epochs}.toml"
    path.write_text(
        '[dataset]\nsamples = 32\nsample_shape = [4]\ndtype = "f32"\n[plan]\nbatch_size = 8\n'
        + ("" if epochs is None else f"epochs = {epochs}\n")
    )
    return str(path)


def test_a_plan_whose_epochs_are_not_set_has_no_end(tmp_path):
    # As torch's DataLoader and pinring.torch.DataLoader: a training loop of any number of
    # epochs gets every one of them whole (pinring's config default, 2, gave 4, 4, 0, 0, 0).
    for given in (dict(dataset=SMALL, batch_size=8), dict(config=small_file(tmp_path))):
        with pinring.Loader(**given, loaders=1, backend="host", as_numpy=True,
                            timeout=60) as loader:
            assert [sum(1 for _ in loader) for epoch in range(5)] == [4] * 5, given
            loader.set_epoch(9)  # past the 2 of the default: a jump like any other
            assert sum(1 for _ in loader) == 4
            assert loader._attach().end_seq == pinring.loader.DEFAULT_EPOCHS * 4


def test_a_for_past_the_epochs_that_were_set_names_plan_epochs(tmp_path):
    for given in (dict(dataset=SMALL, batch_size=8, epochs=2),
                  dict(config=small_file(tmp_path, epochs=2))):
        with pinring.Loader(**given, loaders=1, backend="host", as_numpy=True,
                            timeout=60) as loader:
            assert [sum(1 for _ in loader) for epoch in range(2)] == [4, 4]
            with pytest.raises(pinring.UsageError) as e:
                for _ in loader:
                    pass
            text = str(e.value)
            assert "runs 2 epochs (plan.epochs = 2)" in text and "epoch 2" in text, text
            assert "or leave it unset" in text, text
            # The raw batches run to the plan's end, and end there.
            assert list(loader.batches()) == []
