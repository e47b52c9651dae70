"""Python loaders: ``pinring.Producer`` processes fill the parts of a real pinring-daemon's ring
(``--backend host --sink consumer``) with the synthetic generator's bytes, and a
``pinring.Consumer`` in this process checks every byte of every batch, in order. One producer is
SIGKILLed while it holds a claimed part: the daemon takes the slot back and nothing is lost."""

import json
import signal
import subprocess
import sys
import textwrap

import pytest

import pinring
from test_consumer import CONFIG, ROOT, Ring

np = pytest.importorskip("numpy")

BATCHES = 128

# Batches of 8 samples of 2 KiB images + 8-byte labels cut into parts of 3, 3 and 2 samples:
# a 8 KiB slot holds 3 samples and their metadata.
SPLIT = CONFIG.replace("[ring]\nslots = 8", "[ring]\nslots = 8\nslot_bytes = 8192")

PRODUCER = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    import pinring

    ring, config, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    # "-": no config; the producer adopts the spec the daemon stored in its ring
    p = pinring.Producer(ring, config=None if config == "-" else config)
    print("attached", p.loader_index, flush=True)
    made = 0
    while (part := p.claim(timeout=60)) is not None:
        want = p.synthetic(part)
        assert set(part.fields) == set(want), (part.fields, want)
        for name, field in part.fields.items():
            a = np.from_dlpack(field)
            assert a.shape[0] == len(part.indices) == len(part), (a.shape, part)
            assert a.flags.writeable
            a.reshape(-1).view(np.uint8)[:] = np.frombuffer(want[name], np.uint8)
        if mode == "hold":
            print("holding", part.seq, flush=True)
            time.sleep(600)  # killed here, the part claimed and filled but not committed
        part.commit()
        made += 1
    p.close()
    print("done", made, flush=True)
    """
)


def producer(ring, mode="fill", adopt=False):
    return subprocess.Popen(
        [sys.executable, "-c", PRODUCER, ring.name, "-" if adopt else str(ring.config), mode],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def consume_all(ring, batches):
    c = pinring.Consumer(ring.name)
    seqs = []
    while (b := c.next_batch(60)) is not None:
        want = c.expected(b.batch)
        assert set(b.fields) == set(want)
        for name, field in b.fields.items():
            assert np.from_dlpack(field).tobytes() == want[name], f"batch {b.batch}, field {name}"
        seqs.append(b.batch)
        del b
    c.close()
    assert seqs == list(range(batches)), "every batch once, in order"


def finish(ring, producers):
    made = 0
    for p in producers:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, f"producer exited {p.returncode}: {err}"
        made += int(out.split()[-1])
    ring.wait_all()  # the daemon
    return made, json.loads(ring.summary.read_text())


@pytest.mark.parametrize("config,parts", [(CONFIG, 1), (SPLIT, 3)], ids=["whole", "parts"])
def test_two_python_producers_make_every_batch_byte_for_byte(tmp_path, config, parts):
    r = Ring(tmp_path, loaders=0, config=config)
    try:
        # One loads the daemon's config file, the other adopts the spec stored in the ring.
        producers = [producer(r), producer(r, adopt=True)]
        r.wait_attached(2)
        consume_all(r, BATCHES)
        made, summary = finish(r, producers)
        assert made == BATCHES * parts, "every part committed once"
        assert summary["batches_delivered"] == BATCHES
        assert summary["duplicates"] == 0 and summary["missing"] == 0
    finally:
        r.close()


def test_a_producer_killed_holding_a_part_loses_nothing(tmp_path):
    r = Ring(tmp_path, loaders=0)
    try:
        doomed = producer(r, mode="hold")
        r.procs.append(doomed)  # killed by close() if the test fails early
        assert doomed.stdout.readline().startswith("attached")
        held = doomed.stdout.readline().split()
        assert held[0] == "holding", held
        producers = [producer(r), producer(r)]
        r.wait_attached(3)
        doomed.send_signal(signal.SIGKILL)
        doomed.wait()
        r.procs.remove(doomed)
        consume_all(r, BATCHES)
        made, summary = finish(r, producers)
        assert made == BATCHES, "the killed producer's part was made by another"
        assert summary["batches_delivered"] == BATCHES
        assert summary["duplicates"] == 0 and summary["missing"] == 0
    finally:
        r.close()


def test_a_producer_with_another_config_is_refused(tmp_path):
    r = Ring(tmp_path, loaders=0)
    try:
        other = tmp_path / "other.toml"
        other.write_text(CONFIG.replace("seed = 7", "seed = 8"))
        with pytest.raises(pinring.RefusedError, match="fingerprint"):
            pinring.Producer(r.name, config=str(other), wait=30)
    finally:
        r.close()


def test_claim_times_out_and_commit_twice_is_refused(tmp_path):
    r = Ring(tmp_path, loaders=0)
    try:
        p = pinring.Producer(r.name, config=str(r.config))
        parts = []
        # Without a consumer the daemon hands out its slots and uploads only as far as its
        # buffers go; then no slot comes free.
        with pytest.raises(pinring.PeerDied, match="no free slot"):
            while True:
                part = p.claim(timeout=1.0)
                assert part is not None
                for name, data in p.synthetic(part).items():
                    np.from_dlpack(part.fields[name]).reshape(-1).view(np.uint8)[:] = np.frombuffer(data, np.uint8)
                part.commit()
                assert part.committed
                parts.append(part)
        assert len({q.seq for q in parts}) == len(parts)
        with pytest.raises(pinring.UsageError, match="already committed"):
            parts[0].commit()
        p.close()
        with pytest.raises(pinring.UsageError, match="closed"):
            p.claim(timeout=0.1)
    finally:
        r.close()


# -- the labels rule (docs/FORMATS.md, "A part's labels"), the same as pinring-loader's -------


@pytest.mark.parametrize("dtype,bad", [("u8", None), ("i16", -1), ("u32", None), ("u64", 2**40), ("i64", -7)])
def test_labels_of_every_integer_dtype_are_taken_and_one_out_of_range_is_refused(tmp_path, dtype, bad):
    config = {
        "dataset": {"kind": "external", "samples": 64,
                    "fields": [{"name": "x", "dtype": "f32", "shape": [4]},
                               {"name": "labels", "dtype": dtype, "shape": []}]},
        "plan": {"batch_size": 8, "shuffle": False, "epochs": 1},
    }
    daemon = pinring.EmbeddedDaemon(spec=pinring.Spec(config), backend="host", anonymous=True)
    try:
        p = pinring.Producer(daemon.ring, path=daemon.path)
        part = p.claim(timeout=30)
        labels = np.from_dlpack(part.fields["labels"])
        assert labels.dtype == np.dtype({"u8": "uint8", "i16": "int16", "u32": "uint32",
                                         "u64": "uint64", "i64": "int64"}[dtype])
        labels[:] = 200 + np.arange(len(part))
        if bad is not None:
            labels[3] = bad
            with pytest.raises(ValueError) as refused:
                part.commit()
            text = str(refused.value)
            assert f"label {bad} of sample {part.indices[3]} " in text, text
            assert "outside 0..=4294967295" in text and "labels field" in text, text
            assert not part.committed, "a refused part is still the producer's to fix"
            labels[3] = 5
        part.commit()
        assert part.committed
        p.close()
    finally:
        daemon.stop()


# -- the example in docs/PYTHON.md ------------------------------------------------------------

DOC = ROOT / "docs" / "PYTHON.md"
MARKER = "<!-- the Producer example: python/tests/test_producer.py runs it -->"


def doc_example():
    """The ``python`` code block right after MARKER in docs/PYTHON.md, as the reader sees it."""
    text = DOC.read_text()
    assert text.count(MARKER) == 1, f"docs/PYTHON.md holds {MARKER!r} {text.count(MARKER)} times"
    after = text.split(MARKER, 1)[1].lstrip("\n")
    if after.startswith("<!-- snippet: "):
        after = after.split("\n", 1)[1]  # a line saying what the block needs (a host)
    assert after.startswith("```python\n"), after[:80]
    return after[len("```python\n"):].split("\n```\n", 1)[0]


def test_the_producer_example_of_the_docs_runs_as_written(tmp_path):
    code = doc_example()
    assert "pinring.Producer(" in code and "pinring.Consumer(" in code, code
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stdout == "64 samples in 8 batches, each as the producer wrote it, in order\n", r.stdout
