#!/usr/bin/env bash
# Builds everything a GPU host needs to check and measure pinring, into one folder:
#   bin/       release binaries (pinring, pinring-daemon, pinring-loader)
#   tests/     release test executables: the cuda backend's unit tests and the GPU end-to-end tests
#   bench/     the PyTorch side-by-side scripts (DataLoader, the trainer's end, a training step)
#   wheels/    the pinring Python package (abi3 wheel, any CPython >= 3.9)
#   gpu-host-check.sh  runs the GPU tests, `pinring bench` and the PyTorch comparison there
# The GPU host needs no Rust toolchain: copy the folder over and run
#   bash DIR/gpu-host-check.sh OUT
# Usage: scripts/gpu-bundle.sh DIR
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: scripts/gpu-bundle.sh DIR}
rm -rf "$dir"
mkdir -p "$dir/bin" "$dir/tests" "$dir/bench" "$dir/wheels"
cargo build --release --bins
cp target/release/pinring target/release/pinring-daemon target/release/pinring-loader "$dir/bin/"
cargo test --release --no-run --message-format=json -p pinring-backend --lib -p pinring --test gpu 2>/dev/null |
    python3 -c '
import json, shutil, sys
dest = sys.argv[1]
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    exe = m.get("executable")
    if m.get("reason") == "compiler-artifact" and exe and m["profile"]["test"]:
        name = m["target"]["name"]
        shutil.copy(exe, f"{dest}/{name}")
        print("test executable:", name)
' "$dir/tests"
# Debug line tables make each executable ~30 MB; the host copy does not need them.
strip --strip-debug "$dir"/bin/* "$dir"/tests/*
cp bench/*.py scripts/gpu-consumer-check.py "$dir/bench/"
# maturin: $MATURIN, else on PATH, else the one scripts/test installs in $PINRING_PYENV
# (default target/pyenv).
maturin=${MATURIN:-$(command -v maturin || echo "${PINRING_PYENV:-target/pyenv}/bin/maturin")}
if [ -x "$maturin" ]; then
    maturin=$(realpath "$maturin") # the build below runs in python/
    py=$(dirname "$maturin")/python
    [ -x "$py" ] || py=${PYTHON:-python3}
    wheels=$(realpath -m "$dir/wheels")
    (cd python && "$maturin" build --release --interpreter "$py" --out "$wheels")
else
    echo "no maturin (run scripts/test once, or set MATURIN): $dir/wheels has no pinring wheel" >&2
fi
cp scripts/gpu-host-check.sh scripts/slow-mode-matrix.sh "$dir/"
echo "bundle ready in $dir"
