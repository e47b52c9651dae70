"""The trainer's end on the host backend: a real pinring-daemon with ``--sink consumer``, real
pinring-loader processes, and ``pinring.Loader`` / ``pinring.Consumer`` in this process (or in a
child that gets killed). Every byte of every batch is checked against the generator."""

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

import pinring
from pinring import _native

np = pytest.importorskip("numpy")

ROOT = Path(__file__).resolve().parents[2]

CONFIG = """
[ring]
slots = 8
[dataset]
samples = 512
sample_shape = [16, 32]
dtype = "f32"
seed = 7
[plan]
batch_size = 8
epochs = 2
[daemon]
prefetch = 3
"""
BATCHES = 128


def binary(name):
    """A pinring program's command line (a list; its arguments follow): the native binary in
    $PINRING_BIN_DIR, else the workspace's build (scripts/test builds it before the Python
    tests), else the installed package's (``pinring.program``: the same program run by the
    extension, as a pip install gives it, on a host with no Rust build)."""
    d = os.environ.get("PINRING_BIN_DIR")
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    for path in ([Path(d) / name] if d else []) + [target / "debug" / name, target / "release" / name]:
        if path.exists():
            return [str(path)]
    return pinring.program(name)


class Ring:
    """A private ring: its config, its daemon (unless embedded), its loaders; all stopped at the
    end."""

    def __init__(self, tmp_path, loaders=3, daemon=True, config=CONFIG):
        self.name = f"py-{uuid.uuid4().hex[:10]}"
        self.config = tmp_path / "pinring.toml"
        self.config.write_text(config)
        self.summary = tmp_path / "summary.json"
        self.procs = []
        if daemon:
            self.daemon = self.spawn(
                *binary("pinring-daemon"), "--ring", self.name, "--backend", "host", "--sink", "consumer",
                "--config", str(self.config), "--summary", str(self.summary),
            )
        for _ in range(loaders):
            self.loader()

    def spawn(self, *args):
        p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.procs.append(p)
        return p

    def loader(self):
        return self.spawn(*binary("pinring-loader"), "--ring", self.name, "--wait-secs", "30", "--config", str(self.config))

    def wait_attached(self, n):
        """Waits until `n` loaders are in the ring's loader table, so none of them can start
        after the plan is done (a loader that finds no ring waits for one, then fails)."""
        import json

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            out = subprocess.run(
                [*binary("pinring"), "status", self.name, "--json", "--interval", "0.1"],
                capture_output=True,
                text=True,
            )
            if out.returncode == 0:
                rings = json.loads(out.stdout)
                if rings and len(rings[0]["snapshot"]["loaders"]) >= n:
                    return
            time.sleep(0.05)
        pytest.fail(f"{n} loaders never attached to ring {self.name}")

    def wait_all(self):
        for p in self.procs:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, f"{p.args[0]} exited {p.returncode}: {err.decode()}"

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        Path(f"/dev/shm/pinring.{self.name}").unlink(missing_ok=True)


@pytest.fixture
def ring(tmp_path):
    r = Ring(tmp_path)
    r.wait_attached(3)
    yield r
    r.close()


def check(consumer, batch):
    """Every byte of every field of a raw batch is the generator's."""
    want = consumer.expected(batch.batch)
    assert set(batch.fields) == {"images", "labels"}
    for name, field in batch.fields.items():
        assert np.from_dlpack(field).tobytes() == want[name], f"batch {batch.seq}, field {name}"


def test_every_batch_arrives_once_in_order_byte_for_byte(ring):
    loader = pinring.Loader(ring=ring.name, as_numpy=True)
    c = loader._attach()
    seqs = []
    for b in loader.batches():
        check(c, b)
        assert b.fields["images"].shape == (8, 16, 32)
        assert b.fields["images"].dtype == "f32"
        assert b.fields["labels"].dtype == "i64"
        seqs.append(b.seq)
    del b  # the daemon ends once every buffer is back
    assert seqs == list(range(BATCHES))
    loader.close()
    ring.wait_all()


