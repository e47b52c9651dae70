#!/usr/bin/env python3
"""PyTorch's own DataLoader tests, run against torch's DataLoader or against pinring's.

Runs a torch ``test/test_dataloader.py`` under pytest in a child process, as it is
(``--loader torch``) or with ``torch.utils.data.DataLoader`` (and
``torch.utils.data.dataloader.DataLoader``) replaced by ``pinring.torch.DataLoader``
(``--loader pinring``). The test file is torch's, not pinring's: take it from pytorch's
repository at the tag of the installed torch (``git show v2.X.Y:test/test_dataloader.py``), keep
it out of this repository, and pass its path; the script never writes next to it.

How the swap reaches every process: a ``sitecustomize`` module in a temporary directory put on
the child's ``PYTHONPATH`` adds an import hook that, right after ``torch`` finishes importing,
removes both names, so that their first look-up (a module ``__getattr__``) imports
``pinring.torch`` and binds its DataLoader there. (Importing pinring.torch at once would break a
process in which pinring.torch itself imports torch: a spawned pinring zygote.) So the test
module's ``from torch.utils.data import DataLoader`` (at import), its
``torch.utils.data.DataLoader(...)`` calls, the ``spawn`` processes its tests start and the
``python -c`` scripts some tests run all get pinring's. A pytest plugin (``-p``, same directory)
checks that the swap took before any test module is imported, and stops the run otherwise.
Nothing is installed or written anywhere else; ``PYTHONDONTWRITEBYTECODE`` keeps ``__pycache__``
from appearing beside the test file.

Each test gets ``--timeout`` seconds (pytest-timeout; a hang is a failure naming the timeout),
and the run is serial. Needs pytest, pytest-timeout, expecttest, psutil and hypothesis (torch's
test utilities import them) in the Python that runs this script.

Usage: torch_compat.py --tests PATH --loader torch|pinring --out DIR [--timeout 180] [-k EXPR]
Prints a Markdown summary (counts, then each failed or errored test with the first line of its
message, cut at 200 characters) and writes, under --out: junit.xml, pytest.log (the child's
output), results.json (the counts and, per test, name, outcome and first line of message) and
summary.md.
"""

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import xml.etree.ElementTree as ET

# Imported by every Python process of the run (it is on PYTHONPATH): once torch has finished
# importing, its DataLoader names resolve to pinring's; a process that never imports torch pays
# nothing.
SITECUSTOMIZE = '''
import importlib.abc
import importlib.machinery
import sys


def _lazy_dataloader(module):
    # PEP 562: the name is looked up here once it is missing from the module's dict.
    def __getattr__(name):
        if name != "DataLoader":
            raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")
        import pinring.torch

        module.DataLoader = pinring.torch.DataLoader
        return module.DataLoader

    return __getattr__


def _swap():
    # pinring.torch is not imported here: torch may be imported by pinring.torch itself (a
    # spawned worker unpickling pinring's code), which is then only half made. The name is
    # removed, and pinring's DataLoader is imported at the first look-up of it.
    import torch.utils.data
    import torch.utils.data.dataloader

    for module in (torch.utils.data, torch.utils.data.dataloader):
        module.__dict__.pop("DataLoader", None)
        module.__getattr__ = _lazy_dataloader(module)


class _SwapAfterTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != "torch":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_swap(module):
            exec_module(module)
            _swap()

        spec.loader.exec_module = exec_then_swap
        return spec


if "torch" in sys.modules:
    _swap()
else:
    sys.meta_path.insert(0, _SwapAfterTorch())
'''

PLUGIN = '''
import torch.utils.data
import torch.utils.data.dataloader
import pinring.torch

if not (torch.utils.data.DataLoader is pinring.torch.DataLoader
        and torch.utils.data.dataloader.DataLoader is pinring.torch.DataLoader):
    raise RuntimeError("torch_compat: torch.utils.data.DataLoader was not replaced by "
                       "pinring.torch.DataLoader")


def pytest_report_header(config):
    return (f"torch_compat: torch.utils.data.DataLoader is pinring.torch.DataLoader "
            f"(pinring from {pinring.__file__})")
'''


