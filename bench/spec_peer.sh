#!/usr/bin/env bash
# Prompt-lookup speculative decoding beside llama.cpp's, on the same GGUF,
# the same prompt and the same threads, interleaved (ours plain, ours lookup,
# llama.cpp plain, llama.cpp lookup; REPS rounds):
#
#   bash bench/spec_peer.sh [MODEL.gguf] [--threads T] [-n N] [--draft K] [--reps R] [--prompt-file F]
#
# Greedy decoding on both sides (llama.cpp's lookup example is greedy-only).
# ds4: `ds4 --cpu --temp 0 [--spec lookup --draft K]`, its own timing line.
# llama.cpp: `llama-completion` (plain) and `llama-lookup` (`--spec-draft-n-max K`),
# built by ../shared/peers/llamacpp.sh (`build`, then `cmake --build
# /tmp/llamacpp/build --target llama-lookup`), on the metadata-patched copy
# the peer script's `compat` step makes. The default prompt is a source file
# an agent would be asked to edit (src/speculate/lookup.rs, the first 2 KiB),
# so n-grams of the prompt are there to be found; what the model does with
# them depends on its weights (the bench models are random: their greedy
# output is whatever the weights make it, so this measures what lookup costs
# and gains on that output, not on a real model's).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=target/bench-models/medium-q2-4l.gguf
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then MODEL=$1; shift; fi
THREADS=$(nproc); N=64; DRAFT=5; REPS=2; PROMPT_FILE=""
while [ $# -gt 0 ]; do
    case $1 in
        --threads) THREADS=$2; shift 2 ;;
        -n) N=$2; shift 2 ;;
        --draft) DRAFT=$2; shift 2 ;;
        --reps) REPS=$2; shift 2 ;;
        --prompt-file) PROMPT_FILE=$2; shift 2 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
PEER=${PEER:-../shared/peers/llamacpp.sh}
[ -f "$PEER" ] || PEER=/work/shared/peers/llamacpp.sh
LLAMA_BIN=${LLAMA_BIN:-${LLAMACPP_DIR:-/tmp/llamacpp}/build/bin}
[ -f "$MODEL" ] || { echo "no model at $MODEL (ds4-bench --make-model flash:4 -m $MODEL)" >&2; exit 1; }
for b in llama-completion llama-lookup; do
    [ -x "$LLAMA_BIN/$b" ] || { echo "no $LLAMA_BIN/$b: build llama.cpp first (see the top of this script)" >&2; exit 1; }
done
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
if [ -z "$PROMPT_FILE" ]; then
    head -c 2048 src/speculate/lookup.rs > "$TMP/prompt.txt"
    PROMPT_FILE="$TMP/prompt.txt"
fi
LLAMA_MODEL=${LLAMA_MODEL:-${MODEL%.gguf}.llamacpp.gguf}
if [ ! -f "$LLAMA_MODEL" ]; then
    LLAMA_MODEL="$TMP/llamacpp.gguf"
    bash "$PEER" compat "$MODEL" "$LLAMA_MODEL" >/dev/null
fi
cargo build --release --bin ds4 >/dev/null 2>&1
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "model: $MODEL ($(du -h "$MODEL" | cut -f1)); threads $THREADS; $N tokens greedy; draft up to $DRAFT; prompt $(wc -c < "$PROMPT_FILE") bytes"

ours() { # extra flags...
    ./target/release/ds4 -m "$MODEL" --cpu -t "$THREADS" --temp 0 -n "$N" \
        --prompt-file "$PROMPT_FILE" "$@" 2>"$TMP/ds4.err" >"$TMP/ds4.out" || { cat "$TMP/ds4.err" >&2; return 1; }
    local tg; tg=$(sed -n 's/.*generation: \([0-9.]*\) t\/s.*/\1/p' "$TMP/ds4.err")
    local spec; spec=$(sed -n 's/.*speculation ([a-z]*): \(.*\)/\1/p' "$TMP/ds4.err")
    echo "${tg:-nan}|${spec:--}"
}
theirs_plain() {
    "$LLAMA_BIN/llama-completion" -m "$LLAMA_MODEL" -t "$THREADS" --temp 0 -n "$N" -f "$PROMPT_FILE" \
        -no-cnv --no-warmup -c 4096 >"$TMP/l.out" 2>"$TMP/l.err" </dev/null || { tail -5 "$TMP/l.err" >&2; echo "nan|-"; return 0; }
    local tg; tg=$(grep -E 'eval time' "$TMP/l.err" | grep -v prompt | sed -n 's/.*, *\([0-9.]*\) tokens per second.*/\1/p' | tail -1)
    echo "${tg:-nan}|-"
}
theirs_lookup() {
    "$LLAMA_BIN/llama-lookup" -m "$LLAMA_MODEL" -t "$THREADS" --temp 0 -n "$N" -f "$PROMPT_FILE" \
        --spec-draft-n-max "$DRAFT" -c 4096 >"$TMP/l.out" 2>"$TMP/l.err" </dev/null || { tail -5 "$TMP/l.err" >&2; echo "nan|-"; return 0; }
    local tg; tg=$(sed -n 's/.*decoded *[0-9]* tokens in *[0-9.]* seconds, speed: *\([0-9.]*\) t\/s.*/\1/p' "$TMP/l.err" | tail -1)
    local drafted accepted
    drafted=$(sed -n 's/.*n_drafted *= *\([0-9]*\).*/\1/p' "$TMP/l.err" | tail -1)
    accepted=$(sed -n 's/.*n_accept *= *\([0-9]*\).*/\1/p' "$TMP/l.err" | tail -1)
    echo "${tg:-nan}|${drafted:-?} drafted, ${accepted:-?} accepted"
}

ROWS=()
for rep in $(seq 1 "$REPS"); do
    a=$(ours); b=$(ours --spec lookup --draft "$DRAFT")
    c=$(theirs_plain); d=$(theirs_lookup)
    ROWS+=("$rep|$(cut -d' ' -f1 /proc/loadavg)|$a|$b|$c|$d")
    echo "round $rep: ds4 $a / lookup $b; llama.cpp $c / lookup $d"
done
echo
echo "| round | load | ds4 plain t/s | ds4 lookup t/s | ratio | ds4 lookup drafts | llama.cpp plain t/s | llama.cpp lookup t/s | ratio | llama.cpp lookup drafts |"
echo "|---:|---:|---:|---:|---:|---|---:|---:|---:|---|"
for r in "${ROWS[@]}"; do
    IFS='|' read -r rep load a _ b bspec c _ d dspec <<<"$r"
    ra=$(awk -v x="$b" -v y="$a" 'BEGIN{ if (y+0>0) printf "%.2f", x/y; else print "nan" }')
    rb=$(awk -v x="$d" -v y="$c" 'BEGIN{ if (y+0>0) printf "%.2f", x/y; else print "nan" }')
    echo "| $rep | $load | $a | $b | $ra | $bspec | $c | $d | $rb | $dspec |"
done