def test_loader_yields_torch_tensors_one_epoch_per_loop(ring):
    torch = pytest.importorskip("torch")
    loader = pinring.Loader(ring=ring.name)
    assert len(loader) == 64
    assert loader.device == "cpu"
    c = loader._attach()
    n = 0
    for epoch in range(2):
        got = 0
        for batch in loader:
            x, y = batch["images"], batch["labels"]
            assert isinstance(x, torch.Tensor) and x.dtype == torch.float32 and x.shape == (8, 16, 32)
            assert y.dtype == torch.int64 and y.shape == (8,)
            want = c.expected(n)
            assert x.numpy().tobytes() == want["images"]
            assert y.numpy().tobytes() == want["labels"]
            n += 1
            got += 1
        del batch, x, y
        assert got == 64, f"epoch {epoch}"
    # The plan is over: a third for is said to be past it, naming the ring's plan.epochs.
    with pytest.raises(pinring.UsageError, match=r"runs 2 epochs \(plan.epochs = 2\).*more epochs"):
        list(loader)
    loader.close()
    ring.wait_all()


def test_kept_tensors_are_never_overwritten(ring):
    torch = pytest.importorskip("torch")
    loader = pinring.Loader(ring=ring.name)
    c = loader._attach()
    it = iter(loader)
    kept = next(it)  # batch 0, kept past many later batches (2 of the 3 buffers cycle)
    for _ in range(30):
        next(it)
    want = c.expected(0)
    assert kept["images"].numpy().tobytes() == want["images"]
    assert kept["labels"].numpy().tobytes() == want["labels"]
    del kept
    rest = sum(1 for _ in loader.batches())
    assert rest == BATCHES - 31
    loader.close()
    ring.wait_all()


def test_state_dict_resumes_exactly_and_refuses_another_plan(ring):
    a = pinring.Loader(ring=ring.name, as_numpy=True)
    it = iter(a)
    for _ in range(10):
        next(it)
    state = a.state_dict()
    assert state["seq"] == 10
    a.close()

    wrong = pinring.Loader(ring=ring.name)
    with pytest.raises(pinring.RefusedError, match="fingerprint"):
        wrong.load_state_dict({"seq": 10, "fingerprint": state["fingerprint"] ^ 1})
    with pytest.raises(pinring.UsageError, match="--start-seq 4"):
        wrong.load_state_dict({"seq": 4, "fingerprint": state["fingerprint"]})

    b = pinring.Loader(ring=ring.name, as_numpy=True)
    b.load_state_dict(state)
    c = b._attach()
    first = next(iter(b.batches()))
    assert first.seq == 10
    check(c, first)
    del first
    assert sum(1 for _ in b.batches()) == BATCHES - 11
    b.close()
    ring.wait_all()


def test_holding_every_buffer_is_an_error_not_a_hang(ring):
    c = pinring.Consumer(ring.name)
    held = [c.next_batch(30) for _ in range(3)]  # prefetch = 3
    with pytest.raises(pinring.UsageError, match="holds all 3 batch buffers"):
        c.next_batch(30)
    del held[0]
    assert c.next_batch(30).seq == 3
    c.close()


def test_a_second_consumer_is_refused(ring):
    a = pinring.Consumer(ring.name)
    with pytest.raises(pinring.RefusedError, match="already has a consumer"):
        pinring.Consumer(ring.name)
    a.close()
    b = pinring.Consumer(ring.name)  # the first one's lock went with close()
    b.close()


CHILD = textwrap.dedent(
    """
    import sys, pinring
    c = pinring.Consumer(sys.argv[1])
    held = []
    while True:
        b = c.next_batch(30)
        held.append(b)          # hold every batch: the process dies holding buffers
        print(b.seq, flush=True)
    """
)


def test_a_killed_consumer_is_replaced_and_nothing_is_lost(ring):
    child = subprocess.Popen([sys.executable, "-c", CHILD, ring.name], stdout=subprocess.PIPE, text=True)
    # It takes batches until the three buffers are all held (it never releases): then kill it.
    taken = [int(child.stdout.readline()) for _ in range(3)]
    assert taken == [0, 1, 2]
    child.send_signal(signal.SIGKILL)
    child.wait()
    c = pinring.Consumer(ring.name)
    seqs = []
    while (b := c.next_batch(60)) is not None:
        check(c, b)
        seqs.append(b.seq)
        del b
    assert seqs == list(range(3, BATCHES)), "resumed right after what the dead consumer took"
    c.close()
    ring.wait_all()


def test_errors_carry_pinrings_messages(tmp_path):
    with pytest.raises(pinring.RingError, match="does not exist"):
        pinring.Consumer(f"py-missing-{uuid.uuid4().hex[:8]}", wait_for_ring=0.2)


