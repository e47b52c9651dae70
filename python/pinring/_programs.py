"""The programs ``pinring``, ``pinring-daemon`` and ``pinring-loader``, installed by ``pip`` as
console scripts: each runs the Rust program inside this interpreter, through the extension
(``_native._main``), so the wheel carries no executable apart from it. ``python -m pinring`` is
``pinring``, and is how the programs start their own children (``pinring run`` starts
``python -m pinring daemon`` and ``... loader``)."""

from __future__ import annotations

import signal
import sys
from typing import List, Optional

# How this package's programs are started again as children: this interpreter, -m pinring.
_PREFIX = ["-m", "pinring"]


def program(name: str) -> List[str]:
    """The command line that runs program ``name`` (``"pinring"``, ``"pinring-daemon"`` or
    ``"pinring-loader"``) from this installation, as a list for ``subprocess``: this
    interpreter with ``-m pinring``, and the subcommand (``daemon``, ``loader``) for the other
    two. Arguments follow."""
    sub = {"pinring": [], "pinring-daemon": ["daemon"], "pinring-loader": ["loader"]}
    if name not in sub:
        from pinring import _native

        raise _native.UsageError(
            f"no program named {name!r}: the programs are pinring, pinring-daemon and "
            "pinring-loader"
        )
    return [sys.executable, *_PREFIX, *sub[name]]


def _run(name: str, argv: Optional[List[str]] = None) -> int:
    from pinring import _native

    args = [name, *(sys.argv[1:] if argv is None else argv)]
    # The program stops cleanly on SIGINT and SIGTERM through its own handlers; Python's would
    # raise KeyboardInterrupt after it has already stopped.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.stdout.flush()
    return _native._main(name, args, sys.executable, _PREFIX)


def pinring() -> int:
    """``pinring``: the command-line front end (``pinring --help``)."""
    return _run("pinring")


def daemon() -> int:
    """``pinring-daemon``: one per ring (``pinring-daemon --help``)."""
    return _run("pinring-daemon")


def loader() -> int:
    """``pinring-loader``: any number per ring (``pinring-loader --help``)."""
    return _run("pinring-loader")
