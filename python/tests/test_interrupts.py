"""Ctrl-C reaches every blocking call: each wait runs with the GIL released and looks at
Python's signal handlers at least every 100 ms, so the default SIGINT handler's
KeyboardInterrupt is raised (in about 0.1 s; the tests allow 5 s, so that a loaded machine does
not fail them: before, these waits never ended), in a child process that waits:
- ``Consumer(ring)`` for a ring that does not exist (yet);
- ``Consumer.next_batch()`` with no timeout, on a ring no loader feeds;
- ``for batch in pinring.Loader(ring=...)`` on the same ring."""

import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from test_consumer import Ring

# Python turns SIGINT into KeyboardInterrupt only if SIGINT was not ignored when it started,
# and a process started in the background by a non-interactive shell (as CI may start this
# suite) inherits it ignored: the child installs the default handler itself, as an interactive
# session has it.
PRELUDE = textwrap.dedent(
    """
    import signal, sys, time
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import pinring
    ring = sys.argv[1]
    """
)

# Seconds from SIGINT to the child's exit that the tests allow (it takes about 0.1 s).
LIMIT = 5.0

WAITS = {
    "attach": "print('waiting', flush=True)\npinring.Consumer(ring, wait_for_ring=60)\n",
    "next_batch": "c = pinring.Consumer(ring)\nprint('waiting', flush=True)\nc.next_batch()\n",
    "loader": "loader = pinring.Loader(ring=ring)\nprint('waiting', flush=True)\nfor b in loader:\n    pass\n",
}


def interrupted(script, ring_name):
    """Runs `script` in a child; once it says it waits (and a moment more, so that it is inside
    the native wait), sends SIGINT; returns (seconds to exit, stderr, returncode)."""
    child = subprocess.Popen(
        [sys.executable, "-c", PRELUDE + script, ring_name],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "waiting", child.stderr.read()
        # The print comes right before the call; the call's first wait slice is 100 ms.
        time.sleep(0.3)
        assert child.poll() is None, child.stderr.read()
        t = time.monotonic()
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=10)
        return time.monotonic() - t, err, child.returncode
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_ctrl_c_interrupts_waiting_for_a_ring_that_does_not_exist():
    took, err, rc = interrupted(WAITS["attach"], f"py-missing-{uuid.uuid4().hex[:8]}")
    assert "KeyboardInterrupt" in err and rc != 0, err
    assert took < LIMIT, f"{took:.2f} s"


@pytest.mark.parametrize("wait", ["next_batch", "loader"])
def test_ctrl_c_interrupts_waiting_for_a_batch(tmp_path, wait):
    # A consumer ring with no loader: no batch ever comes.
    ring = Ring(tmp_path, loaders=0)
    try:
        # The child attaches (waiting for the ring to be ready) before it says it waits.
        took, err, rc = interrupted(WAITS[wait], ring.name)
        assert "KeyboardInterrupt" in err and rc != 0, err
        assert took < LIMIT, f"{took:.2f} s"
    finally:
        ring.close()
