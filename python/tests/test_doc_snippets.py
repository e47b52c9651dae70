"""Every Python snippet of README.md and docs/*.md runs as written.

Each ```` ```python ```` block of those files follows a marker line saying what it needs::

    <!-- snippet: host -->                  runs on any host (CPU: the host backend)
    <!-- snippet: host with train.toml -->  ... with a small synthetic config at train.toml
    <!-- snippet: host with shards/ -->     ... with two small WebDataset shards in shards/
    <!-- snippet: daemon default -->        ... while ring "default" is served by a daemon
                                            (--sink consumer) and two loaders
    <!-- snippet: gpu -->                   needs a CUDA GPU (skipped, saying so, elsewhere)

A block without a marker fails this test, so a new snippet cannot go untried. Each runs as a
script of its own, in a fresh interpreter, in an empty folder, and must exit 0.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"<!-- snippet: (\w+)(?: (.*?))? -->")

# A small synthetic config: the built-in default's fields and shapes, fewer samples.
SMALL_SYNTHETIC = """
[ring]
name = "{ring}"
[dataset]
kind = "synthetic"
samples = 256
sample_shape = [128, 128]
dtype = "f32"
[plan]
batch_size = 32
epochs = 1
"""


def snippets() -> Iterator[Tuple[str, str, str, str]]:
    """(where, kind, argument, code) of every Python block of README.md and docs/*.md."""
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip() != "```python":
                continue
            where = f"{path.relative_to(ROOT)}:{i + 1}"
            end = lines.index("```", i + 1)
            code = "\n".join(lines[i + 1:end]) + "\n"
            above = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            m = MARKER.fullmatch(above.strip())
            yield where, m.group(1) if m else "", (m.group(2) or "") if m else "", code


ALL = list(snippets())


def test_the_docs_have_snippets_and_each_is_marked() -> None:
    assert len(ALL) >= 6, ALL
    unmarked = [where for where, kind, _, _ in ALL if kind not in ("host", "daemon", "gpu")]
    assert not unmarked, (
        f"Python snippets without a <!-- snippet: host|daemon RING|gpu --> line above: {unmarked}")


def _jpeg(value: int) -> bytes:
    from PIL import Image
    out = io.BytesIO()
    Image.new("RGB", (48, 40), (value, 255 - value, 7)).save(out, "JPEG", quality=90)
    return out.getvalue()


def _write_shards(folder: Path) -> None:
    folder.mkdir()
    for shard in range(2):
        with tarfile.open(folder / f"train-{shard:02d}.tar", "w") as tar:
            for k in range(48):
                key = f"{shard:02d}{k:04d}"
                for ext, data in ((".jpg", _jpeg(k * 5)), (".cls", str(k % 10).encode())):
                    info = tarfile.TarInfo(key + ext)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


def _program(name: str) -> List[str]:
    import pinring
    return pinring.program(name)


def _serve(ring: str, folder: Path) -> List[subprocess.Popen[bytes]]:
    """A daemon handing ring ``ring`` to a consumer, and two loaders, on a small config."""
    config = folder / "served.toml"
    config.write_text(SMALL_SYNTHETIC.format(ring=ring))
    daemon = subprocess.Popen(
        [*_program("pinring-daemon"), "--config", str(config), "--sink", "consumer"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    loaders = [subprocess.Popen([*_program("pinring-loader"), "--config", str(config)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for _ in range(2)]
    return [daemon, *loaders]


@pytest.mark.parametrize("where,kind,arg,code", ALL, ids=[s[0] for s in ALL])
def test_the_snippet_runs_as_written(where: str, kind: str, arg: str, code: str,
                                     tmp_path: Path) -> None:
    if kind == "gpu":
        import torch
        if not torch.cuda.is_available():
            pytest.skip(f"{where} needs a CUDA GPU; torch sees none here")
    served: List[subprocess.Popen[bytes]] = []
    if arg == "with train.toml":
        (tmp_path / "train.toml").write_text(SMALL_SYNTHETIC.format(ring="train"))
    elif arg == "with shards/":
        _write_shards(tmp_path / "shards")
    elif kind == "daemon":
        served = _serve(arg, tmp_path)
    (tmp_path / "snippet.py").write_text(code)
    env = dict(os.environ, RUST_LOG="warn")
    try:
        t = time.monotonic()
        done = subprocess.run([sys.executable, "snippet.py"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (
            f"{where} exited {done.returncode} after {time.monotonic() - t:.1f} s:\n{code}\n"
            f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}")
    finally:
        for p in served:
            p.terminate()
        for p in served:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
