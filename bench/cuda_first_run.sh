#!/usr/bin/env bash
# The first run of the CUDA backend on a machine with an NVIDIA GPU (issue 9).
# Nothing here has run on a GPU yet (docs/CUDA.md): this script checks the
# kernels against the CPU twins on the device, then measures, and prints the
# lines to paste into docs/PERFORMANCE.md ("CUDA" section).
#
#   bash bench/cuda_first_run.sh [MODEL.gguf]
#
# Needs: the NVIDIA driver, cargo, python3 (for NVRTC from PyPI when no CUDA
# toolkit is installed). MODEL (optional) is timed by --bw-decode; without
# it the 4-layer Flash-width bench model of bench/cpu_forward.rs is used
# (generated on the first run into target/bench-models/, 8.85 GiB).
# Output goes to target/cuda-first-run/ as well as the terminal.
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/cuda-first-run
mkdir -p "$out"
log="$out/log.txt"
: > "$log"
say() { echo "== $*" | tee -a "$log"; }

say "device"
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L | tee -a "$log"; then
    echo "no NVIDIA GPU visible (nvidia-smi); this script is for a GPU machine" >&2
    exit 1
fi
if ! python3 -c 'import nvidia.cuda_nvrtc' 2>/dev/null && ! ldconfig -p | grep -q libnvrtc; then
    say "NVRTC from PyPI (no toolkit found)"
    python3 -m pip install --quiet "nvidia-cuda-nvrtc==13.5.37" \
        || python3 -m pip install --quiet --break-system-packages "nvidia-cuda-nvrtc==13.5.37"
fi

say "build (--features cuda)"
cargo build --release --features cuda --bins 2>&1 | tail -3 | tee -a "$log"
./target/release/ds4 --list-devices | tee -a "$log"

say "correctness on the device: one-op suite, end-to-end logits, CLI"
set +e
cargo test --release --features cuda --test ops_backends --test cuda_e2e --test cuda_cli \
    -- --nocapture 2>&1 | tee "$out/tests.txt" | grep -E "^test |test result|cuda device|FAILED|panicked" | tee -a "$log"
tests=${PIPESTATUS[0]}
# The tensor-core prefill (off by default until this passes on a GPU).
say "tensor-core prefill (DS4_CUDA_MMA=1): end-to-end logits"
DS4_CUDA_MMA=1 cargo test --release --features cuda --test cuda_e2e -- --nocapture 2>&1 \
    | tee "$out/tests_mma.txt" | grep -E "^test |test result|FAILED|panicked" | tee -a "$log"
mma_tests=${PIPESTATUS[0]}
set -e
if [ "$tests" -ne 0 ]; then
    echo "the CUDA tests FAILED (full output: $out/tests.txt); figures below are not trustworthy" | tee -a "$log"
fi

model="${1:-}"
if [ -z "$model" ]; then
    model=target/bench-models/medium-q2-4l.gguf
    if [ ! -f "$model" ]; then
        say "generating the bench model (cargo bench --bench cpu_forward, CPU backend only)"
        DS4_BENCH_BACKENDS=cpu DS4_BENCH_PREFILL=16 DS4_BENCH_DECODE=2 \
            cargo bench --bench cpu_forward 2>&1 | tail -2 | tee -a "$log"
    fi
fi

say "bandwidth: device read/copy, matvec per weight type, fused gate+up, decode step (graph on/off)"
./target/release/ds4-bench --bandwidth --backend cuda --bw-decode -m "$model" \
    --csv "$out/bandwidth.csv" 2>&1 | tee "$out/bandwidth.txt" | tee -a "$log"

say "prefill and decode speed of the bench model: cuda beside cpu"
DS4_BENCH_MODEL="$model" DS4_BENCH_BACKENDS=cuda,cpu DS4_BENCH_PREFILL=512 DS4_BENCH_DECODE=64 \
    cargo bench --features cuda --bench cpu_forward 2>&1 | grep -E "^(model|read|bytes|cuda|cpu)" \
    | tee "$out/forward.txt" | tee -a "$log"

say "prefill with the tensor-core matmul (DS4_CUDA_MMA=1)"
DS4_CUDA_MMA=1 DS4_BENCH_MODEL="$model" DS4_BENCH_BACKENDS=cuda DS4_BENCH_PREFILL=512 DS4_BENCH_DECODE=16 \
    cargo bench --features cuda --bench cpu_forward 2>&1 | grep -E "^cuda" | sed 's/^cuda    /cuda+mma/' \
    | tee -a "$out/forward.txt" | tee -a "$log"

say "decode roofline as ds4 --info reports it"
./target/release/ds4 -m "$model" --info --backend cuda 2>&1 | sed -n '/== decode roofline ==/,$p' | tee -a "$log"

cat <<MSG

==== paste into docs/PERFORMANCE.md, section "CUDA" (replace "unmeasured") ====
date: $(date -u +%Y-%m-%d\ %H:%M\ UTC); commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)
device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)
tests: $( [ "$tests" -eq 0 ] && echo "ops_backends, cuda_e2e, cuda_cli passed on the device" || echo "FAILED (see $out/tests.txt)")
tensor-core prefill e2e (DS4_CUDA_MMA=1): $( [ "$mma_tests" -eq 0 ] && echo "passed (the switch may become the default)" || echo "FAILED (keep it off; $out/tests_mma.txt)")

\`\`\`
$(cat "$out/bandwidth.txt")
\`\`\`

\`\`\`
$(cat "$out/forward.txt")
\`\`\`
(full log: $log; CSV: $out/bandwidth.csv)
MSG