def run_pytest(args, out):
    """Runs pytest on the test file in a child process; returns (exit code, seconds)."""
    tests = pathlib.Path(args.tests).resolve()
    junit = out / "junit.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           "--timeout", str(args.timeout),
           "-o", f"faulthandler_timeout={args.timeout + 20}",
           "--junitxml", str(junit)]
    if args.k:
        cmd += ["-k", args.k]
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    shim = None
    if args.loader == "pinring":
        shim = pathlib.Path(tempfile.mkdtemp(prefix="torch_compat."))
        (shim / "sitecustomize.py").write_text(textwrap.dedent(SITECUSTOMIZE))
        (shim / "torch_compat_swap.py").write_text(textwrap.dedent(PLUGIN))
        env["PYTHONPATH"] = os.pathsep.join(
            [str(shim)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        cmd += ["-p", "torch_compat_swap"]
    cmd.append(tests.name)
    start = time.monotonic()
    try:
        with open(out / "pytest.log", "w") as log:
            code = subprocess.call(cmd, cwd=tests.parent, env=env, stdout=log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    finally:
        if shim is not None:
            shutil.rmtree(shim, ignore_errors=True)
    return code, time.monotonic() - start


def first_line(text):
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()
    return ""


def short(message, width=200):
    """A message for one cell of a Markdown table: no pipes, at most width characters."""
    message = message.replace("|", "/")
    return message if len(message) <= width else message[:width - 3] + "..."


def read_junit(path):
    """Per test: name (class::test), outcome and the first line of its message."""
    results = []
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        outcome, message = "passed", ""
        for tag, what in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            node = case.find(tag)
            if node is not None:
                outcome = what
                if tag == "skipped" and node.get("type") == "pytest.xfail":
                    outcome = "xfailed"
                message = first_line(node.get("message")) or first_line(node.text)
                break
        results.append({"name": name, "outcome": outcome, "message": message,
                        "seconds": float(case.get("time") or 0)})
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tests", required=True,
                    help="torch's test/test_dataloader.py, of the installed torch's version")
    ap.add_argument("--loader", choices=("torch", "pinring"), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--timeout", type=int, default=180, help="seconds per test (default 180)")
    ap.add_argument("-k", default=None, help="pytest -k expression")
    args = ap.parse_args()
    if not os.path.isfile(args.tests):
        ap.error(f"--tests {args.tests}: no such file")

    import torch  # after the arguments: --help answers without it

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    code, seconds = run_pytest(args, out)
    if not (out / "junit.xml").exists():
        sys.exit(f"pytest wrote no junit.xml (exit code {code}); see {out / 'pytest.log'}")
    results = read_junit(out / "junit.xml")
    counts = {k: sum(r["outcome"] == k for r in results)
              for k in ("passed", "failed", "error", "skipped", "xfailed")}
    counts["total"] = len(results)
    summary = {"loader": args.loader, "torch": torch.__version__,
               "tests": str(pathlib.Path(args.tests).resolve()), "timeout": args.timeout,
               "k": args.k, "pytest_exit_code": code, "seconds": round(seconds, 1),
               "counts": counts, "results": results}
    with open(out / "results.json", "w") as f:
        json.dump(summary, f, indent=1)

    lines = [f"loader {args.loader}, torch {torch.__version__}, {args.tests}, "
             f"timeout {args.timeout} s a test, {seconds:.0f} s in all (pytest exit {code})",
             "",
             "| passed | failed | errors | skipped | xfailed | total |",
             "| --- | --- | --- | --- | --- | --- |",
             f"| {counts['passed']} | {counts['failed']} | {counts['error']} | "
             f"{counts['skipped']} | {counts['xfailed']} | {counts['total']} |"]
    bad = [r for r in results if r["outcome"] in ("failed", "error")]
    if bad:
        lines += ["", "| test | outcome | first line of the message |", "| --- | --- | --- |"]
        lines += [f"| {r['name']} | {r['outcome']} | {short(r['message'])} |" for r in bad]
    text = "\n".join(lines)
    print(text)
    (out / "summary.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
