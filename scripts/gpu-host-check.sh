#!/usr/bin/env bash
# Runs on a GPU host, from a folder made by scripts/gpu-bundle.sh: the GPU tests, the benchmark
# and the PyTorch comparison. Results (logs, CSV, SVG, JSON) go to OUT.
# Usage: bash gpu-host-check.sh OUT [bench flags...]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: gpu-host-check.sh OUT [bench flags...]}
shift
mkdir -p "$out"
export PINRING_BIN_DIR="$here/bin"
# This host has a GPU: a GPU test that finds none must fail, not print SKIPPED and pass.
export PINRING_REQUIRE_GPU=1
fail=0
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv
    lscpu | grep -E 'Model name|^CPU\(s\)|L3'
} > "$out/machine.txt" 2>&1
cat "$out/machine.txt"
echo "== GPU tests"
for t in "$here"/tests/*; do
    echo "-- $(basename "$t")"
    "$t" --test-threads 1 2>&1 | tee -a "$out/tests.log" | grep -E "^test |test result|SKIPPED|panicked" || true
    [ "${PIPESTATUS[0]}" -eq 0 ] || fail=1
done
echo "== pinring run (the main job, every byte verified on the GPU)"
"$here/bin/pinring" run --backend cuda --quiet 2>&1 | tee "$out/run.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || fail=1
echo "== pinring bench"
"$here/bin/pinring" bench --backend cuda --out "$out/bench" "$@" 2>&1 | tee "$out/bench.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || fail=1
echo "== PyTorch DataLoader vs pinring"
PYTHONUNBUFFERED=1 python3 "$here/bench/torch_dataloader.py" --pinring "$here/bin" --out "$out/torch" 2>&1 | tee "$out/torch.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || fail=1
exit $fail
