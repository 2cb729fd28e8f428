#!/usr/bin/env bash
# Our fast CPU backend beside llama.cpp's llama-bench on the same GGUF, in one
# run, the two engines interleaved (ours, llama.cpp, ours, llama.cpp).
#
#   bash bench/llamacpp_compare.sh [MODEL.gguf] [--threads T] [--pp N] [--tg N] [--reps R]
#
# MODEL defaults to the 4-layer Flash-width q2 model of bench/cpu_forward.rs
# (target/bench-models/medium-q2-4l.gguf; run `cargo bench --bench
# cpu_forward` once to generate it). llama.cpp is built and driven by
# ../shared/peers/llamacpp.sh (build it first: `bash ../shared/peers/llamacpp.sh
# build`), which also makes the metadata-patched copy llama.cpp needs.
# Ours runs `cargo bench --bench cpu_forward` with DS4_BENCH_MODEL pointing at
# the same file, only the fast backend (DS4_BENCH_BACKENDS=cpu).
#
# One instruction set on both sides (the AVX2 figures of docs/PERFORMANCE.md
# on an AVX-512 host): DS4_CPU_ISA=avx2 for ours, and LLAMA_BENCH naming a
# llama-bench built without AVX-512, run directly (same flags as the peer
# script: -ctk f16 -ctv f16 -fa 0), e.g. in the peer's source tree:
#   cmake -S /tmp/llamacpp -B /tmp/llamacpp/build-avx2 -DCMAKE_BUILD_TYPE=Release \
#     -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
#     -DGGML_BMI2=ON -DGGML_AVX512=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
#   cmake --build /tmp/llamacpp/build-avx2 -j"$(nproc)" --target llama-bench
#   DS4_CPU_ISA=avx2 LLAMA_BENCH=/tmp/llamacpp/build-avx2/bin/llama-bench \
#     bash bench/llamacpp_compare.sh --pp 256
# (a separate build folder: the peer script's `build` rebuilds its own.)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=target/bench-models/medium-q2-4l.gguf
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then MODEL=$1; shift; fi
THREADS=$(nproc); PP=256; TG=16; REPS=2
while [ $# -gt 0 ]; do
    case $1 in
        --threads) THREADS=$2; shift 2 ;;
        --pp) PP=$2; shift 2 ;;
        --tg) TG=$2; shift 2 ;;
        --reps) REPS=$2; shift 2 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
PEER=${PEER:-../shared/peers/llamacpp.sh}
[ -f "$PEER" ] || PEER=/work/shared/peers/llamacpp.sh
[ -f "$MODEL" ] || { echo "no model at $MODEL (run cargo bench --bench cpu_forward first)" >&2; exit 1; }
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "model: $MODEL ($(du -h "$MODEL" | cut -f1)); threads $THREADS; prefill $PP tokens, decode $TG tokens"
cargo build --release --bench cpu_forward >/dev/null 2>&1 || cargo bench --no-run --bench cpu_forward
# llama.cpp reads a metadata-patched copy; use one made beside the model
# (MODEL with .llamacpp.gguf; make it once with `bash $PEER compat MODEL COPY`)
# when present, else the peer script makes its own under /tmp.
LLAMA_MODEL=${LLAMA_MODEL:-${MODEL%.gguf}.llamacpp.gguf}
[ -f "$LLAMA_MODEL" ] || LLAMA_MODEL=$MODEL
echo "llama.cpp model: $LLAMA_MODEL"
ROWS=()
for rep in $(seq 1 "$REPS"); do
    echo "--- round $rep: ds4 (fast cpu, ${DS4_CPU_ISA:-auto} kernels) ---"
    OURS=$(RAYON_NUM_THREADS=$THREADS DS4_BENCH_MODEL=$MODEL DS4_BENCH_BACKENDS=cpu \
        DS4_BENCH_PREFILL=$PP DS4_BENCH_DECODE=$TG cargo bench --bench cpu_forward 2>/dev/null \
        | grep -E '^(cpu |read bandwidth|bytes/token)' || true)
    echo "$OURS"
    echo "--- round $rep: llama.cpp (${LLAMA_BENCH:-peer script build}) ---"
    if [ -n "${LLAMA_BENCH:-}" ]; then
        THEIRS=$("$LLAMA_BENCH" -m "$LLAMA_MODEL" -t "$THREADS" -p "$PP" -n "$TG" -r 1 \
            -ctk f16 -ctv f16 -fa 0 -o md 2>/dev/null | grep -E '^\|' || echo "(llama-bench failed)")
    else
        THEIRS=$(bash "$PEER" bench "$LLAMA_MODEL" --threads "$THREADS" --pp "$PP" --tg "$TG" --reps 1 --md 2>/dev/null \
            | grep -E '^\|' || echo "(llama-bench failed; is llama.cpp built?)")
    fi
    echo "$THEIRS"
    our_pp=$(echo "$OURS" | sed -n 's/^cpu .*prefill [0-9]* tokens in [0-9.]* s = \([0-9.]*\) tokens\/s.*/\1/p')
    our_tg=$(echo "$OURS" | sed -n 's/^cpu .*decode [0-9]* tokens in [0-9.]* s = \([0-9.]*\) tokens\/s.*/\1/p')
    their_pp=$(echo "$THEIRS" | grep -E "\| *pp$PP *\|" | awk -F'|' '{print $(NF-1)}' | awk '{print $1}')
    their_tg=$(echo "$THEIRS" | grep -E "\| *tg$TG *\|" | awk -F'|' '{print $(NF-1)}' | awk '{print $1}')
    ROWS+=("$rep ${our_pp:-nan} ${their_pp:-nan} ${our_tg:-nan} ${their_tg:-nan} $(cut -d' ' -f1 /proc/loadavg)")
done
echo
echo "| round | load | ds4 prefill t/s | llama.cpp prefill t/s | ratio | ds4 decode t/s | llama.cpp decode t/s | ratio |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|"
for r in "${ROWS[@]}"; do
    echo "$r" | awk '{ rp = ($3 > 0) ? $2 / $3 : 0; rt = ($5 > 0) ? $4 / $5 : 0;
        printf "| %s | %s | %s | %s | %.2fx | %s | %s | %.2fx |\n", $1, $6, $2, $3, rp, $4, $5, rt }'
done
