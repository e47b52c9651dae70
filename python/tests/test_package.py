"""The package's names: what docs/PYTHON.md says ``pinring`` re-exports from ``pinring._native``
is there, the same object, and in ``__all__``."""

import pathlib
import re

import pinring
from pinring import _native

DOC = pathlib.Path(__file__).parents[2] / "docs" / "PYTHON.md"


def documented_native_names():
    """The first column of the table under "Native classes (`pinring._native`, re-exported by
    `pinring`)"."""
    text = DOC.read_text()
    section = text.split("## Native classes", 1)[1].split("\n## ", 1)[0]
    return [m.group(1) for m in re.finditer(r"^\| `([A-Za-z_][A-Za-z0-9_]*)", section, re.M)]


def test_every_native_name_the_docs_list_is_re_exported():
    names = documented_native_names()
    assert {"Consumer", "check_config", "config_settings", "bound", "PREFETCH_RANGE"} <= set(names)
    missing = [n for n in names if getattr(pinring, n, None) is not getattr(_native, n)]
    assert missing == [], f"documented as re-exported by pinring, but not: {missing}"
    assert [n for n in names if n not in pinring.__all__] == []
