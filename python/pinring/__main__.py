"""``python -m pinring``: the ``pinring`` program (``python -m pinring --help``)."""

import sys

from pinring._programs import _run

if __name__ == "__main__":
    sys.exit(_run("pinring"))
