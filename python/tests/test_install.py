"""The package as ``pip install`` gives it: a fresh virtual environment installs the wheel built
in this test run (``PINRING_TEST_WHEEL``, set by scripts/test) and nothing else from the
repository, and its programs work from there: ``pinring --help``, ``pinring config check``,
``pinring run`` (which starts its daemon and loaders as ``python -m pinring ...``), and an
error's exit code and message."""

import os
import pathlib
import subprocess
import sys

import pytest

WHEEL = os.environ.get("PINRING_TEST_WHEEL")


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    if not WHEEL:
        pytest.skip("PINRING_TEST_WHEEL is not set (scripts/test sets it to the wheel it built)")
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    # The wheel alone: no index, no dependencies (NumPy is not needed by the programs).
    subprocess.run(
        [str(root / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-index",
         "--no-deps", WHEEL],
        check=True,
    )
    return root


def run(venv, *args, cwd):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PINRING_CONFIG")}
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_the_programs_are_on_the_venvs_path(venv, tmp_path):
    for name in ("pinring", "pinring-daemon", "pinring-loader"):
        r = run(venv, venv / "bin" / name, "--help", cwd=tmp_path)
        assert r.returncode == 0, (name, r.stderr)
        assert "Usage:" in r.stdout, r.stdout
    r = run(venv, venv / "bin" / "python", "-m", "pinring", "--version", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("pinring "), (r.stdout, r.stderr)
    # The package imports from the venv, not from the repository, with the programs' version.
    r = run(venv, venv / "bin" / "python", "-c",
            "import pinring; print(pinring.__file__); print(pinring.__version__); "
            "print(pinring.program('pinring-loader'))", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    where, version, loader = r.stdout.splitlines()
    assert pathlib.Path(where).is_relative_to(venv), where
    assert loader.endswith("'-m', 'pinring', 'loader']"), loader


def test_config_check_and_its_errors(venv, tmp_path):
    r = run(venv, venv / "bin" / "pinring", "config", "check", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "[ring]" in r.stdout and "[plan]" in r.stdout, r.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text("[plan]\nbatch_size = 0\n")
    r = run(venv, venv / "bin" / "pinring", "config", "check", bad, cwd=tmp_path)
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert "batch_size" in r.stderr, r.stderr
    r = run(venv, venv / "bin" / "pinring", "no-such-command", cwd=tmp_path)
    assert r.returncode == 2 and "no-such-command" in r.stderr, (r.returncode, r.stderr)


def test_pinring_run_starts_its_daemon_and_loaders_from_the_venv(venv, tmp_path):
    ring = f"test-install-{os.getpid()}"
    r = run(venv, venv / "bin" / "pinring", "run", "--ring", ring, "--backend", "host",
            "--loaders", "2", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1024 delivered of 1024 (1024 verified, 0 failed" in r.stdout, r.stdout


# -- the examples, from the installed package -----------------------------------------------

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def trainer_venv(tmp_path_factory):
    """A fresh venv with the wheel, which also sees this interpreter's third-party packages
    (torch, torchvision, numpy) through a .pth file: those come after the venv's own
    site-packages, so ``import pinring`` is the wheel's."""
    if not WHEEL:
        pytest.skip("PINRING_TEST_WHEEL is not set (scripts/test sets it to the wheel it built)")
    pytest.importorskip("torch")
    import sysconfig

    root = tmp_path_factory.mktemp("trainer-venv")
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    subprocess.run([str(root / "bin" / "python"), "-m", "pip", "install", "--quiet",
                    "--no-index", "--no-deps", WHEEL], check=True)
    site = subprocess.run([str(root / "bin" / "python"), "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    pathlib.Path(site, "outer-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    r = run(root, root / "bin" / "python", "-c", "import pinring, torch; print(pinring.__file__)",
            cwd=root)
    assert r.returncode == 0 and r.stdout.startswith(str(root)), (r.stdout, r.stderr)
    return root


def example(venv, name, *args, cwd):
    r = run(venv, venv / "bin" / "python", ROOT / "examples" / name, *args, cwd=cwd)
    assert r.returncode == 0, f"{name} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def test_the_resnet_webdataset_example_trains_from_the_install(trainer_venv, tmp_path):
    pytest.importorskip("torchvision")
    import io
    import tarfile

    from PIL import Image

    import numpy as np

    # Two shards of eight JPEGs (48x40, random pixels) with their classes, as WebDataset
    # writes them.
    rng = np.random.default_rng(0)
    shards = []
    for s in range(2):
        path = tmp_path / f"train-{s:06d}.tar"
        with tarfile.open(path, "w") as tar:
            for i in range(8):
                jpg = io.BytesIO()
                pixels = rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(jpg, format="JPEG")
                for ext, data in (("jpg", jpg.getvalue()), ("cls", str(i % 10).encode())):
                    info = tarfile.TarInfo(f"{s:02d}{i:04d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        shards.append(path)
    out = example(trainer_venv, "train_resnet_webdataset.py", "--shards",
                  str(tmp_path / "train-*.tar"), "--loaders", "2", "--batch-size", "4",
                  "--crop", "32", "--classes", "10", "--epochs", "2", "--steps", "6",
                  "--warmup", "1", "--device", "cpu", cwd=tmp_path)
    assert "step 6: loss" in out and "5 steps in" in out and "images/s" in out, out
    assert "pinring: " in out, out


def test_the_gpt_tokens_example_trains_and_resumes_from_the_install(trainer_venv, tmp_path):
    import pickle

    import numpy as np

    data = tmp_path / "data"
    data.mkdir()
    np.random.default_rng(0).integers(0, 64, 20_000, dtype=np.uint16).tofile(data / "train.bin")
    with open(data / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": 64}, f)
    ckpt = tmp_path / "ckpt.pt"
    small = ["--data", str(data), "--loaders", "2", "--batch-size", "4", "--block-size", "32",
             "--layers", "2", "--heads", "2", "--embd", "32", "--warmup", "1", "--device", "cpu",
             "--checkpoint", str(ckpt)]
    out = example(trainer_venv, "train_gpt_tokens.py", *small, "--steps", "6", cwd=tmp_path)
    assert "step 6: loss" in out and "tokens/s" in out, out
    # Resumed: the loader goes on at the batch after the sixth (seq 6: one part a batch).
    out = example(trainer_venv, "train_gpt_tokens.py", *small, "--steps", "9", "--resume",
                  cwd=tmp_path)
    assert "resumed at step 6, seq 6" in out and "step 9: loss" in out, out
