#!/usr/bin/env bash
# Conversion throughput of `ds4-quantize --hf` beside the disk's read speed (issue 37;
# docs/TOOLS.md "Speed and memory").
#
#   bash bench/convert_speed.sh [WORKDIR] [LAYERS] [RECIPES]
#        # defaults: /tmp/ds4-convert-speed, 2 layers, "mxfp4 q8"
#
# 1. writes a Flash-width checkpoint of LAYERS layers in the official format
#    (bench/support/flash_checkpoint.py: 256 FP4 experts of 2048 per layer, FP8 attention,
#    BF16 embedding and head; about 3.4 GB a layer plus 2 GB), once;
# 2. reads one shard cold (`dd` after dropping the page cache; needs root, else the figure
#    is marked warm) for the disk's read speed;
# 3. converts it with each recipe twice: cold (page cache dropped, where allowed) and warm,
#    under /usr/bin/time (wall, CPU, peak RSS); prints GB/s of checkpoint read.
#
# Speed lives here, never in the tests. Run it on an idle machine.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
W="${1:-/tmp/ds4-convert-speed}"
LAYERS="${2:-2}"
RECIPES="${3:-mxfp4 q8}"
CK="$W/flash-$LAYERS"
mkdir -p "$W"

cargo build --release --locked --bin ds4-quantize --manifest-path "$ROOT/Cargo.toml" >&2
Q="$ROOT/target/release/ds4-quantize"
[ -f "$CK/config.json" ] || python3 "$ROOT/bench/support/flash_checkpoint.py" --out "$CK" --layers "$LAYERS"
BYTES=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['metadata']['total_size'])" \
    "$CK/model.safetensors.index.json")

drop() {
    sync
    if [ -w /proc/sys/vm/drop_caches ]; then echo 3 > /proc/sys/vm/drop_caches; echo cold; else echo warm; fi
}

echo "host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) threads, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "checkpoint: $CK, $((BYTES / 1000000)) MB of tensors"
SHARD=$(ls "$CK"/*.safetensors | tail -1)
state=$(drop)
echo "disk read ($state, dd of $(basename "$SHARD")): $(dd if="$SHARD" of=/dev/null bs=16M 2>&1 | tail -1 | awk -F, '{print $NF}')"
for r in $RECIPES; do
    for pass in cold warm; do
        if [ "$pass" = cold ]; then state=$(drop); else cat "$CK"/*.safetensors > /dev/null; state=warm; fi
        rm -f "$W/out.gguf"
        /usr/bin/time -o "$W/time.txt" -f "%e %U %S %M" "$Q" --hf "$CK" --recipe "$r" -o "$W/out.gguf" >/dev/null 2>&1
        read -r wall user sys rss < "$W/time.txt"
        out=$(stat -c %s "$W/out.gguf")
        awk -v r="$r" -v s="$state" -v w="$wall" -v u="$user" -v y="$sys" -v m="$rss" -v b="$BYTES" -v o="$out" \
            'BEGIN { printf "%-6s %-4s wall %6.1f s  %5.2f GB/s read  %5.2f GB/s written  cpu %5.1f+%4.1f s  peak RSS %5.0f MB\n", r, s, w, b / w / 1e9, o / w / 1e9, u, y, m / 1024 }'
    done
done
rm -f "$W/out.gguf"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
