#!/usr/bin/env bash
# Runs one pipeline point (8 loaders, discard sink, 256 KiB samples) under several daemon settings
# (upload buffers, CPU affinity, slot size), three rounds alternated, and prints GB/s, the bound
# verdict, latency, the daemon main loop's time inside submit calls and asleep, and per-thread
# CPU of each run. From a bundle made by scripts/gpu-bundle.sh, on
# a GPU host: bash DIR/slow-mode-matrix.sh OUT
set -u
here=$(cd "$(dirname "$0")" && pwd); B=$here/bin; out=${1:-/tmp/sm}; mkdir -p $out
point() { # name batch slots bufs dtaskset ltaskset
  local name=$1 batch=$2 slots=$3 bufs=$4 dts=$5 lts=$6 ring=sm$RANDOM
  cat > $out/$name.toml <<T
[ring]
name = "$ring"
slots = $slots
slot_bytes = "auto"
[dataset]
samples = 65536
sample_shape = [262144]
dtype = "u8"
[plan]
batch_size = $batch
epochs = 1
T
  local extra=""; [ "$bufs" != "-" ] && extra="--prefetch $bufs"
  $dts $B/pinring-daemon --config $out/$name.toml --backend cuda --sink discard --summary $out/$name.json $extra 2>$out/$name.dlog &
  local d=$!
  for i in $(seq 8); do $lts $B/pinring-loader --config $out/$name.toml --wait-secs 20 2>/dev/null & done
  wait $d; wait
  python3 -c "import json,sys;d=json.load(open('$out/$name.json'));print('%-28s %6.1f GB/s bound=%-9s p50=%5d p99=%5d run=%.2fs submit=%.3fs asleep=%.3fs cpu=%s'%('$name',d['gbps'],d['bound'],d['latency_p50_us'],d['latency_p99_us'],d['seconds'],d.get('submit_seconds',-1),d.get('doorbell_wait_seconds',-1),{k:round(v,2) for k,v in d['thread_cpu_seconds'].items()}))"
}
for rep in 1 2 3; do
  for bufs in 4 8 16 64; do point "1M-buf$bufs-r$rep" 4 32 $bufs "" ""; done
  point "1M-pin-r$rep" 4 32 - "taskset -c 0-3" "taskset -c 4-15"
  point "256K-buf64-r$rep" 1 128 - "" ""
  point "256K-buf8-r$rep" 1 128 8 "" ""
  point "4M-r$rep" 16 32 - "" ""
done
