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


# -- without torch ----------------------------------------------------------------------------

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Run before the code under test: torch (and torchvision) cannot be imported, as in an
# environment where they were never installed (an import raises ModuleNotFoundError).
NO_TORCH = """
import sys
sys.modules["torch"] = None
sys.modules["torchvision"] = None
"""


def without_torch(*args, code=None):
    """Runs this interpreter on ``args`` (or ``-c code``) where torch cannot be imported."""
    import subprocess
    import sys

    if code is not None:
        args = ("-c", NO_TORCH + code)
    else:
        # A script: run as __main__, with its own argv, after torch is made unimportable.
        script, *rest = args
        args = ("-c", NO_TORCH + "import runpy; sys.argv = " + repr([str(script), *rest])
                + "; runpy.run_path(sys.argv[0], run_name='__main__')")
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)


def test_pinring_torch_without_torch_says_what_to_install():
    r = without_torch(code="""
try:
    import pinring.torch
except ImportError as e:
    assert type(e) is ModuleNotFoundError, type(e)
    assert e.name == "torch", e.name
    print(e)
else:
    raise SystemExit("pinring.torch imported without torch")
import pinring                      # the rest of the package needs no torch
assert pinring.Loader and pinring.Consumer
""")
    assert r.returncode == 0, r.stderr
    said = r.stdout.strip()
    assert said.startswith("pinring.torch needs PyTorch"), said
    assert "pip install torch" in said, said
    assert "import of torch halted" not in said, "the bare error is not what the user reads"


def test_the_examples_help_runs_without_torch():
    # --help is parsed before torch is imported: it takes a second, not the 8-16 s of importing
    # torch and torchvision, and works where they are missing.
    examples = sorted((ROOT / "examples").glob("*.py"))
    assert [e.name for e in examples] == ["train_gpt_tokens.py", "train_resnet_webdataset.py"]
    for example in examples:
        r = without_torch(example, "--help")
        assert r.returncode == 0, f"{example.name}: {r.stderr}"
        assert r.stdout.startswith("usage: "), r.stdout
        assert "--device" in r.stdout and "--steps" in r.stdout, r.stdout
