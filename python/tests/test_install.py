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