def test_a_missing_ring_is_said_at_once_and_named_in_the_error(caplog):
    name = f"py-waitsay-{uuid.uuid4().hex[:8]}"
    with caplog.at_level(logging.WARNING, logger="pinring"):
        with pytest.raises(pinring.RingError, match=r"waited 0\.3 s for it to appear") as e:
            pinring.Consumer(name, wait_for_ring=0.3)
    said = [r.getMessage() for r in caplog.records if r.name == "pinring"]
    assert len(said) == 1, said
    assert said[0].startswith(f'waiting for ring "{name}" (/dev/shm/pinring.{name}) to appear')
    assert f"pinring-daemon --ring {name}" in said[0] and said[0].endswith("giving up in 0.3 s")
    assert f'ring "{name}" does not exist' in str(e.value)


def test_embedded_daemon_feeds_this_process(tmp_path):
    r = Ring(tmp_path, loaders=0, daemon=False)
    try:
        loader = pinring.Loader(ring=r.name, embedded=True, config=str(r.config), backend="host", as_numpy=True)
        for _ in range(3):
            r.loader()
        r.wait_attached(3)
        c = loader._attach()
        seqs = []
        for b in loader.batches():
            check(c, b)
            seqs.append(b.seq)
        del b
        assert seqs == list(range(BATCHES))
        summary = loader.close()
        assert summary["batches_delivered"] == BATCHES
        assert summary["duplicates"] == 0 and summary["missing"] == 0
        r.wait_all()
    finally:
        r.close()


def test_a_spec_resolves_once_and_starts_an_embedded_daemon_without_a_file(tmp_path):
    settings = {
        "dataset": {"samples": 64, "sample_shape": [16], "dtype": "u8"},
        "plan": {"batch_size": 8, "shuffle": False},
    }
    spec = pinring.Spec(settings, ring="spec-test", default_epochs=2, source="test settings")
    assert (spec.ring, spec.batches_per_epoch, spec.parts_per_batch) == ("spec-test", 8, 1)
    assert spec.slots >= 2 and spec.slot_bytes > 0, "auto sized here, once"
    info = spec.info()
    assert info["batches_per_epoch"] == 8, info
    assert [name for name, _, _ in info["fields"]] == ["images", "labels"], info
    assert spec.settings()[("plan", "epochs")] == 2, "default_epochs where the settings say none"
    assert "[ring]" in spec.toml and 'name = "spec-test"' in spec.toml, spec.toml
    # A spec and the config's own keywords are one or the other.
    for bad in ({"config": "x.toml"}, {"ring": "other"}, {"epochs": 1}, {"rank": 0, "world_size": 1}):
        with pytest.raises(pinring.UsageError, match="spec"):
            pinring.EmbeddedDaemon(spec=spec, backend="host", anonymous=True, **bad)
    # Bad settings are pinring's ConfigError, naming where they came from.
    with pytest.raises(pinring.ConfigError, match="test settings"):
        pinring.Spec({"plan": {"batch_size": 0}}, source="test settings")
    daemon = pinring.EmbeddedDaemon(spec=spec, backend="host", anonymous=True)
    try:
        assert daemon.ring == "spec-test"
        p = pinring.Producer(daemon.ring, path=daemon.path)  # adopts: no config anywhere
        made = []

        def fill():
            while (part := p.claim(timeout=60)) is not None:
                for name, data in p.synthetic(part).items():
                    np.from_dlpack(part.fields[name]).reshape(-1).view(np.uint8)[:] = np.frombuffer(data, np.uint8)
                part.commit()
                made.append(part.seq)

        t = threading.Thread(target=fill)
        t.start()
        c = pinring.Consumer(daemon.ring, path=daemon.path)
        got = []
        while (b := c.next_batch(60)) is not None:
            want = c.expected(b.batch)
            for name, field in b.fields.items():
                assert np.from_dlpack(field).tobytes() == want[name], (b.batch, name)
            got.append(b.batch)
            del b
        c.close()
        summary = json.loads(daemon.stop())
        t.join(60)
        assert not t.is_alive(), "a stopped daemon's producers claim None"
        assert got == list(range(16)) and sorted(made) == got, "two epochs, every batch once"
        assert summary["batches_delivered"] == 16 and summary["missing"] == 0, summary
        p.close()
    finally:
        if daemon.running:
            daemon.stop()
