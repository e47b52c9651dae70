#!/usr/bin/env bash
# Run on a GPU host: bash big_batches.sh BIN_DIR. Big batches through the discard sink, 8 loaders:
# a 256 MiB batch of 64 x 4 MiB samples, a batch of one 64 MiB sample (16 byte parts) and a batch
# of one 1 GiB sample (256 byte parts of 4 MiB), twice each.
set -u
bin=$1; shift
run() {
    local name=$1 shape=$2 bs=$3 samples=$4 epochs=$5
    local d; d=$(mktemp -d)
    printf '[dataset]\nsamples = %s\nsample_shape = %s\ndtype = "f32"\n[plan]\nbatch_size = %s\nepochs = %s\n' "$samples" "$shape" "$bs" "$epochs" > "$d/c.toml"
    local ring="big-$RANDOM"
    "$bin/pinring-daemon" --ring "$ring" --backend cuda --sink discard --config "$d/c.toml" --summary "$d/s.json" 2> "$d/d.log" &
    local dp=$!
    for i in 1 2 3 4 5 6 7 8; do "$bin/pinring-loader" --ring "$ring" --config "$d/c.toml" --wait-secs 60 2>/dev/null & done
    wait $dp
    wait
    python3 -c "import json,sys; s=json.load(open('$d/s.json')); print('$name', 'gbps %.2f' % s['gbps'], 'batches', s['batches_delivered'], 'parts', s['parts_per_batch'], 'slot', s.get('slot_bytes'), 'bound', s['bound'])"
    grep -m1 "resolved" "$d/d.log" | sed 's/.*INFO //'
}
for r in 1 2 3; do
    run "256MiB-batch(64x4MiB)" "[1024, 1024]" 64 2048 8
    run "64MiB-sample(batch1)" "[4096, 4096]" 1 64 16
    run "1GiB-sample(batch1)" "[16384, 16384]" 1 8 4
done
