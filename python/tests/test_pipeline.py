"""``_native.Pipeline``: an embedded daemon started from a ``Spec`` and the consumer of its
ring, as one object, and its ``RingTicket`` (what a loader process needs to join the ring)."""

import json
import pickle
import threading

import pytest

import pinring
from pinring import _native

np = pytest.importorskip("numpy")

SETTINGS = {
    "dataset": {"samples": 64, "sample_shape": [16], "dtype": "u8"},
    "plan": {"batch_size": 8, "shuffle": False},
}


def spec(ring):
    return pinring.Spec(SETTINGS, ring=ring, default_epochs=1, source="test settings")


def fill(ticket, made):
    """A loader that joins the ring by its ticket and makes every part it can claim."""
    p = pinring.Producer(ticket.ring, path=ticket.path)
    try:
        while (part := p.claim(timeout=60)) is not None:
            for name, data in p.synthetic(part).items():
                np.from_dlpack(part.fields[name]).reshape(-1).view(np.uint8)[:] = np.frombuffer(
                    data, np.uint8)
            part.commit()
            made.append(part.seq)
    finally:
        p.close()


def test_a_pipeline_starts_its_daemon_and_consumer_and_stops_with_a_summary():
    s = spec("pipeline-test")
    p = _native.Pipeline(s, backend="host", anonymous=True, wait_for_ring=10.0)
    try:
        assert p.running and p.ring == "pipeline-test" == p.daemon.ring
        assert p.path is not None and p.path.startswith("/proc/"), p.path
        assert p.spec.ring == s.ring and p.spec.settings() == s.settings()
        c = p.consumer
        assert (c.batches_per_epoch, c.parts_per_batch) == (8, 1)
        ticket = p.ticket()
        # The ticket is what a worker process is sent: it pickles, and comes back equal.
        back = pickle.loads(pickle.dumps(ticket))
        assert back == ticket and hash(back) == hash(ticket)
        assert (back.ring, back.path) == (p.ring, p.path), repr(back)
        made = []
        t = threading.Thread(target=fill, args=(back, made))
        t.start()
        got = []
        while (b := c.next_batch(60)) is not None:
            want = c.expected(b.batch)
            for name, field in b.fields.items():
                assert np.from_dlpack(field).tobytes() == want[name], (b.batch, name)
            got.append(b.batch)
            del b
        summary = json.loads(p.stop())
        t.join(60)
        assert not t.is_alive(), "a stopped daemon's producers claim None"
        assert got == list(range(8)) and sorted(made) == got, "one epoch, every batch once"
        assert summary["batches_delivered"] == 8 and summary["missing"] == 0, summary
        assert not p.running and p.stop() is None, "stopped once"
        with pytest.raises(pinring.UsageError, match='consumer of ring "pipeline-test" is closed'):
            c.next_batch(1)
    finally:
        p.stop()


def test_a_pipeline_starts_at_a_seq():
    p = _native.Pipeline(spec("pipeline-seq"), backend="host", anonymous=True, start_seq=5)
    try:
        made = []
        t = threading.Thread(target=fill, args=(p.ticket(), made))
        t.start()
        got = []
        while (b := p.consumer.next_batch(60)) is not None:
            got.append(b.seq)
            del b
        p.stop()
        t.join(60)
        assert got == [5, 6, 7], got
    finally:
        p.stop()


def test_a_pipeline_refuses_what_is_not_a_spec_and_bad_settings_with_the_fix():
    with pytest.raises(pinring.UsageError, match=r"Pipeline\(spec=<dict>\): pass a pinring.Spec"):
        _native.Pipeline(SETTINGS, backend="host")
    with pytest.raises(pinring.UsageError, match="tpu"):
        _native.Pipeline(spec("pipeline-bad"), backend="tpu")
    with pytest.raises(ValueError, match="wait_for_ring must be a non-negative number"):
        _native.Pipeline(spec("pipeline-bad"), backend="host", anonymous=True, wait_for_ring=-1.0)
    with pytest.raises(pinring.UsageError, match=r'RingTicket\(ring=""\): a ticket names its ring'):
        _native.RingTicket("")
    t = _native.RingTicket("r")
    assert (t.ring, t.path) == ("r", None) and repr(t) == "RingTicket(\"r\")"
    assert pickle.loads(pickle.dumps(t)) == t


def test_a_pipeline_attaches_its_consumer_later_and_again_at_a_seq():
    p = _native.Pipeline(spec("pipeline-attach"), backend="host", anonymous=True, attach=False)
    try:
        # Started alone: the daemon runs, and no consumer is attached yet.
        assert p.running
        with pytest.raises(pinring.UsageError,
                           match=r'Pipeline\(ring="pipeline-attach"\): no consumer is attached'):
            p.consumer
        p.detach()  # nothing attached: nothing to do
        made = []
        t = threading.Thread(target=fill, args=(p.ticket(), made))
        t.start()
        c = p.attach()
        assert p.consumer is c and c.ring == "pipeline-attach"
        with pytest.raises(pinring.UsageError, match=r"attach\(\): its consumer is attached "
                           r"already \(a ring has one consumer\): detach\(\) it first"):
            p.attach()
        first = c.next_batch(60)
        assert first.seq == 0
        del first
        fingerprint = c.state()[1]
        p.detach()
        with pytest.raises(pinring.UsageError,
                           match='consumer of ring "pipeline-attach" is closed'):
            c.next_batch(1)
        with pytest.raises(pinring.UsageError, match="no consumer is attached"):
            p.consumer
        # Attached again on the same daemon, at a later seq of the same plan.
        c2 = p.attach(start_seq=4, fingerprint=fingerprint)
        assert c2 is not c and p.consumer is c2 and c2.state() == (4, fingerprint)
        got = []
        while (b := c2.next_batch(60)) is not None:
            got.append(b.seq)
            del b
        assert got == [4, 5, 6, 7], got
        summary = json.loads(p.stop())
        t.join(60)
        assert summary["missing"] == 0, summary
        with pytest.raises(pinring.UsageError, match="no consumer is attached"):
            p.consumer
        with pytest.raises(pinring.UsageError,
                           match=r'Pipeline\(ring="pipeline-attach"\).attach\(\): the pipeline is '
                                 r"stopped: start a new one"):
            p.attach()
    finally:
        p.stop()


def test_a_pipelines_attach_raises_as_a_consumer_would_and_stays_detached():
    p = _native.Pipeline(spec("pipeline-attach-bad"), backend="host", anonymous=True,
                         attach=False)
    try:
        fingerprint = p.attach().state()[1]
        p.detach()
        with pytest.raises(pinring.RefusedError):
            p.attach(start_seq=0, fingerprint=fingerprint ^ 1)
        # The refused attach left nothing attached: the next one goes through.
        with pytest.raises(pinring.UsageError, match="no consumer is attached"):
            p.consumer
        assert p.attach(start_seq=2, fingerprint=fingerprint).state() == (2, fingerprint)
    finally:
        p.stop()
